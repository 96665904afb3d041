"""Lab 00 (labs/00_devices.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

import math

from .. import metrics
from .exercise import Exercise, check, register  # noqa: F401 (labNN.check)
from .explorer import (HERE, bytes_text, choice, cluster_for, explorer, gpu_clusters,
                       refuse_unless_here, seconds_text, slider, time_unit)


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
        measured = run.timeline.filter(names={"compute", "all_reduce"})
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
