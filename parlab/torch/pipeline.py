"""Lab 04: pipelines. An LSTM stack's wavefront, then micro-batch schedules by hand.

Each stage lives on its own rank. Activations travel forward and gradients backward with
traced send/recv; sends are non-blocking (``comm.isend``), so a stage never stalls
waiting for a neighbour to receive while that neighbour waits to send to it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from .. import data as datasets
from .. import pipeline as schedules
from ..split import SplitConfig, balance
from ..steps import shares_by_kind
from ..trace import span
from . import comm, memory, runtime, split, training
from .groups import as_group

# ------------------------------------------------------------------ configuration


def stage_bounds(cfg: SplitConfig, stages: int) -> list[int]:
    """Cut the model into stages of (about) equal parameter count, i.e. equal work for
    an MLP of equal widths."""
    return balance(split.param_costs(split.build(cfg)), stages) if stages > 1 else []


def prepare(cfg: SplitConfig, stages: int, micro_batches: int, schedule="1f1b"):
    """Check everything before any rank starts; return the config and the schedule.

    ``schedule`` is a name ("gpipe", "1f1b") or explicit per-stage lists of ("F"|"B", i).
    """
    if cfg.batch_size % micro_batches:
        divisors = [d for d in range(1, cfg.batch_size + 1) if cfg.batch_size % d == 0]
        raise ValueError(f"a batch of {cfg.batch_size} does not divide into {micro_batches} "
                         f"micro-batches: use one of {divisors}, or change batch_size")
    ops = schedules.make(schedule, stages, micro_batches) if isinstance(schedule, str) else schedule
    schedules.check(ops, stages, micro_batches)
    n_layers = len(split.build(cfg))
    if stages > n_layers:
        raise ValueError(f"{stages} stages for a model of {n_layers} layers: use at most {n_layers}")
    return replace(cfg, bounds=stage_bounds(cfg, stages)), [[tuple(op) for op in s] for s in ops]


def prepare_in_turn(cfg: SplitConfig, stages: int, micro_batches, schedule="1f1b"):
    """``prepare`` for ``train_pipeline_in_turn``: the config and its plan, one (m, schedule)
    per micro-batch count, each checked as ``prepare`` checks it."""
    if not micro_batches:
        raise ValueError("give at least one micro-batch count, e.g. (1, 2, 4, 8)")
    if cfg.optimizer != "sgd":
        raise ValueError(f"steps taken in turn need an optimizer without state between "
                         f"steps: set optimizer='sgd' (got {cfg.optimizer!r})")
    plan = []
    for m in micro_batches:
        cfg_m, ops = prepare(cfg, stages, m, schedule)
        plan.append((m, ops))
    return cfg_m, plan


# ------------------------------------------------------------------ the executor
def train_pipeline(rank: int, world_size: int, cfg: SplitConfig, micro_batches: int, ops,
                   *, group=None, batches=None, before_update=None) -> dict:
    """Rank function: one stage of the course's layer stack runs its list of F/B
    operations for every step (``run_stage``).

    Stage i is the group's i-th rank (default group: all ranks), holding modules
    ``cfg.bounds`` cut out of the model; one activation crosses each cut.

    Hooks for a pipeline that is one replica of a hybrid (lab 07, ``parlab.torch.hybrid``):
    batches: the (x, y) numpy batches this pipeline trains on, of ``cfg.batch_size`` rows
        (default: the course's digits); a replica passes its rows of each global batch.
    before_update: called as ``before_update(stage_module)`` after the step's schedule,
        before the optimizer step; a replica averages its gradients over data parallel.
    """
    g = as_group(group)
    stage = _stages(cfg, g, [micro_batches])[micro_batches]
    if batches is None:
        batches = training.digit_batches(cfg.model, cfg.batch_size)
    return run_stage(stage, micro_batches, ops, batches, steps=cfg.steps,
                     optimizer=cfg.optimizer, lr=cfg.lr, group=g, before_update=before_update)


def train_pipeline_in_turn(rank: int, world_size: int, cfg: SplitConfig, plan, *,
                           group=None) -> dict:
    """Rank function: the steps of several micro-batch counts taken in turn, ``plan``
    ([(m, schedule), ...], from ``prepare_in_turn``) played ``cfg.steps`` times over:
    m = 1, 2, 4, 8, then 1, 2, 4, 8 again, and so on, one launch for all of them.

    Why in turn: measured one launch per m beside other programs, a busy second of the
    machine fell on one m and not the next, and which m was quickest changed with it
    (lab 04's micro-batch lesson shown 6-7 runs in 10 there); in turn, every m meets the
    same moments. The stage trains throughout: plain SGD keeps nothing between steps,
    so a step with a new m goes on from the last step's weights exactly.
    Returns {"order": the m of every step, "losses": the last stage's loss per step,
    "state": the stage's weights at the end}.
    """
    g = as_group(group)
    stages = _stages(cfg, g, [m for m, _ in plan])
    batches = training.digit_batches(cfg.model, cfg.batch_size)
    out = {"order": [], "losses": []}
    for _ in range(cfg.steps):
        for m, ops in plan:
            one = run_stage(stages[m], m, ops, batches, steps=1, optimizer=cfg.optimizer,
                            lr=cfg.lr, group=g)
            out["order"].append(m)
            out["losses"] += one["losses"]
    out["state"] = one["state"]
    return out


def _stages(cfg: SplitConfig, g, micro_batches) -> dict:
    """{m: this rank's ``Stage`` for micro-batches of batch / m rows}, all on one module:
    its layers of ``cfg.bounds``, receiving what crosses the cut before it."""
    model = split.build(cfg)
    edges = [0, *cfg.bounds, len(model)]
    if len(edges) - 1 != g.size:
        raise ValueError(f"the config cuts the model into {len(edges) - 1} stages but the "
                         f"group has {g.size} ranks: prepare it with stages={g.size}")
    shape = split.input_shape(cfg)
    part = model[edges[g.index]:edges[g.index + 1]]
    out = {}
    for m in micro_batches:
        shapes = training.boundary_shapes(model, (shape[0] // m, *shape[1:]))
        out[m] = Stage(part, receives=() if g.first else (("", shapes[edges[g.index]]),))
    return out


@dataclass
class Stage:
    """What one pipeline stage computes, as ``run_stage`` sees it.

    module: the stage's layers: ``module(*inputs)`` gives its outputs (one tensor, or a
        tuple: what it sends on; on the last stage, the logits).
    receives: (name, shape of one micro-batch) of each tensor the stage receives from
        the previous one, in the order the previous stage sends them; () on the first
        stage, which reads the batch. A name ("" for a lone activation) goes into the
        traced spans' names: a U-Net's cut carries its skip connections too.
    sends: the names of its outputs, in order (a U-Net stage's), or () for one.
    """

    module: nn.Module
    receives: tuple = ()
    sends: tuple = ()           # names of the tensors it sends on (default: one, unnamed)

    def names(self) -> list[str]:
        return [name for name, _ in self.receives]

    def sent_names(self, outputs) -> list[str]:
        return list(self.sends) or [""] * len(outputs)


def _message(op: str, name: str) -> str:
    return f"{op} {name}" if name else op


def _send_each(tensors, names, dst: int, g, what: str) -> list:
    """Start sending each tensor (tag k for the k-th) to ``dst``, traced under its name
    ("isend e1", "isend grad e1"); returns (work, buffer) pairs: a buffer must stay
    alive until its send is waited for (a tensor not laid out contiguously, as a
    convolution's output can be, travels as a contiguous copy)."""
    out = []
    for k, (t, name) in enumerate(zip(tensors, names)):
        buffer = t.detach().contiguous()
        label = f"{what} {name}".strip() if name else ""     # a lone activation: "isend"
        out.append((comm.isend(buffer, dst, group=g, tag=k, name=_message("isend", label)),
                    buffer))
    return out


def run_stage(stage: Stage, micro_batches: int, ops, batches, *, steps: int,
              optimizer: str = "sgd", lr: float = 0.1, loss_fn=None, group=None,
              before_update=None) -> dict:
    """Rank function's core: this rank's stage runs its list of F/B operations per step.

    Every tensor crossing a cut travels with a traced send (non-blocking) and receive,
    one message per tensor (tag k for the k-th), and its gradient travels back the same
    way. The loss of micro-batch j is divided by m, so the accumulated gradients equal
    those of the whole batch; the optimizer steps once per batch, after every backward
    (a "flush"), exactly like the single-device reference. loss_fn: the last stage's
    loss of (logits, labels), a mean over the micro-batch (default: cross-entropy).
    """
    g = as_group(group)
    device = runtime.rank_device()
    part = stage.module.to(device)
    params = list(part.parameters())
    opt = training.make_optimizer(optimizer, params, lr) if params else None
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    out = {"losses": [], "peak_micro_batches": 0, "peak_activation_bytes": 0}
    for step in range(steps):
        xb, yb = next(batches)
        x, y = training.on_device(xb, yb, device)
        xs, ys = x.chunk(micro_batches), y.chunk(micro_batches)
        inputs, outputs, saved_bytes, sends = {}, {}, {}, []
        live = step_loss = 0.0
        live_bytes = 0
        if opt:
            opt.zero_grad()
        for kind, i in ops[g.index]:
            if kind == "F":
                if g.first:
                    x_in = (xs[i],)
                else:
                    x_in = tuple(comm.recv(torch.empty(shape, device=device), src=g.prev,
                                           group=g, tag=k, name=_message("recv", name))
                                 for k, (name, shape) in enumerate(stage.receives))
                    for t in x_in:
                        t.requires_grad_(True)
                counter = memory.saved_tensor_counter(part)
                with span(f"F{i}"), counter:
                    y_out = part(*x_in)
                    y_out = y_out if isinstance(y_out, tuple) else (y_out,)
                    if g.last:
                        y_out = (loss_fn(y_out[0], ys[i]) / micro_batches,)
                if not g.last:
                    sends += _send_each(y_out, stage.sent_names(y_out), g.next, g, "")
                inputs[i], outputs[i], saved_bytes[i] = x_in, y_out, counter.bytes
                live += 1
                live_bytes += counter.bytes
                out["peak_micro_batches"] = max(out["peak_micro_batches"], int(live))
                out["peak_activation_bytes"] = max(out["peak_activation_bytes"], live_bytes)
            else:
                grads = None if g.last else tuple(
                    comm.recv(torch.empty(t.shape, device=device), src=g.next, group=g, tag=k,
                              name=_message("recv", f"grad {name}" if name else ""))
                    for k, (t, name) in enumerate(zip(outputs[i], stage.sent_names(outputs[i]))))
                with span(f"B{i}"):
                    torch.autograd.backward(outputs[i], grads)
                if g.last:
                    step_loss += outputs[i][0].item()
                if not g.first:
                    sends += _send_each([t.grad for t in inputs[i]], stage.names(), g.prev, g,
                                        "grad")
                del outputs[i]
                live -= 1
                live_bytes -= saved_bytes.pop(i)
        comm.wait_all([work for work, _ in sends])  # what was sent lives until delivered
        sends.clear()
        inputs.clear()
        if before_update is not None:
            before_update(part)
        if opt:
            with span("update"):
                opt.step()
        if step == 0:
            out["first_grads"] = training.grads_numpy(part)
        if g.last:
            out["losses"].append(step_loss)
    out["state"] = training.state_numpy(part)
    return out


def _fb_spans(timeline, stages: int, ranks) -> dict[int, list]:
    """Each stage's F and B spans; the stages are ``ranks`` (default: 0 .. stages-1)."""
    ranks = list(range(stages)) if ranks is None else list(ranks)
    return {r: [s for s in timeline if s.rank == r and schedules.pass_kind(s.name)]
            for r in ranks}


def measured_bubble(timeline, stages: int, micro_batches: int, skip_steps: int = 1,
                    ranks=None) -> float:
    """Idle share of the F/B part of each step, averaged over stages and steps.

    A step's window runs from its first F to its last B over all stages; a stage's busy
    time is its F and B spans inside it. Communication and waiting count as idle, as in
    the formula's model. ranks: the stages' global ranks, for a pipeline on a sub-group.
    """
    per_rank = _fb_spans(timeline, stages, ranks)
    first = next(iter(per_rank))
    n_steps = len(per_rank[first]) // (2 * micro_batches)
    shares = []
    for k in range(skip_steps, n_steps):
        chunk = {r: spans[2 * micro_batches * k: 2 * micro_batches * (k + 1)]
                 for r, spans in per_rank.items()}
        t0 = min(s.start for c in chunk.values() for s in c)
        t1 = max(s.end for c in chunk.values() for s in c)
        busy = [sum(s.duration for s in c) for c in chunk.values()]
        shares.append(1 - sum(busy) / (stages * (t1 - t0)))
    return float(np.mean(shares))


def step_shares(timeline, stages: int, micro_batches: int, skip_steps: int = 1,
                ranks=None) -> dict[int, dict[str, float]]:
    """Per stage: shares of compute, transfer ("comm"), wait and idle over the F/B part of
    the steps after the first ``skip_steps`` (the same windows as ``measured_bubble``).

    The bubble seen as kinds of time is what is neither compute nor transfer: wait + idle.
    Shares are averaged over the steps, each step weighing the same (as in
    ``measured_bubble``), so one step stretched by the machine does not dominate.
    """
    windows = step_windows(timeline, stages, micro_batches, ranks)[skip_steps:]
    ranks = list(range(stages)) if ranks is None else list(ranks)
    return shares_by_kind(timeline, windows, ranks, each_window_equal=True)


def step_windows(timeline, stages: int, micro_batches: int,
                 ranks=None) -> list[tuple[float, float]]:
    """(start, end) of the F/B part of every step, for cutting the timeline."""
    per_rank = _fb_spans(timeline, stages, ranks)
    n = len(next(iter(per_rank.values()))) // (2 * micro_batches)
    out = []
    for k in range(n):
        chunk = [s for r in per_rank for s in per_rank[r][2 * micro_batches * k: 2 * micro_batches * (k + 1)]]
        out.append((min(s.start for s in chunk), max(s.end for s in chunk)))
    return out


def steps_by_micro_batches(timeline, stages: int, order, ranks=None) -> dict[int, list]:
    """{m: (start, end) of the F/B part of each of its steps} of a run whose steps took
    the micro-batch counts ``order`` in turn (``train_pipeline_in_turn``'s "order")."""
    per_rank = _fb_spans(timeline, stages, ranks)
    out, at = {}, 0
    for m in order:
        chunk = [s for spans in per_rank.values() for s in spans[at: at + 2 * m]]
        out.setdefault(m, []).append((min(s.start for s in chunk), max(s.end for s in chunk)))
        at += 2 * m
    return out


# ------------------------------------------------------------------ the library way
def library_step(rank: int, world_size: int, cfg: SplitConfig, micro_batches: int,
                 schedule: str = "1f1b", *, group=None) -> dict:
    """Rank function: one step with ``torch.distributed.pipelining`` on the same stages."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    # torch.distributed.pipelining sends through the backend itself: see runtime.library_device
    g, device = as_group(group), runtime.library_device()
    model = split.build(cfg).to(device)
    edges = [0, *cfg.bounds, len(model)]
    part = model[edges[g.index]:edges[g.index + 1]]
    x, y = training.on_device(*next(training.digit_batches(cfg.model, cfg.batch_size)), device)
    with torch.no_grad():
        example = x[: cfg.batch_size // micro_batches]
        for m in model[:edges[g.index]]:
            example = m(example)
    stage = PipelineStage(part, g.index, g.size, device, input_args=(example,), group=g.pg)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = kind(stage, micro_batches, loss_fn=nn.CrossEntropyLoss())  # scales grads by 1/m
    with span(f"library {schedule} step"):
        if g.first:
            sched.step(x)
        elif g.last:
            sched.step(target=y)
        else:
            sched.step()
    grads = training.grads_numpy(part)
    del sched, stage, model, part
    return {"grads": grads}


# ------------------------------------------------------------------ RNN wavefront
def lstm_cells(layers: int, hidden: int, inputs: int = 1, seed: int = 0) -> nn.ModuleList:
    torch.manual_seed(seed)
    return nn.ModuleList(nn.LSTMCell(inputs if k == 0 else hidden, hidden) for k in range(layers))


def lstm_wavefront(rank: int, world_size: int, hidden: int = 64, length: int = 32,
                   batch: int = 64, *, group=None) -> dict:
    """Rank function: one layer of an LSTM stack, driven one time step at a time.

    Layer k (the group's k-th rank) computes step t as soon as layer k-1 has sent its
    output for step t, so at time t layer k works on step t-k: the wavefront. Forward
    pass only.
    """
    g, device = as_group(group), runtime.rank_device()
    cell = lstm_cells(g.size, hidden)[g.index].to(device)
    x, _ = datasets.waves(batch, length, seed=0)
    x = torch.as_tensor(x).to(device)
    h = c = torch.zeros(batch, hidden, device=device)
    sends = []
    with torch.no_grad():
        cell(torch.zeros(batch, cell.input_size, device=device), (h, c))  # first call initialises: not drawn
        comm.barrier(group=g)
        for t in range(length):
            inp = x[:, t] if g.first else comm.recv(torch.empty(batch, hidden, device=device),
                                                    src=g.prev, group=g)
            with span(f"t{t}"):
                h, c = cell(inp, (h, c))
            if not g.last:
                sends.append(comm.isend(h, g.next, group=g))
        comm.wait_all(sends)
    return {"h": training.to_numpy(h) if g.last else None}


def lstm_single_device(layers: int, hidden: int = 64, length: int = 32, batch: int = 64,
                       repeats: int = 3) -> dict:
    """The same stack on one device: cells stepped in Python, and torch's fused LSTM."""
    import time
    cells = lstm_cells(layers, hidden)
    x = torch.as_tensor(datasets.waves(batch, length, seed=0)[0])
    fused = nn.LSTM(1, hidden, num_layers=layers, batch_first=True)
    with torch.no_grad():  # same weights in the fused module
        for k, cell in enumerate(cells):
            for a, b in (("weight_ih", cell.weight_ih), ("weight_hh", cell.weight_hh),
                         ("bias_ih", cell.bias_ih), ("bias_hh", cell.bias_hh)):
                getattr(fused, f"{a}_l{k}").copy_(b)

    def stepped():
        hs = [torch.zeros(batch, hidden) for _ in cells]
        cs = [torch.zeros(batch, hidden) for _ in cells]
        for t in range(length):
            inp = x[:, t]
            for k, cell in enumerate(cells):
                hs[k], cs[k] = cell(inp, (hs[k], cs[k]))
                inp = hs[k]
        return hs[-1]

    out = {}
    with torch.no_grad():
        for name, fn in (("stepped cells", stepped), ("fused nn.LSTM", lambda: fused(x)[0][:, -1])):
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                h = fn()
                times.append(time.perf_counter() - t0)
            out[name] = {"seconds": float(np.median(times[1:])), "h": h.numpy().copy()}
    return out
