"""Where training memory goes: parameters, gradients, optimizer state, activations.

Two views of the same step, side by side:

* ``estimate``: computed from the model alone (sizes of weights, and of every layer's
  output for one batch, found with forward hooks);
* ``measure``: what the step really held: the tensors in the model and the optimizer, the
  tensors autograd saved for the backward pass (counted as they are saved, each storage
  once), and on a GPU the allocator's peak.

On a CPU there is no allocator peak to read honestly, so activations are measured as
autograd's saved tensors: that is the memory a forward pass keeps alive for the backward.
"""
from __future__ import annotations

import torch
from torch import nn

from .training import tensor_bytes as _bytes


def estimate(model: nn.Module, x: torch.Tensor, optimizer_slots: int = 2) -> dict:
    """Memory computed from the model: activations = every leaf module's output size.

    optimizer_slots: tensors the optimizer keeps per parameter (Adam: 2, SGD with
    momentum: 1, plain SGD: 0).
    """
    params = _bytes(model.parameters())
    outputs = []

    def hook(_module, _inputs, output):
        if isinstance(output, torch.Tensor):
            outputs.append(output.numel() * output.element_size())

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return {"parameters": params, "gradients": params,
            "optimizer state": optimizer_slots * params, "activations": sum(outputs)}


class saved_tensor_counter:
    """Count the bytes autograd saves for the backward pass inside a ``with`` block.

    Each storage counts once (a ReLU output saved by the ReLU and by the next Linear is
    one tensor), and the parameters' own storages are left out: autograd saves views of
    the weights, which are counted as parameters already.
    """

    def __init__(self, *modules: nn.Module):
        self._skip = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
        self._seen: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in self._skip:
            self._seen[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)


def measure(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn, x, y) -> dict:
    """Run one training step and measure what it held (see the module's docstring)."""
    saved = saved_tensor_counter(model)

    on_gpu = x.is_cuda
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    optimizer.zero_grad(set_to_none=True)
    with saved:
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    state = [v for s in optimizer.state.values() for v in s.values()
             if isinstance(v, torch.Tensor) and v.numel() > 1]
    out = {"parameters": _bytes(model.parameters()),
           "gradients": _bytes(p.grad for p in model.parameters() if p.grad is not None),
           "optimizer state": _bytes(state),
           "activations": saved.bytes}
    if on_gpu:
        torch.cuda.synchronize()
        out["GPU allocator peak above the step's start"] = torch.cuda.max_memory_allocated() - base
    return out


# ------------------------------------------------------------------ lab 08: spend less memory
def _quickest_seconds(fns, repeats: int) -> list[float]:
    """The quickest of ``repeats`` runs of each of ``fns``, on one thread, after a warm-up.

    The functions take turns (one run of each per round), so a burst of other work on a
    shared machine slows all of them alike; the quickest run is the least disturbed.
    """
    import time
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times = [[] for _ in fns]
    try:
        for rnd in range(repeats + 1):
            for fn, t in zip(fns, times):
                t0 = time.perf_counter()
                fn()
                if rnd:                              # round 0 warms up
                    t.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return [min(t) for t in times]


def checkpointed(model: nn.Sequential, segments: int):
    """``model`` as a function that keeps only the input of each of ``segments`` chunks.

    Every chunk runs under ``torch.utils.checkpoint``: its forward pass saves nothing for
    the backward pass but its input; the backward pass runs the chunk's forward again
    (recomputation) to get the rest (Chen et al., 2016, "Training Deep Nets with
    Sublinear Memory Cost").
    """
    from torch.utils.checkpoint import checkpoint
    if not 1 <= segments <= len(model):
        raise ValueError(f"segments must be between 1 and the {len(model)} layers, got {segments}")
    bounds = [round(i * len(model) / segments) for i in range(segments + 1)]
    chunks = [model[a:b] for a, b in zip(bounds, bounds[1:])]

    def run(x):
        for chunk in chunks:
            x = checkpoint(chunk, x, use_reentrant=False)
        return x
    return run, chunks


