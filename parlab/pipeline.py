"""Micro-batch pipeline schedules: build, check, and predict them. No framework needed.
The ranks' side, running them: ``parlab.torch.pipeline`` and ``parlab.tf.pipeline`` (lab 04),
``parlab.torch.pipeline_chunks`` (several chunks per device and a split backward, lab 12).

A schedule gives each device its list of operations in order: ``("F", i)`` runs the
forward pass of micro-batch i, ``("B", i)`` its backward pass. Stage s can run F(i) only
after stage s-1 has run F(i) (it needs the activation), and B(i) only after its own
F(i) and stage s+1's B(i) (it needs the gradient).

* GPipe (Huang et al., 2019): all forwards, then all backwards. Stage s holds the
  activations of all m micro-batches at once.
* 1F1B (PipeDream-flush, Narayanan et al., 2021): after p-s-1 warm-up forwards, stage s
  alternates one forward and one backward, so it never holds more than p-s micro-batches.

Both leave the same idle share, the bubble: (p-1)/(m+p-1) of the step.

Past 1F1B (``pipeline_orders``), an operation may name a chunk, ``("F", i, c)``: a device
holds ``chunks`` pieces of the model (virtual stages), placed round-robin ("loop":
chunk c of device d is virtual stage c·p + d, Narayanan et al., 2021) or in a V ("v":
d, then 2p-1-d, as DualPipeV). And ``("W", i, c)`` splits a backward in two (Qi et al.,
2024): where a device runs W(i), its B(i) computes only the gradient of the input, which
the previous stage waits for, and W(i) the gradient of the weights, which nobody waits for.
"""
from __future__ import annotations

from . import pipeline_orders
from .pipeline_orders import PLACEMENTS, Schedule, check_sizes  # noqa: F401 (pipeline.Schedule)
from .trace import COMPUTE, Span, Timeline

Op = tuple  # ("F" | "B" | "W", micro-batch) or (..., micro-batch, chunk)


def layout(schedule) -> tuple[int, str]:
    """(chunks per device, placement) of a schedule; a plain list has one chunk."""
    return getattr(schedule, "chunks", 1), getattr(schedule, "placement", "loop")


def virtual_stage(device: int, chunk: int, devices: int, placement: str = "loop") -> int:
    """The virtual stage (its place in the model) that chunk ``chunk`` of ``device`` holds."""
    if placement == "v":
        return device if chunk == 0 else 2 * devices - 1 - device
    return chunk * devices + device


def device_of(stage: int, devices: int, placement: str = "loop") -> tuple[int, int]:
    """(device, chunk) holding virtual stage ``stage``."""
    if placement == "v":
        return (stage, 0) if stage < devices else (2 * devices - 1 - stage, 1)
    return stage % devices, stage // devices


def op_parts(op) -> tuple[str, int, int]:
    """(kind, micro-batch, chunk) of an operation written with or without its chunk."""
    return (op[0], int(op[1]), int(op[2]) if len(op) > 2 else 0)


def pass_name(kind: str, i: int, c: int, chunks: int = 1) -> str:
    """A traced pass's name: "F3", or with several chunks "F3.1" (chunk 1)."""
    return f"{kind}{i}" if chunks == 1 else f"{kind}{i}.{c}"


def pass_of(name: str) -> Op | None:
    """The operation a span named after a pipeline pass ran: ``("F", 3)`` for "F3",
    ``("B", 0)`` for "B0", ``("W", 2, 1)`` for "W2.1"; None for any other name
    ("forward", "F", "recv")."""
    kind, rest = name[:1], name[1:]
    if kind not in ("F", "B", "W"):
        return None
    mb, dot, chunk = rest.partition(".")
    if mb.isdigit() and (not dot or chunk.isdigit()):
        return (kind, int(mb), int(chunk)) if dot else (kind, int(mb))
    return None


def pass_kind(name: str) -> str | None:
    """"F", "B" or "W" for a span named after a pipeline pass ("F3", "B0", "W1.1"), else None."""
    op = pass_of(name)
    return op[0] if op else None


def gpipe(stages: int, micro_batches: int) -> list[list[Op]]:
    check_sizes(stages, micro_batches)
    one = [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
    return [list(one) for _ in range(stages)]


def one_f_one_b(stages: int, micro_batches: int) -> list[list[Op]]:
    check_sizes(stages, micro_batches)
    out = []
    for s in range(stages):
        warmup = min(stages - s - 1, micro_batches)
        ops: list[Op] = [("F", i) for i in range(warmup)]
        f, b = warmup, 0
        while b < micro_batches:
            if f < micro_batches:
                ops.append(("F", f))
                f += 1
            ops.append(("B", b))
            b += 1
        out.append(ops)
    return out


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}
CHUNKED = ("interleaved", "zb-h1", "dualpipev")     # in ``pipeline_orders``


