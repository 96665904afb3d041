"""Lab 00 (labs/00_devices.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

import math
import statistics

from .. import metrics
from ..core_waits import waiting_name
from . import lessons
from .exercise import Exercise, check, register  # noqa: F401 (labNN.check)
from .explorer import (HERE, bytes_text, choice, cluster_for, explorer, gpu_clusters,
                       refuse_unless_here, seconds_text, slider, time_unit)
from .replays import idle_link  # noqa: F401 (lab00.idle_link: the link every replay prices messages on)


register(Exercise(
    name="ring_allreduce_bytes",
    reference=metrics.ring_allreduce_bytes_per_rank,
    cases=[(s, n) for s in (4, 1_000_000, 64 * 2**20) for n in (1, 2, 3, 4, 8)],
    hint="a ring all-reduce is a reduce-scatter then an all-gather; in each, a rank "
         "passes on n-1 of the n chunks, each 1/n of the message. With one rank nothing "
         "moves.",
))


def predicted_uneven_all_reduce(compute_s, nbytes: float, link, *, steps: int = 1,
                                overhead_s: float = 0.0):
    """PREDICTED timeline of lab 00's first collective: rank r computes ``compute_s[r]``
    seconds, then every rank joins one ring all-reduce of ``nbytes`` (``sim.all_reduce_s``
    on ``link``, plus ``overhead_s`` per call), ``steps`` times.

    A rank waits in the all-reduce from its arrival until the last rank arrives (the
    slowest sets the pace); then the data moves for everyone at once. The cost model
    knows nothing of cores: every rank computes at full speed, all at the same time.
    """
    from .. import sim
    from ..trace import COMM, COMPUTE, WAIT, Span
    n = len(compute_s)
    transfer = sim.all_reduce_s(nbytes, n, link) + overhead_s
    spans, t = [], 0.0
    for _ in range(steps):
        last = t + max(compute_s)
        for r, c in enumerate(compute_s):
            spans.append(Span(r, COMPUTE, "compute", t, t + c))
            if t + c < last:
                spans.append(Span(r, WAIT, "all_reduce", t + c, last))
            spans.append(Span(r, COMM, "all_reduce", last, last + transfer, int(nbytes)))
        t = last + transfer
    return sim.PredictedTimeline(spans, {r: f"rank {r} (predicted)" for r in range(n)},
                                 steps=steps, notes={"strategy": "uneven work, then all-reduce",
                                                     "cluster": str(link)})


def replayed_steps(run, link, names):
    """The first run replayed on dedicated devices (``run.replayed(link)``), cut to its
    steps: the spans called ``names``, without the first barrier."""
    return run.replayed(link).filter(names=set(names))


def _collective_wait(compute_s):
    # a collective ends for nobody before its last member arrives (all start together)
    slowest = max(compute_s)
    return [slowest - c for c in compute_s]


register(Exercise(
    name="collective_wait",
    reference=_collective_wait,
    cases=[([1.0, 2.0, 3.0, 4.0],), ([5.0],), ([0.2, 0.2],), ([3.0, 1.0, 2.0],),
           ([0.004, 0.009, 0.013, 0.018],)],
    hint="every rank starts its computation at the same moment and then joins the same "
         "all-reduce, which cannot start moving data before every rank has joined. Who "
         "joins last, and how long has each of the others been there by then?",
    close=lambda got, want: len(got) == len(want) and all(
        math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-12) for g, w in zip(got, want)),
))


def message_sizes(extra=()) -> list:
    """(label, bytes) from 4 B to 1 GB in powers of 2, and ``extra`` sizes, in order."""
    return [(bytes_text(b), b) for b in sorted({*(2 ** k for k in range(2, 31)), *extra})]


def all_reduce_explorer(worker, here_link, unit_s: float, *, unit_flops: float,
                        message_bytes: int = 10_000):
    """Lab 00's first collective, PREDICTED for n devices, a message size and a cluster.

    worker: the lab's ``first_allreduce(rank, world_size, steps, numel)``: rank r does
    r + 1 units of work, then all-reduces ``numel`` floats. here_link: the link fitted
    in the lab (``sim.Link``); unit_s: one unit of work as measured here; unit_flops:
    the arithmetic of one unit, which sets its time on the other clusters (their
    sustained FLOP/s). "measure it here" launches ``worker`` on n ranks (at most 4).
    """
    from .. import sim

    def costs(cluster, n):
        if cluster == HERE:
            return here_link, unit_s
        c = cluster_for(cluster, n)
        return c.link(n), unit_flops / c.flops

    def predict(n, nbytes, cluster):
        link, unit = costs(cluster, n)
        tl = predicted_uneven_all_reduce([unit * (r + 1) for r in range(n)], nbytes, link)
        step = tl.duration
        ring = sim.all_reduce_s(nbytes, n, link)
        return tl, (f"PREDICTED: one step {seconds_text(step)}; the slowest rank computes {seconds_text(unit * n)}, "
                    f"the all-reduce moves {bytes_text(2 * (n - 1) / n * nbytes)} per rank in "
                    f"{seconds_text(ring)} ({ring / step:.0%} of the step); link {link}"), \
            f"{n} devices, {bytes_text(nbytes)}, {cluster}"

    def measure(n, nbytes, cluster):
        from ..plot.steps import measured_vs_predicted
        from ..launcher import launch
        refuse_unless_here(cluster, n)
        run = launch(worker, n, kwargs=dict(numel=max(nbytes // 4, 1)))
        measured = run.timeline.filter(names=_STEP_NAMES)
        steps = len(measured.step_windows("compute", rank=0)) or 1
        predicted = predicted_uneven_all_reduce([unit_s * (r + 1) for r in range(n)], nbytes,
                                                here_link, steps=steps)
        return measured_vs_predicted(
            measured, predicted, color_by="name",
            unit=time_unit(max(measured.duration, predicted.duration)),
            title=f"{n} devices, {bytes_text(nbytes)}, {cluster}: rank r does r + 1 units, {steps} steps")

    controls = {"n": slider("devices n", range(2, 9), 4),
                "nbytes": slider("message", message_sizes([message_bytes]), message_bytes),
                "cluster": choice("cluster", [HERE, *gpu_clusters()])}
    return explorer(predict, controls, measure=measure)


# ------------------------------------------------------------------ lessons
def first_allreduce(rank, world_size, steps=3, numel=2_500):
    """The notebook's first_allreduce: rank r does r + 1 units of work, then all ranks
    all-reduce ``numel`` floats, ``steps`` times (the lesson experiment's copy)."""
    import torch
    from ..torch import comm, runtime
    from ..trace import span

    device = runtime.rank_device()
    a = torch.randn(256, 256, device=device)
    x = torch.full((numel,), float(rank + 1), device=device)
    torch.tanh(a @ a)
    comm.barrier()
    for _ in range(steps):
        with span("compute"):
            for _ in range(20 * (rank + 1)):
                a = torch.tanh(a @ a)
        comm.all_reduce(x)
        x /= world_size
    return float(x[0])


# the spans of a step of first_allreduce (without the first barrier), with their core waits
_STEP_NAMES = {"compute", "all_reduce", waiting_name("compute"), waiting_name("all_reduce")}


def pace_numbers(run, steps: int = 3) -> dict:
    """What lesson 00.slowest_sets_the_pace reads from a run of ``first_allreduce`` (the
    notebook's table): per rank and step, the seconds it computed and the seconds it
    waited in the all-reduce for the last rank, both measured, without the first barrier;
    and the ranks' share of that time spent waiting for a core."""
    tl = run.timeline.filter(names=_STEP_NAMES)
    return {"compute": [tl.seconds_by_kind(r)["compute"] / steps for r in tl.ranks],
            "wait": [tl.seconds_by_kind(r)["wait"] / steps for r in tl.ranks],
            "core_wait": lessons.core_wait_share(tl, tl.ranks)}


def _pace_experiment() -> dict:
    from ..launcher import launch
    return pace_numbers(launch(first_allreduce, 4), steps=3)


@lessons.lesson("00.slowest_sets_the_pace",
                "when rank r does r + 1 units of work before an all-reduce, the ranks with "
                "less work wait in it for the slowest: rank 0 waits longer per step than the "
                "rank with the most work, by at least half the difference in their compute",
                _pace_experiment)
def slowest_sets_the_pace(m: dict):
    (c0, cn), (w0, wn) = (m["compute"][0], m["compute"][-1]), (m["wait"][0], m["wait"][-1])
    n = len(m["compute"]) - 1
    gap = cn - c0
    figures = (f"per step, rank 0 waits {w0 * 1e3:.1f} ms and rank {n} {wn * 1e3:.1f} ms; "
               f"rank {n} computes {gap * 1e3:.1f} ms longer than rank 0")
    if gap <= 0:
        return False, figures, (f"rank {n} computed no longer than rank 0; the ranks spent "
                                f"{m['core_wait']:.0%} of their time waiting for a core")
    figures += f" (the wait gap is {(w0 - wn) / gap:.0%} of that)"
    why = (f"the ranks spent {m['core_wait']:.0%} of their time waiting for a core, which moves "
           "when each rank finishes the previous all-reduce and starts computing")
    return w0 - wn >= 0.5 * gap, figures, why


def link_numbers(records, timeline=None, op: str = "send_recv", world_size: int = 2) -> dict:
    """What lesson 00.latency_then_bandwidth reads from ``bandwidth.sweep`` records: the
    lower quartile of the repetitions of ``op`` on ``world_size`` ranks at each size, and
    (given the sweep's timeline) the ranks' share of time spent waiting for a core.

    The lower quartile, not the median: beside two busy loops (the ranks waiting for a
    core half their time) a message's time also held its receiver's wait for a core in
    many repetitions, and the median of the sizes up to 1 KB came out 0.40-2.04x the
    median of 4 B, 40 repetitions each (the lesson shown 5 runs in 10); the quicker
    repetitions hold the link's own cost."""
    rows = sorted((r for r in records if r["op"] == op and r["world_size"] == world_size),
                  key=lambda r: r["bytes"])
    ranks = timeline.ranks if timeline is not None else ()
    return {"op": op, "world_size": world_size,
            "bytes": [r["bytes"] for r in rows], "seconds": [r["lower_quartile_s"] for r in rows],
            "core_wait": lessons.core_wait_share(timeline, ranks) if ranks else float("nan")}


def _link_experiment() -> dict:
    from ..launcher import launch
    from ..torch import bandwidth
    sizes = bandwidth.default_sizes(16 * 2**20)          # the notebook's sizes, 4 B to 16 MB
    run = launch(bandwidth.sweep, 2, kwargs=dict(sizes=sizes, ops=("send_recv",)))
    return link_numbers(run.results[0], run.timeline)


SMALL_BYTES = 1024      # "small": up to 1 KB, 256 times the smallest message (4 B)


@lessons.lesson("00.latency_then_bandwidth",
                "a small message costs about the same whatever its size, and a large one in "
                "proportion to its size: timed by the lower quartile of each size's "
                "repetitions, the median of the messages up to 1 KB is within 1.5x of 4 B "
                "(either way), and the largest message takes at least 8x as long as one 16x "
                "smaller (half of proportional)",
                _link_experiment)
def latency_then_bandwidth(m: dict):
    size, secs = m["bytes"], m["seconds"]
    small = [t for b, t in zip(size, secs) if b <= SMALL_BYTES]
    below = [i for i, b in enumerate(size) if b <= size[-1] / 16] if size else []
    if len(small) < 3 or not below:
        return False, f"{len(size)} sizes", "the sweep needs 3 sizes up to 1 KB and a size 16x below the largest"
    flat = statistics.median(small) / secs[0]
    base = below[-1]
    grow, more = secs[-1] / secs[base], size[-1] / size[base]
    flat_text = (lessons.beside(flat, 1.5, at_most=True) if flat >= 1 else
                 lessons.beside(flat, 1 / 1.5))
    figures = (f"{m['op']} on {m['world_size']} ranks, lower quartiles: the {len(small)} sizes up to "
               f"{bytes_text(SMALL_BYTES)} take a median {flat_text}x the time of "
               f"{bytes_text(size[0])}; {bytes_text(size[-1])} take "
               f"{lessons.beside(grow, more / 2, digits=1)}x the time of "
               f"{bytes_text(size[base])} ({more:.0f}x the bytes)")
    why = []
    if flat > 1.5:
        why.append(f"the time of the messages up to {bytes_text(SMALL_BYTES)} grew with size")
    elif flat < 1 / 1.5:
        why.append(f"the smallest message, {bytes_text(size[0])}, took longer than the others "
                   "(a first message can still pay for setting up)")
    if grow < more / 2:
        why.append(_off_the_line(size, secs, base, more / 2))
    if not math.isnan(m["core_wait"]):
        why.append(f"the ranks spent {m['core_wait']:.0%} of their time waiting for a core")
    return 1 / 1.5 <= flat <= 1.5 and grow >= more / 2, figures, "; ".join(why)


def _off_the_line(size, secs, base: int, needed: float) -> str:
    """Why the largest message took too few times the time of ``size[base]``, from the
    alpha-beta line fitted to the sweep's other sizes (not to the two compared): either
    that line gives a small ratio too (its half-speed size, latency x bandwidth, is near
    the largest size: latency still counts), or it gives enough and one of the two
    compared sizes lies off it."""
    others = [i for i in range(len(size)) if i not in (base, len(size) - 1)]
    fit = metrics.fit_link([size[i] for i in others], [secs[i] for i in others])
    fitted = [float(fit.time(size[base])), float(fit.time(size[-1]))]
    expect = fitted[1] / fitted[0]
    line = (f"the alpha-beta line fitted to the other sizes ({fit}; half-speed size "
            f"{bytes_text(fit.latency_s * fit.bandwidth_Bps)}) gives "
            f"{lessons.beside(expect, needed, digits=1)}x")
    if expect < needed:
        return f"{line}: latency still counts at {bytes_text(size[base])}"
    slow, fast = secs[base] / fitted[0], secs[-1] / fitted[1]
    if slow >= 1 / fast:
        return (f"{line}, enough; but {bytes_text(size[base])} took {slow:.1f}x its time on "
                "that line: that one size was slow")
    return (f"{line}, enough; but {bytes_text(size[-1])} took only {fast:.2f}x its time on "
            "that line: that one size was quick")
