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


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


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
