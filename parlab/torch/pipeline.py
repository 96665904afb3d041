"""Lab 04: pipelines. An LSTM stack's wavefront, then micro-batch schedules by hand.

Each stage lives on its own rank. Activations travel forward and gradients backward with
traced send/recv; sends are non-blocking (``comm.isend``), so a stage never stalls
waiting for a neighbour to receive while that neighbour waits to send to it.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import nn

from .. import data as datasets
from .. import schedules
from ..splitting import SplitConfig, balance
from ..trace import span
from . import comm, memory, split

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


def launch_pipeline(cfg: SplitConfig, stages: int, micro_batches: int, schedule="1f1b",
                    timeout: float = 120.0, devices=None):
    """Validate, then run ``train_pipeline`` on ``stages`` ranks (see ``parlab.launch``)."""
    from ..launcher import launch
    cfg, ops = prepare(cfg, stages, micro_batches, schedule)
    return launch(train_pipeline, stages, args=(cfg, micro_batches, ops), timeout=timeout,
                  devices=devices)


# ------------------------------------------------------------------ the executor
def train_pipeline(rank: int, world_size: int, cfg: SplitConfig, micro_batches: int, ops) -> dict:
    """Worker: stage ``rank`` runs its list of F/B operations for every step.

    The loss of micro-batch i is divided by m, so the accumulated gradients equal those
    of the whole batch; the optimizer steps once per batch, after every backward (a
    "flush"), exactly like the single-device reference.
    """
    model = split.build(cfg)
    edges = [0, *cfg.bounds, len(model)]
    first, last = rank == 0, rank == world_size - 1
    with torch.no_grad():  # boundary shapes of one micro-batch
        shapes, a = [], torch.zeros(split.input_shape(cfg)[0] // micro_batches, *split.input_shape(cfg)[1:])
        for m in model:
            shapes.append(tuple(a.shape))
            a = m(a)
    part = model[edges[rank]:edges[rank + 1]]
    del model
    params = list(part.parameters())
    opt = split._optimizer(cfg, params) if params else None
    loss_fn = nn.CrossEntropyLoss()
    batches = split._batches(cfg)
    out = {"losses": [], "peak_micro_batches": 0, "peak_activation_bytes": 0}
    for step in range(cfg.steps):
        xb, yb = next(batches)
        xs = torch.as_tensor(xb).chunk(micro_batches)
        ys = torch.as_tensor(yb).chunk(micro_batches)
        inputs, outputs, saved_bytes, sends = {}, {}, {}, []
        live = step_loss = 0.0
        live_bytes = 0
        if opt:
            opt.zero_grad()
        for kind, i in ops[rank]:
            if kind == "F":
                if first:
                    x_in = xs[i]
                else:
                    x_in = comm.recv(torch.empty(shapes[edges[rank]]), src=rank - 1)
                    x_in.requires_grad_(True)
                counter = memory.saved_tensor_counter(part)
                with span(f"F{i}"), counter:
                    y = part(x_in)
                    if last:
                        y = loss_fn(y, ys[i]) / micro_batches
                if not last:
                    sends.append(comm.isend(y.detach(), rank + 1))
                inputs[i], outputs[i], saved_bytes[i] = x_in, y, counter.bytes
                live += 1
                live_bytes += counter.bytes
                out["peak_micro_batches"] = max(out["peak_micro_batches"], int(live))
                out["peak_activation_bytes"] = max(out["peak_activation_bytes"], live_bytes)
            else:
                grad = None if last else comm.recv(torch.empty_like(outputs[i]), src=rank + 1)
                with span(f"B{i}"):
                    outputs[i].backward(grad)
                if last:
                    step_loss += outputs[i].item()
                if not first:
                    sends.append(comm.isend(inputs[i].grad, rank - 1))
                del outputs[i]
                live -= 1
                live_bytes -= saved_bytes.pop(i)
        comm.wait_all(sends)  # the tensors sent must stay alive until delivered
        inputs.clear()
        if opt:
            with span("update"):
                opt.step()
        if step == 0:
            out["first_grads"] = {n: p.grad.numpy().copy() for n, p in part.named_parameters()}
        if last:
            out["losses"].append(step_loss)
    out["state"] = split._state(part)
    return out


def measured_bubble(timeline, stages: int, micro_batches: int, skip_steps: int = 1) -> float:
    """Idle share of the F/B part of each step, averaged over stages and steps.

    A step's window runs from its first F to its last B over all stages; a stage's busy
    time is its F and B spans inside it. Communication and waiting count as idle, as in
    the formula's model.
    """
    per_rank = {r: [s for s in timeline if s.rank == r and s.name[:1] in "FB"
                    and s.name[1:].isdigit()] for r in range(stages)}
    n_steps = len(per_rank[0]) // (2 * micro_batches)
    shares = []
    for k in range(skip_steps, n_steps):
        chunk = {r: spans[2 * micro_batches * k: 2 * micro_batches * (k + 1)]
                 for r, spans in per_rank.items()}
        t0 = min(s.start for c in chunk.values() for s in c)
        t1 = max(s.end for c in chunk.values() for s in c)
        busy = [sum(s.duration for s in c) for c in chunk.values()]
        shares.append(1 - sum(busy) / (stages * (t1 - t0)))
    return float(np.mean(shares))


def step_windows(timeline, stages: int, micro_batches: int) -> list[tuple[float, float]]:
    """(start, end) of the F/B part of every step, for cutting the timeline."""
    spans0 = [s for s in timeline if s.name[:1] in "FB" and s.name[1:].isdigit()]
    per_rank = {r: [s for s in spans0 if s.rank == r] for r in range(stages)}
    n = len(per_rank[0]) // (2 * micro_batches)
    out = []
    for k in range(n):
        chunk = [s for r in per_rank for s in per_rank[r][2 * micro_batches * k: 2 * micro_batches * (k + 1)]]
        out.append((min(s.start for s in chunk), max(s.end for s in chunk)))
    return out


# ------------------------------------------------------------------ the library way
def library_step(rank: int, world_size: int, cfg: SplitConfig, micro_batches: int,
                 schedule: str = "1f1b") -> dict:
    """Worker: one step with ``torch.distributed.pipelining`` on the same stages."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    model = split.build(cfg)
    edges = [0, *cfg.bounds, len(model)]
    part = model[edges[rank]:edges[rank + 1]]
    x, y = next(split._batches(cfg))
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    with torch.no_grad():
        example = x[: cfg.batch_size // micro_batches]
        for m in model[:edges[rank]]:
            example = m(example)
    stage = PipelineStage(part, rank, world_size, torch.device("cpu"), input_args=(example,))
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = kind(stage, micro_batches, loss_fn=nn.CrossEntropyLoss())  # scales grads by 1/m
    with span(f"library {schedule} step"):
        if rank == 0:
            sched.step(x)
        elif rank == world_size - 1:
            sched.step(target=y)
        else:
            sched.step()
    grads = {n: p.grad.numpy().copy() for n, p in part.named_parameters()}
    del sched, stage, model, part
    return {"grads": grads}


# ------------------------------------------------------------------ RNN wavefront
def lstm_cells(layers: int, hidden: int, inputs: int = 1, seed: int = 0) -> nn.ModuleList:
    torch.manual_seed(seed)
    return nn.ModuleList(nn.LSTMCell(inputs if k == 0 else hidden, hidden) for k in range(layers))


def lstm_wavefront(rank: int, world_size: int, hidden: int = 64, length: int = 32,
                   batch: int = 64) -> dict:
    """Worker: layer ``rank`` of an LSTM stack, driven one time step at a time.

    Layer k computes step t as soon as layer k-1 has sent its output for step t, so at
    time t layer k works on step t-k: the wavefront. Forward pass only.
    """
    cell = lstm_cells(world_size, hidden)[rank]
    x, _ = datasets.waves(batch, length, seed=0)
    x = torch.as_tensor(x)
    h = c = torch.zeros(batch, hidden)
    sends = []
    with torch.no_grad():
        cell(torch.zeros(batch, cell.input_size), (h, c))  # first call initialises: not drawn
        comm.barrier()
        for t in range(length):
            inp = x[:, t] if rank == 0 else comm.recv(torch.empty(batch, hidden), src=rank - 1)
            with span(f"t{t}"):
                h, c = cell(inp, (h, c))
            if rank < world_size - 1:
                sends.append(comm.isend(h, rank + 1))
        comm.wait_all(sends)
    return {"h": h.numpy().copy() if rank == world_size - 1 else None}


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
