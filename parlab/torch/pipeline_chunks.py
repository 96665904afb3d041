"""Pipelines past 1F1B on the ranks: several chunks per device, and a backward split in two.

A device holds ``chunks`` pieces of the layer stack (virtual stages, ``parlab.pipeline``)
and runs its list of ("F" | "B" | "W", micro-batch, chunk). What crosses from one virtual
stage to the next travels with a traced send when the next lives on another device, and
is handed over in memory when it lives on the same one (the turn of DualPipeV's V).

The split backward (Qi et al., 2024, section 2): for a linear layer y = x Wᵀ + b,
B computes dx = dy W, layer by layer down the chunk, and keeps each layer's dy; W later
computes dW = dyᵀ x and db = Σ dy from what F and B kept. B is what the previous stage
waits for; W waits for nobody, so a schedule can put it where the device would idle.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from .. import pipeline as schedules
from ..split import SplitConfig, balance
from ..trace import span
from . import comm, memory, runtime, split, training
from .groups import as_group


def prepare(cfg: SplitConfig, devices: int, micro_batches: int, schedule: str = "interleaved",
            chunks: int = 2):
    """Check everything before any rank starts; return the config (cut into
    devices x chunks virtual stages of about equal parameters) and the schedule."""
    if cfg.model != "mlp":
        raise ValueError(f"the split backward (W) covers linear layers: use model='mlp', "
                         f"got {cfg.model!r}")
    if cfg.batch_size % micro_batches:
        raise ValueError(f"a batch of {cfg.batch_size} does not divide into {micro_batches} "
                         f"micro-batches: change batch_size or micro_batches")
    ops = schedules.make(schedule, devices, micro_batches, chunks) if isinstance(schedule, str) \
        else schedule
    schedules.check(ops, devices, micro_batches)
    n_chunks = schedules.layout(ops)[0]
    model = split.build(cfg)
    linears = [i for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    if devices * n_chunks > len(linears):
        raise ValueError(f"{devices} devices x {n_chunks} chunks = {devices * n_chunks} virtual "
                         f"stages for a model of {len(linears)} linear layers: give `sizes` "
                         f"more layers or use fewer devices")
    parts = devices * n_chunks
    bounds = balance(split.param_costs(model), parts) if parts > 1 else []
    return replace(cfg, bounds=bounds), ops


def _chunks_of(model: nn.Sequential, cfg: SplitConfig, device: int, devices: int, ops) -> dict:
    """{chunk: (virtual stage, its layers)} held by ``device``."""
    chunks, placement = schedules.layout(ops)
    edges = [0, *cfg.bounds, len(model)]
    if len(edges) - 1 != devices * chunks:
        raise ValueError(f"the config cuts the model into {len(edges) - 1} pieces; the group "
                         f"has {devices} ranks of {chunks} chunks: prepare it for this group")
    out = {}
    for c in range(chunks):
        k = schedules.virtual_stage(device, c, devices, placement)
        out[c] = (k, model[edges[k]:edges[k + 1]])
    return out


class _Kept:
    """What F and B keep of one (micro-batch, chunk) for a later W: every linear layer's
    input and the gradient of its output."""

    def __init__(self, part: nn.Sequential):
        self.inputs, self.outputs, self.grads = [], [], []
        self.linears = [m for m in part if isinstance(m, nn.Linear)]
        self._hooks = [m.register_forward_hook(self._keep) for m in self.linears]

    def _keep(self, _module, args, output):
        self.inputs.append(args[0].detach())
        self.outputs.append(output)

    def done_forward(self):
        for h in self._hooks:
            h.remove()


def train_chunked(rank: int, world_size: int, cfg: SplitConfig, micro_batches: int, ops, *,
                  group=None) -> dict:
    """Rank function: this device's chunks run its list of F, B, W for every step.

    Returns the last stage's loss per step (on the device holding it), the first step's
    gradients and the final weights of this device's layers (named as in the whole
    model), and the peak activations held: micro-batch chunks and bytes.
    """
    g = as_group(group)
    device = runtime.rank_device()
    model = split.build(cfg).to(device)
    held = _chunks_of(model, cfg, g.index, g.size, ops)
    chunks, placement = schedules.layout(ops)
    last = g.size * chunks - 1
    params = [p for _, part in held.values() for p in part.parameters()]
    opt = training.make_optimizer(cfg.optimizer, params, cfg.lr)
    loss_fn = nn.CrossEntropyLoss()
    mine = [schedules.op_parts(op) for op in ops[g.index]]
    split_ops = {(i, c) for kind, i, c in mine if kind == "W"}
    shapes = training.boundary_shapes(model, (cfg.batch_size // micro_batches,
                                              *split.input_shape(cfg)[1:]))
    edges = [0, *cfg.bounds, len(model)]
    batches = training.digit_batches(cfg.model, cfg.batch_size)
    out = {"losses": [], "peak_micro_batches": 0, "peak_activation_bytes": 0}

    def where(k):
        return schedules.device_of(k, g.size, placement)[0]

    def tag(k, i, backward):     # one conversation per (stage, micro-batch, direction)
        return (k * micro_batches + i) * 2 + int(backward)

    for step in range(cfg.steps):
        xb, yb = next(batches)
        x, y = training.on_device(xb, yb, device)
        xs, ys = x.chunk(micro_batches), y.chunk(micro_batches)
        local: dict = {}               # hand-overs between this device's own chunks
        state: dict = {}               # (i, c) -> inputs, outputs, kept, saved bytes
        sends, live, live_bytes, step_loss = [], 0, 0, 0.0
        opt.zero_grad()
        for kind, i, c in mine:
            k, part = held[c]
            name = schedules.pass_name(kind, i, c, chunks)
            if kind == "F":
                if k == 0:
                    x_in = xs[i]
                elif where(k - 1) == g.index:
                    x_in = local.pop(("F", k, i)).detach().requires_grad_(True)
                else:
                    x_in = comm.recv(torch.empty(shapes[edges[k]], device=device),
                                     src=g.global_rank(where(k - 1)), group=g, tag=tag(k, i, False),
                                     name="recv").requires_grad_(True)
                kept = _Kept(part) if (i, c) in split_ops else None
                counter = memory.saved_tensor_counter(part)
                with span(name), counter:
                    y_out = part(x_in)
                    if k == last:
                        y_out = loss_fn(y_out, ys[i]) / micro_batches
                if kept:
                    kept.done_forward()
                if k < last:
                    if where(k + 1) == g.index:
                        local[("F", k + 1, i)] = y_out
                    else:
                        sends.append(_isend(y_out, g.global_rank(where(k + 1)), g, tag(k + 1, i, False),
                                            "isend"))
                state[(i, c)] = [x_in, y_out, kept, counter.bytes]
                live += 1
                live_bytes += counter.bytes
                out["peak_micro_batches"] = max(out["peak_micro_batches"], live)
                out["peak_activation_bytes"] = max(out["peak_activation_bytes"], live_bytes)
            elif kind == "B":
                x_in, y_out, kept, nbytes = state[(i, c)]
                if k == last:
                    grad = None
                elif where(k + 1) == g.index:
                    grad = local.pop(("B", k, i))
                else:
                    grad = comm.recv(torch.empty(y_out.shape, device=device),
                                     src=g.global_rank(where(k + 1)), group=g, tag=tag(k, i, True),
                                     name="recv grad")
                with span(name):
                    dx = _backward(x_in, y_out, grad, kept, needs_input=k > 0)
                if k == last:
                    step_loss += y_out.item()
                if k > 0:
                    if where(k - 1) == g.index:
                        local[("B", k - 1, i)] = dx
                    else:
                        sends.append(_isend(dx, g.global_rank(where(k - 1)), g, tag(k - 1, i, True),
                                            "isend grad"))
                if kept is None:
                    del state[(i, c)]
                    live -= 1
                    live_bytes -= nbytes
                else:
                    state[(i, c)][1] = None        # W needs what was kept, not the graph
            else:
                kept, nbytes = state.pop((i, c))[2:]
                with span(name):
                    _weight_gradients(kept)
                live -= 1
                live_bytes -= nbytes
        out["sends_per_step"] = len(sends)
        comm.wait_all([work for work, _ in sends])
        with span("update"):
            opt.step()
        if step == 0:
            out["first_grads"] = {n: v for _, part in held.values()
                                  for n, v in training.grads_numpy(part).items()}
        if held and any(k == last for k, _ in held.values()):
            out["losses"].append(step_loss)
    out["state"] = {n: v for _, part in held.values() for n, v in training.state_numpy(part).items()}
    out["virtual_stages"] = sorted(k for k, _ in held.values())
    return out


def _isend(t, dst, g, tag, name):
    buffer = t.detach().contiguous()
    return comm.isend(buffer, dst, group=g, tag=tag, name=name), buffer


def _backward(x_in, y_out, grad, kept: _Kept | None, needs_input: bool):
    """B: the input's gradient (returned, None on the first stage). A full backward
    also accumulates the weights' gradients; a split one computes only the gradients
    of each linear layer's output, kept for W (autograd skips the weight products:
    they are not asked for)."""
    if kept is None:
        torch.autograd.backward(y_out, grad)
        return x_in.grad if needs_input else None
    wanted = ([x_in] if needs_input else []) + kept.outputs
    grads = torch.autograd.grad(y_out, wanted, grad)
    kept.grads = list(grads[1:] if needs_input else grads)
    kept.outputs = []
    return grads[0] if needs_input else None


@torch.no_grad()
def _weight_gradients(kept: _Kept) -> None:
    """W: dW = dyᵀ x and db = Σ dy for every linear layer, from what F and B kept."""
    for layer, x, dy in zip(kept.linears, kept.inputs, kept.grads):
        dy, x = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        _accumulate(layer.weight, dy.T, x)
        if layer.bias is not None:
            if layer.bias.grad is None:
                layer.bias.grad = dy.sum(0)
            else:
                layer.bias.grad += dy.sum(0)


def _accumulate(weight, a, b) -> None:
    """weight.grad += a @ b, in place once it exists (as autograd accumulates)."""
    if weight.grad is None:
        weight.grad = a @ b
    else:
        weight.grad.addmm_(a, b)


# ------------------------------------------------------------------ the library way
LIBRARY = {"interleaved": "ScheduleInterleaved1F1B", "zb-h1": "ScheduleInterleavedZeroBubble",
           "dualpipev": "ScheduleDualPipeV"}


def library_step(rank: int, world_size: int, cfg: SplitConfig, micro_batches: int,
                 schedule: str, ops, *, group=None) -> dict:
    """Rank function: one step of ``torch.distributed.pipelining``'s own schedule on the
    same chunks (``cfg`` and ``ops`` from ``prepare``); its gradients, by name."""
    from torch.distributed import pipelining
    from torch.distributed.pipelining import PipelineStage

    g, device = as_group(group), runtime.library_device()
    model = split.build(cfg).to(device)
    held = _chunks_of(model, cfg, g.index, g.size, ops)
    chunks, placement = schedules.layout(ops)
    n_stages = g.size * chunks
    edges = [0, *cfg.bounds, len(model)]
    x, y = training.on_device(*next(training.digit_batches(cfg.model, cfg.batch_size)), device)
    stages = []
    for c in sorted(held, key=lambda c: held[c][0]):
        k, part = held[c]
        with torch.no_grad():
            example = x[: cfg.batch_size // micro_batches]
            for m in model[:edges[k]]:
                example = m(example)
        stages.append(PipelineStage(part, k, n_stages, device, input_args=(example,),
                                    group=g.pg))
    kind = getattr(pipelining, LIBRARY[schedule])
    sched = kind(stages, micro_batches, loss_fn=nn.CrossEntropyLoss())   # scales grads by 1/m
    has_first = any(k == 0 for k, _ in held.values())
    has_last = any(k == n_stages - 1 for k, _ in held.values())
    with span(f"library {schedule} step"):
        sched.step(*((x,) if has_first else ()), **({"target": y} if has_last else {}))
    grads = {n: v for _, part in held.values() for n, v in training.grads_numpy(part).items()}
    del sched, stages, model
    return {"grads": grads}


# ------------------------------------------------------------------ reading the trace
def pass_spans(timeline, ranks) -> dict[int, list]:
    """Each device's F, B and W spans, in order."""
    return {r: [s for s in timeline if s.rank == r and schedules.pass_kind(s.name)]
            for r in ranks}