def make(name: str, stages: int, micro_batches: int, chunks: int = 2) -> list[list[Op]]:
    """A schedule by name: "gpipe", "1f1b", or (``pipeline_orders``) "interleaved"
    (``chunks`` per device), "zb-h1", "dualpipev"."""
    if name in SCHEDULES:
        return SCHEDULES[name](stages, micro_batches)
    if name == "interleaved":
        return pipeline_orders.interleaved_1f1b(stages, micro_batches, chunks)
    if name == "zb-h1":
        return pipeline_orders.zb_h1(stages, micro_batches)
    if name == "dualpipev":
        return pipeline_orders.dualpipev(stages, micro_batches)
    raise ValueError(f"schedule must be one of {sorted(SCHEDULES) + list(CHUNKED)}, got {name!r}")


def _where(s: int, c: int, chunks: int) -> str:
    return f"stage {s}" if chunks == 1 else f"device {s} chunk {c}"


def check(schedule, stages: int, micro_batches: int) -> None:
    """Raise ``ValueError`` saying what is wrong if the schedule is invalid or deadlocks.

    Every device must run F and B of each micro-batch on each of its chunks exactly once,
    and W at most once. Then the schedule runs on paper: every device steps through its
    list as far as the dependencies allow; if all are blocked before the end, it would
    deadlock.
    """
    chunks, placement = layout(schedule)
    if len(schedule) != stages:
        raise ValueError(f"the schedule has {len(schedule)} stage lists, expected {stages}")
    for s, ops in enumerate(schedule):
        _check_complete(s, [op_parts(op) for op in ops], micro_batches, chunks)
    _play(schedule, stages, placement, None)


def _check_complete(s, ops, micro_batches, chunks) -> None:
    for c in range(chunks):
        mine = [(k, i) for k, i, cc in ops if cc == c]
        want = sorted([(k, i) for k in "FB" for i in range(micro_batches)])
        have = sorted(op for op in mine if op[0] != "W")
        weights = [i for k, i in mine if k == "W"]
        if (have != want or len(set(weights)) != len(weights)
                or not set(weights) <= set(range(micro_batches))):
            missing = sorted(set(want) - set(have))
            extra = sorted(set(mine) - set(want) - {("W", i) for i in range(micro_batches)}) or [
                op for op in mine if mine.count(op) > 1][:1]
            raise ValueError(f"{_where(s, c, chunks)} must run F and B of each of the "
                             f"{micro_batches} micro-batches exactly once (and W at most once); "
                             f"missing {missing}, extra {extra}")
    bad = sorted({cc for _, _, cc in ops} - set(range(chunks)))
    if bad:
        raise ValueError(f"stage {s} names chunk {bad[0]}, but devices hold {chunks} chunk(s)")


def _play(schedule, devices: int, placement: str, clock):
    """Step every device through its list as the dependencies allow; {(virtual stage,
    kind, micro-batch): end time}. ``clock``: None (check only), or to time it a function
    (device, (kind, i, chunk), split, [(end of a need, from another device)]) -> end."""
    chunks = layout(schedule)[0]
    last = devices * chunks - 1
    split = {(d, op_parts(op)[1], op_parts(op)[2]) for d, ops in enumerate(schedule)
             for op in ops if op[0] == "W"}
    done: dict[tuple, float] = {}
    pos = [0] * devices
    while any(pos[d] < len(schedule[d]) for d in range(devices)):
        progressed = False
        for d in range(devices):
            while pos[d] < len(schedule[d]):
                kind, i, c = op_parts(schedule[d][pos[d]])
                k = virtual_stage(d, c, devices, placement)
                needs = _needs(k, kind, i, last)
                if any(n not in done for n in needs):
                    break
                end = clock(d, (kind, i, c), (d, i, c) in split,
                            [(done[n], device_of(n[0], devices, placement)[0] != d)
                             for n in needs]) if clock else 0.0
                done[(k, kind, i)] = end
                pos[d] += 1
                progressed = True
        if not progressed:
            waits = []
            for d in range(devices):
                if pos[d] < len(schedule[d]):
                    kind, i, c = op_parts(schedule[d][pos[d]])
                    k = virtual_stage(d, c, devices, placement)
                    need = next(n for n in _needs(k, kind, i, last) if n not in done)
                    waits.append(f"{_where(d, c, chunks)} waits at "
                                 f"{pass_name(kind, i, c, chunks)} for "
                                 f"{_describe(need, k, devices, placement, chunks)}")
            raise ValueError("this schedule deadlocks: " + "; ".join(waits))
    return done