def checkpointing(depth: int = 16, width: int = 256, batch: int = 128,
                  segments=(2, 4, 8, 16), repeats: int = 7, seed: int = 0) -> list[dict]:
    """Activation memory against time, plain and checkpointed, on a deep MLP.

    For each setting (None: no checkpointing, else the number of segments): ``kept``, the
    bytes autograd keeps after the forward pass (``saved_tensor_counter``, measured);
    ``recomputed``, the bytes the largest segment saves again when the backward pass
    recomputes it (measured on that segment), so that kept + recomputed is the most held
    at once; ``step_s``, the quickest time of a forward and backward pass (and
    ``forward_s``, of a forward pass alone, without autograd); and
    ``max_grad_diff``, the largest difference of any gradient from the plain model's.
    """
    from . import training
    model = training.build_model("mlp", sizes=(64, *[width] * depth, 10), seed=seed)
    x, y = (torch.as_tensor(a) for a in next(training.digit_batches("mlp", batch)))
    loss_fn = nn.CrossEntropyLoss()
    rows, plain_grads, steps = [], None, []
    for k in (None, *segments):
        run, chunks = (model, [model]) if k is None else checkpointed(model, k)

        def step(run=run):
            model.zero_grad(set_to_none=True)
            loss_fn(run(x), y).backward()
        steps.append(step)

        saved = saved_tensor_counter(model)
        model.zero_grad(set_to_none=True)
        with saved:
            loss = loss_fn(run(x), y)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        plain_grads = plain_grads or grads
        recomputed = 0
        if k is not None:                 # what the largest chunk saves while it is redone
            a = x
            for chunk in chunks:
                inner = saved_tensor_counter(model)
                with inner:
                    a2 = chunk(a.detach().requires_grad_(a is not x))
                recomputed = max(recomputed, inner.bytes)
                a = a2.detach()
        rows.append({"segments": k, "kept": saved.bytes, "recomputed": recomputed,
                     "max_grad_diff": max(float((g - p).abs().max())
                                          for g, p in zip(grads, plain_grads))})
    def forward_only():
        with torch.no_grad():
            model(x)
    *seconds, forward_s = _quickest_seconds([*steps, forward_only], repeats)
    for row, t in zip(rows, seconds):
        row["step_s"], row["forward_s"] = t, forward_s
    return rows


def mixed_precision(sizes=(64, 256, 256, 10), batch: int = 1024, steps: int = 40,
                    lr: float = 1e-3, seed: int = 0, dtype=torch.bfloat16) -> dict:
    """The same training in float32 and with ``torch.autocast`` to ``dtype`` (float32
    master weights: the parameters, their gradients and Adam's state stay float32).

    Returns per precision: the losses, the test accuracy after ``steps`` steps, the bytes
    saved for the backward pass in one step (``saved_tensor_counter``: activations, and
    under autocast the low-precision copies of the weights), the parameters' bytes and
    dtype, and the quickest step time. bfloat16 keeps float32's exponent range, so it needs
    no loss scaling (float16 would: ``torch.amp.GradScaler``).
    """
    from .. import data as datasets
    from . import training
    device = "cpu"
    x_test, y_test = datasets.digits("test")
    out = {}
    for name in ("float32", str(dtype).replace("torch.", "")):
        model = training.build_model("mlp", sizes=sizes, seed=seed)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        batches = training.digit_batches("mlp", batch)
        low = name != "float32"
        losses, saved_bytes = [], 0

        def step(xb, yb, count=False):
            opt.zero_grad(set_to_none=True)
            saved = saved_tensor_counter(model)
            with saved if count else _nothing(), torch.autocast(device, dtype=dtype, enabled=low):
                loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            return loss.item(), saved.bytes

        for i in range(steps):
            xb, yb = (torch.as_tensor(a) for a in next(batches))
            loss, b = step(xb, yb, count=i == 0)
            saved_bytes = saved_bytes or b
            losses.append(loss)
        xb, yb = (torch.as_tensor(a) for a in next(batches))
        with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=low):
            pred = model(torch.as_tensor(x_test)).argmax(1).numpy()
        out[name] = {"losses": losses, "test_accuracy": float((pred == y_test).mean()),
                     "saved_for_backward": saved_bytes,
                     "parameters": sum(p.numel() * p.element_size() for p in model.parameters()),
                     "parameter_dtype": str(next(model.parameters()).dtype),
                     "step_s": _quickest_seconds([lambda: step(xb, yb)], 5)[0]}
    return out


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
