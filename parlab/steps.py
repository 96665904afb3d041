"""Reading steps out of a timeline: step times, a typical or quickest step, and the
share of each kind of time. One home for what labs, explorers and benchmarks read."""
from __future__ import annotations

from .spans import LANE_KINDS


def step_seconds(timeline, marker: str, skip: int = 2, rank: int | None = None) -> float:
    """Median time from one step's ``marker`` span to the next's on ``rank`` (default
    the first rank).

    The first ``skip`` steps (start-up) and the last (it has no next) are left out.
    """
    import numpy as np
    windows = timeline.step_windows(marker, rank)[skip:-1]
    if not windows:
        raise ValueError(f"too few steps to time: run more than {skip + 1}")
    return float(np.median([b - a for a, b in windows]))


def typical_step(timeline, marker: str = "forward", skip: int = 2):
    """The median step after the first ``skip`` (start-up), cut at ``marker`` on the first
    rank: a step as it usually goes, to set beside a prediction (steps jitter here)."""
    windows = timeline.step_windows(marker)[skip:-1] or timeline.step_windows(marker)[skip:]
    if not windows:
        raise ValueError(f"too few steps to choose from: run more than {skip + 1}")
    start, end = sorted(windows, key=lambda w: w[1] - w[0])[len(windows) // 2]
    return timeline.window(start, end)


def quickest_step(timeline, marker: str = "forward", skip: int = 2):
    """The quickest complete step after the first ``skip``: the one least disturbed by
    whatever else the machine was doing, which shows a step's structure most plainly.

    Steps run from one ``marker`` span to the next on the first rank. Say that it is the
    quickest wherever it is shown: it is a measured step, not a typical one.
    """
    windows = timeline.step_windows(marker)[skip:-1]
    if not windows:
        raise ValueError(f"too few steps to choose from: run more than {skip + 1}")
    start, end = min(windows, key=lambda w: w[1] - w[0])
    return timeline.window(start, end)


def median_phase(timeline, name: str, rank: int, skip: int = 1) -> float:
    """The median duration of the spans called ``name`` on ``rank`` (the first ``skip``
    left out: start-up)."""
    import statistics
    times = [s.duration for s in timeline.spans if s.rank == rank and s.name == name]
    if not times:
        raise ValueError(f"no span {name!r} on rank {rank}")
    return statistics.median(times[skip:] or times)


def shares_by_kind(timeline, windows, lanes=None, *,
                   each_window_equal: bool = False) -> dict[int, dict[str, float]]:
    """Per lane: share of compute, transfer (comm), wait, waiting for a core (core_wait) and
    idle over the given windows.

    By default the windows' seconds are added up, so a long window counts for more; with
    ``each_window_equal`` each window's shares are averaged, so one step stretched by the
    machine does not dominate (lab 04's pipelines).
    """
    lanes = timeline.ranks if lanes is None else lanes
    kinds = LANE_KINDS
    totals = {r: dict.fromkeys(kinds, 0.0) for r in lanes}
    for a, b in windows:
        win = timeline.window(a, b)
        for r in lanes:
            secs = win.seconds_by_kind(r)
            for k in kinds:
                totals[r][k] += (secs[k] / ((b - a) or 1.0) / len(windows) if each_window_equal
                                 else secs[k])
    if each_window_equal:
        return totals
    return {r: {k: v / (sum(t.values()) or 1.0) for k, v in t.items()} for r, t in totals.items()}


def shares_text(shares: dict, labels=None) -> str:
    """``shares_by_kind`` in words, one lane after another."""
    return "; ".join(f"{(labels or {}).get(r, f'rank {r}')}: compute {s['compute']:.0%}, "
                     f"transfer {s['comm']:.0%}, wait {s['wait']:.0%}, "
                     f"waiting for a core {s['core_wait']:.0%}, idle {s['idle']:.0%}"
                     for r, s in shares.items())


def warm_shares(timeline, marker: str, skip: int = 1, rank=None) -> dict:
    """Mean compute / transfer / waiting for a core / wait+idle share over the steps after
    the first ``skip``."""
    windows = timeline.step_windows(marker, rank)[skip:]
    shares = shares_by_kind(timeline, windows)
    lanes = list(shares)
    return {k: sum(shares[r][k] for r in lanes) / len(lanes)
            for k in ("compute", "comm", "core_wait")} | {
        "idle": sum(shares[r]["wait"] + shares[r]["idle"] for r in lanes) / len(lanes)}


def as_the_model_counts(timeline):
    """The measured timeline with each wait for a core carved out of a transfer or a wait
    counted as waiting: the cost model has no core-wait kind, and charges a rank woken by
    a message its wake-up as part of that message (``sim.engine``: ``wake_s`` in the wait,
    ring wake-ups in the transfer). Waits for a core carved out of computation stay apart,
    as the model's compute holds none. So a share of transfer and waiting compares like
    with like: measured transfer + wait + idle + the messages' core waits."""
    from dataclasses import replace

    from .core_waits import waiting_name
    from .spans import COMM, CORE_WAIT, WAIT
    from .timeline import Timeline
    messages = {waiting_name(s.name) for s in timeline if s.kind in (COMM, WAIT)}
    spans = [replace(s, kind=WAIT) if s.kind == CORE_WAIT and s.name in messages else s
             for s in timeline]
    return Timeline(spans, timeline.labels, timeline.ranks)