def _needs(k: int, kind: str, i: int, last: int) -> list[tuple]:
    """What (virtual stage, kind, micro-batch) must be done before this operation."""
    if kind == "F":
        return [(k - 1, "F", i)] if k > 0 else []
    if kind == "W":
        return [(k, "B", i)]
    return [(k, "F", i)] + ([(k + 1, "B", i)] if k < last else [])


def _describe(need, k, devices, placement, chunks) -> str:
    nk, kind, i = need
    if nk == k:
        return f"its own {pass_name(kind, i, device_of(nk, devices, placement)[1], chunks)}"
    nd, nc = device_of(nk, devices, placement)
    return f"{pass_name(kind, i, nc, chunks)} on {_where(nd, nc, chunks)}"


def simulate(schedule, stages: int, micro_batches: int, forward_s=1.0,
             backward_s=2.0, transfer_s: float = 0.0, weight_s=None) -> Timeline:
    """The schedule's timeline under a cost model: every F takes ``forward_s``, every B
    ``backward_s``, every hand-over between devices ``transfer_s``. A prediction, not a
    measurement; plot it with ``parlab.plot.timeline(..., predicted=True)``.

    forward_s, backward_s: one number for every stage, or one per stage (e.g. measured
    on each stage: uneven stages make a bubble the formula does not have), where a stage's
    entry may itself list one time per micro-batch (the F and B of one measured step:
    micro-batches that are not equally fast make a bubble the medians do not have).
    With several chunks per device these are one device's whole share of the model: a
    chunk's pass takes 1/chunks of it. weight_s: the part of backward_s that computes
    weight gradients (default half: for a linear layer the two gradients cost the same
    multiply-adds); a split backward's B takes the rest, its W this part.
    """
    check(schedule, stages, micro_batches)
    chunks, placement = layout(schedule)
    fwd = list(forward_s) if hasattr(forward_s, "__len__") else [forward_s] * stages
    bwd = list(backward_s) if hasattr(backward_s, "__len__") else [backward_s] * stages
    if len(fwd) != stages or len(bwd) != stages:
        raise ValueError(f"give one forward and one backward time per stage ({stages}), got "
                         f"{len(fwd)} and {len(bwd)}")
    for per_stage in (fwd, bwd):
        for s, cost in enumerate(per_stage):
            if hasattr(cost, "__len__") and len(cost) != micro_batches:
                raise ValueError(f"stage {s}: give one time per micro-batch ({micro_batches}), "
                                 f"got {len(cost)}")

    def cost(table, d, i):
        x = table[d]
        return (x[i] if hasattr(x, "__len__") else x) / chunks

    free = [0.0] * stages
    spans = []

    def clock(d, op, split, deps):
        kind, i, c = op
        start = max([free[d], *(t + (transfer_s if far else 0.0) for t, far in deps)])
        full = cost(bwd, d, i)
        weight = full / 2 if weight_s is None else cost(
            weight_s if hasattr(weight_s, "__len__") else [weight_s] * stages, d, i)
        took = {"F": cost(fwd, d, i), "W": weight,
                "B": full - weight if split else full}[kind]
        free[d] = start + took
        spans.append(Span(d, COMPUTE, pass_name(kind, i, c, chunks), start, free[d]))
        return free[d]

    _play(schedule, stages, placement, clock)
    return Timeline(spans, {s: f"stage {s} (predicted)" for s in range(stages)})


def bubble_share(timeline: Timeline) -> float:
    """Mean idle share of the stages over the span of the whole step."""
    return sum(timeline.seconds_by_kind(r)["idle"] for r in timeline.ranks) / (
        len(timeline.ranks) * (timeline.duration or 1.0))


def peak_in_flight(schedule) -> list[int]:
    """Most micro-batches whose activations each device holds at once, counted per chunk:
    from F until B, or until W where the backward is split (W still reads the layer
    inputs F saved). With ``chunks`` per device a chunk holds 1/chunks of a device's
    layers, so a device's activation memory is this count / chunks stage-loads."""
    peaks = []
    for ops in schedule:
        ops = [op_parts(op) for op in ops]
        split = {(i, c) for k, i, c in ops if k == "W"}
        live = peak = 0
        for kind, i, c in ops:
            if kind == "F":
                live += 1
            elif (kind == "W") == ((i, c) in split):
                live -= 1
            peak = max(peak, live)
        peaks.append(peak)
    return peaks