def steps_of(timeline, ops, ranks) -> list[dict]:
    """Each step's passes: {rank: its spans}, the k-th step being the k-th len(ops[d])
    passes of device d (a device may still run its last W's while another starts the
    next step: time alone does not cut steps)."""
    per = pass_spans(timeline, ranks)
    n = min(len(per[r]) // len(ops[d]) for d, r in enumerate(ranks))
    return [{r: per[r][k * len(ops[d]):(k + 1) * len(ops[d])] for d, r in enumerate(ranks)}
            for k in range(n)]


def span_of(step: dict) -> tuple[float, float]:
    """(start, end) of one step's passes ({rank: spans}), over every device."""
    spans = [s for passes in step.values() for s in passes]
    return min(s.start for s in spans), max(s.end for s in spans)


def bubble_by_step(timeline, ops, ranks) -> list[float]:
    """Idle share of each step's pass part, over the devices: 1 - busy / (devices x
    the span from the step's first pass to its last); communication and waiting count
    as idle, as in the formulas."""
    out = []
    for step in steps_of(timeline, ops, ranks):
        t0, t1 = span_of(step)
        busy = sum(s.duration for passes in step.values() for s in passes)
        out.append(1 - busy / (len(ranks) * (t1 - t0)))
    return out


def train_each(rank: int, world_size: int, plans: dict, micro_batches: int, *,
               library=(), group=None) -> dict:
    """Rank function: every schedule of ``plans`` ({name: (cfg, ops)} from ``prepare``)
    trained in turn from the same weights, each inside a span "schedule NAME" and after
    a barrier, so no two overlap; then one step of the library's own schedule for each
    name in ``library``. Returns {name: ``train_chunked``'s result, "library NAME": its
    gradients}."""
    g = as_group(group)
    out = {}
    for name, (cfg, ops) in plans.items():
        comm.barrier(group=g)
        with span(f"schedule {name}"):
            out[name] = train_chunked(rank, world_size, cfg, micro_batches, ops, group=g)
    for name in library:
        cfg, ops = plans[name]
        comm.barrier(group=g)
        out[f"library {name}"] = library_step(rank, world_size, cfg, micro_batches, name, ops,
                                              group=g)
    return out
