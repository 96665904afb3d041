"""Micro-batch pipeline schedules: build, check, and predict them. No framework needed.
The ranks' side, running them: ``parlab.torch.pipeline`` and ``parlab.tf.pipeline`` (lab 04).

A schedule gives each stage its list of operations in order: ``("F", i)`` runs the
forward pass of micro-batch i, ``("B", i)`` its backward pass. Stage s can run F(i) only
after stage s-1 has run F(i) (it needs the activation), and B(i) only after its own
F(i) and stage s+1's B(i) (it needs the gradient).

* GPipe (Huang et al., 2019): all forwards, then all backwards. Stage s holds the
  activations of all m micro-batches at once.
* 1F1B (PipeDream-flush, Narayanan et al., 2021): after p-s-1 warm-up forwards, stage s
  alternates one forward and one backward, so it never holds more than p-s micro-batches.

Both leave the same idle share, the bubble: (p-1)/(m+p-1) of the step.
"""
from __future__ import annotations

from .trace import COMPUTE, Span, Timeline

Op = tuple[str, int]


def pass_of(name: str) -> Op | None:
    """The operation a span named after a pipeline pass ran: ``("F", 3)`` for "F3",
    ``("B", 0)`` for "B0"; None for any other name ("forward", "F", "recv")."""
    if name[:1] in ("F", "B") and name[1:].isdigit():
        return name[:1], int(name[1:])
    return None


def pass_kind(name: str) -> str | None:
    """"F" or "B" for a span named after a pipeline pass ("F3", "B0"), else None."""
    op = pass_of(name)
    return op[0] if op else None


def gpipe(stages: int, micro_batches: int) -> list[list[Op]]:
    _check_sizes(stages, micro_batches)
    one = [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
    return [list(one) for _ in range(stages)]


def one_f_one_b(stages: int, micro_batches: int) -> list[list[Op]]:
    _check_sizes(stages, micro_batches)
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


def make(name: str, stages: int, micro_batches: int) -> list[list[Op]]:
    try:
        return SCHEDULES[name](stages, micro_batches)
    except KeyError:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {name!r}") from None


def _check_sizes(stages: int, micro_batches: int) -> None:
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"need at least 1 stage and 1 micro-batch, got {stages} and {micro_batches}")


def check(schedule, stages: int, micro_batches: int) -> None:
    """Raise ``ValueError`` saying what is wrong if the schedule is invalid or deadlocks.

    Runs the schedule on paper: every stage steps through its list as far as the
    dependencies allow; if all stages are blocked before the end, it would deadlock.
    """
    if len(schedule) != stages:
        raise ValueError(f"the schedule has {len(schedule)} stage lists, expected {stages}")
    want = sorted([("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)])
    for s, ops in enumerate(schedule):
        ops = [tuple(op) for op in ops]
        if sorted(ops) != want:
            missing = sorted(set(want) - set(ops))
            extra = sorted(set(ops) - set(want)) or [op for op in ops if ops.count(op) > 1][:1]
            raise ValueError(f"stage {s} must run F and B of each of the {micro_batches} "
                             f"micro-batches exactly once; missing {missing}, extra {extra}")
    done: set[tuple[int, str, int]] = set()
    pos = [0] * stages
    while any(pos[s] < len(schedule[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while pos[s] < len(schedule[s]):
                kind, i = schedule[s][pos[s]]
                if not _ready(done, s, kind, i, stages):
                    break
                done.add((s, kind, i))
                pos[s] += 1
                progressed = True
        if not progressed:
            waits = []
            for s in range(stages):
                if pos[s] < len(schedule[s]):
                    kind, i = schedule[s][pos[s]]
                    waits.append(f"stage {s} waits at {kind}{i} for {_needs(done, s, kind, i, stages)}")
            raise ValueError("this schedule deadlocks: " + "; ".join(waits))


def _ready(done, s, kind, i, stages) -> bool:
    if kind == "F":
        return s == 0 or (s - 1, "F", i) in done
    return (s, "F", i) in done and (s == stages - 1 or (s + 1, "B", i) in done)


def _needs(done, s, kind, i, stages) -> str:
    if kind == "F":
        return f"F{i} on stage {s - 1}"
    if (s, "F", i) not in done:
        return f"its own F{i}"
    return f"B{i} on stage {s + 1}"


def simulate(schedule, stages: int, micro_batches: int, forward_s=1.0,
             backward_s=2.0, transfer_s: float = 0.0) -> Timeline:
    """The schedule's timeline under a cost model: every F takes ``forward_s``, every B
    ``backward_s``, every hand-over between stages ``transfer_s``. A prediction, not a
    measurement; plot it with ``parlab.plot.timeline(..., predicted=True)``.

    forward_s, backward_s: one number for every stage, or one per stage (e.g. measured
    on each stage: uneven stages make a bubble the formula does not have), where a stage's
    entry may itself list one time per micro-batch (the F and B of one measured step:
    micro-batches that are not equally fast make a bubble the medians do not have)."""
    check(schedule, stages, micro_batches)
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
    finish: dict[tuple[int, str, int], float] = {}
    free = [0.0] * stages
    pos = [0] * stages
    spans = []
    while any(pos[s] < len(schedule[s]) for s in range(stages)):
        for s in range(stages):
            while pos[s] < len(schedule[s]):
                kind, i = schedule[s][pos[s]]
                if not _ready(finish, s, kind, i, stages):
                    break
                deps = [finish[(s, "F", i)]] if kind == "B" else []
                if kind == "F" and s > 0:
                    deps.append(finish[(s - 1, "F", i)] + transfer_s)
                if kind == "B" and s < stages - 1:
                    deps.append(finish[(s + 1, "B", i)] + transfer_s)
                start = max([free[s], *deps])
                cost = fwd[s] if kind == "F" else bwd[s]
                end = start + (cost[i] if hasattr(cost, "__len__") else cost)
                finish[(s, kind, i)] = free[s] = end
                spans.append(Span(s, COMPUTE, f"{kind}{i}", start, end))
                pos[s] += 1
    return Timeline(spans, {s: f"stage {s} (predicted)" for s in range(stages)})


def bubble_share(timeline: Timeline) -> float:
    """Mean idle share of the stages over the span of the whole step."""
    return sum(timeline.seconds_by_kind(r)["idle"] for r in timeline.ranks) / (
        len(timeline.ranks) * (timeline.duration or 1.0))


def peak_in_flight(schedule) -> list[int]:
    """Most micro-batches whose activations each stage holds at once (F done, B not)."""
    peaks = []
    for ops in schedule:
        live = peak = 0
        for kind, _ in ops:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        peaks.append(peak)
    return peaks
