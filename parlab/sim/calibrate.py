"""Fitting the cost model to what was measured here: links, compute rates, layer costs.

The measurements come from timelines (lab 00's transfers, lab 01's steps, lab 04's
pipelines); the fits are least squares (``numpy.polyfit``) of time against size.
"""
from __future__ import annotations


# The cost model needs a few numbers about this machine. Each lab takes them from a
# measurement it has already made, and never from the number it then compares against.
def link_from_transfers(timeline, *, ranks=None, names=None, all_reduce_over: int = 0):
    """The link (``sim.Link``) fitted to the measured transfers of a timeline.

    Every transfer span (kind "comm", the part after any wait) is one point (bytes,
    seconds), with the time its rank then waited for a core added back: on this machine
    that is part of what a message costs (and without it the tiny transfers left of a
    contended exchange fit no bandwidth at all). ``metrics.fit_link`` draws
    t = A + S / B through them. Point to point,
    that is alpha and beta. For all-reduces over ``all_reduce_over`` = n ranks the ring
    model says t = 2(n-1) alpha + 2(n-1)/n S / beta, so alpha and beta
    are taken back out of A and B. With a single message size, the link is that size
    over its median time (no latency of its own).
    """
    from ..core_waits import waiting_name
    from ..metrics import fit_link
    from ..trace import COMM, CORE_WAIT
    waited = {(s.rank, s.start, s.name): s.duration for s in timeline.spans if s.kind == CORE_WAIT}
    pts = [(s.bytes, s.duration + waited.get((s.rank, s.end, waiting_name(s.name)), 0.0))
           for s in timeline.spans
           if s.kind == COMM and s.bytes > 0 and (ranks is None or s.rank in ranks)
           and (names is None or s.name in names)]
    if not pts:
        raise ValueError("the timeline has no transfers to fit a link to")
    if len({b for b, _ in pts}) < 2:      # one size: its bytes over its median time
        import statistics

        from ..metrics import LinkFit
        size = pts[0][0]
        fit = LinkFit(0.0, size / statistics.median(t for _, t in pts))
    else:
        fit = fit_link([b for b, _ in pts], [t for _, t in pts])
    return _link_from_fit(fit, all_reduce_over, collective=all_reduce_over > 1)


def link_from_records(records, op: str = "all_reduce", world_size: int = 2):
    """The link fitted to sweep records ({op, world_size, bytes, seconds}: lab 00's
    ``bandwidth.sweep``, lab 05's ``ring_bandwidth``), taken back out of the ring model
    for all-reduces (see ``link_from_transfers``)."""
    from ..metrics import fit_link
    rs = [r for r in records if r.get("op", op) == op and r["world_size"] == world_size
          and r.get("impl", "library") == "library"]
    fit = fit_link([r["bytes"] for r in rs], [r["seconds"] for r in rs])
    return _link_from_fit(fit, world_size, collective=op == "all_reduce")


def spread_from_records(records, link, overhead_s: float = 0.0) -> tuple[tuple, tuple]:
    """(point-to-point strays, all-reduce strays): how far each message of a sweep
    (lab 00's ``bandwidth.sweep`` records with their ``times_s``) took beyond the price
    the model gives it, in seconds: a message against alpha + S / beta, an all-reduce
    of two ranks against the ring on ``link`` plus ``overhead_s``. Where a sweep on a
    busy CPU sees a few messages wait milliseconds for a core, the strays hold them; the
    engine draws from them (``Cluster.message_spread_s``, ``collective_spread_s``)."""
    from .links import all_reduce_s
    p2p, coll = [], []
    for r in records:
        if r["op"] == "send_recv":
            p2p += [t - link.time(r["bytes"]) for t in r.get("times_s", ())]
        elif r["op"] == "all_reduce" and r["world_size"] == 2:
            price = all_reduce_s(r["bytes"], 2, link) + overhead_s
            coll += [t - price for t in r.get("times_s", ())]
    return tuple(p2p), tuple(coll)


def _link_from_fit(fit, n: int, collective: bool):
    from .. import sim
    if not collective:
        return sim.Link(fit.latency_s, fit.bandwidth_Bps)
    return sim.Link(fit.latency_s / (2 * (n - 1)), fit.bandwidth_Bps * 2 * (n - 1) / n)


def this_machine(link, *, flops: float, layer_overhead_s: float = 0.0, devices: int = 4,
                 name: str = "this machine (calibrated in this lab)"):
    """A ``sim.Cluster`` for this machine from what a lab measured: one link for every
    pair (loopback), a sustained rate for compute and a fixed cost per layer pass.

    Every device gets a processor of its own (``cores`` left at 0), on purpose: the labs
    set this prediction beside a measurement of simulated devices that share a few
    cores, and the difference between the two is what they discuss. (``sim`` can share
    cores: ``dataclasses.replace(cluster, cores=2)``.)"""
    from .. import sim
    return sim.Cluster(name, devices, 8e9, flops=flops, layer_overhead_s=layer_overhead_s,
                       devices_per_node=devices, intra=link, inter=link)


def compute_rate(net, measured) -> float:
    """The sustained FLOP/s a ``sim.Measured`` implies: the network's forward and
    backward arithmetic (3 x the forward's) for its batch, over their seconds."""
    seconds = sum(measured.forward) + sum(measured.backward) - 2 * len(net) * measured.fixed_s
    return 3 * sum(layer.flops for layer in net.layers) * measured.batch / max(seconds, 1e-12)


def fit_compute(flops, seconds, layers: int) -> tuple[float, float]:
    """(FLOP/s, fixed seconds per layer pass) from steps of ``flops`` arithmetic that took
    ``seconds``: a straight line, slope 1/rate, intercept the fixed cost of 2 x layers
    passes (forward and backward of every layer).

    Where the larger steps came out no slower (a slope of zero or less: noise bigger than
    the arithmetic, seen once in lab 07's calibration at batches 16-64), the line cannot
    tell the two apart, and the whole of each step is charged to arithmetic: a line
    through the origin, no fixed cost (instead of an infinite rate)."""
    from ..metrics import fit_line
    slope, intercept = fit_line(flops, seconds)
    if slope <= 0:
        slope = sum(f * t for f, t in zip(flops, seconds)) / sum(f * f for f in flops)
        return 1 / slope, 0.0
    return 1 / slope, max(intercept, 0.0) / (2 * layers)


def costs_from_phases(net, batch: int, forward_s: float, backward_s: float, update_s: float):
    """``sim.Measured`` costs from a step's measured phases (seconds for ``batch``
    samples), shared among the network's layers in proportion to their FLOPs."""
    from .. import sim
    flops = [max(layer.flops, 1.0) for layer in net.layers]
    share = [f / sum(flops) for f in flops]
    return sim.Measured(tuple(forward_s * x for x in share), tuple(backward_s * x for x in share),
                        update_s, batch, net.params, source=f"measured at batch {batch}")


def costs_from_pipeline(net, timelines: dict, batch: int, stages: int):
    """``sim.Measured`` per-layer costs from measured pipeline runs (lab 04).

    timelines: {micro-batches m: Timeline} of runs of ``net`` over ``stages`` stages (rank
    s is stage s), two m or more. A micro-batch of batch / m samples passes every stage
    once, so the sum of the stages' median F<i> (B<i>) spans is the whole network's
    forward (backward) for it. A straight line through those sums against the
    micro-batch size gives the fixed part (its intercept, shared equally by the layers'
    passes) and the part that grows with the rows, shared by the layers' FLOPs
    (``Measured.from_timeline``'s rule): lab 04's first layer, with 64 inputs, does a
    sixth of a 384-wide layer's arithmetic, and shared equally it was priced as one.
    The update: the median "update" span, on each stage's share of the parameters.
    """
    import statistics

    import numpy as np

    from .. import sim
    from ..pipeline import pass_kind
    from .costs import _layer_weights
    sizes, fwd, bwd = [], [], []
    for m, tl in sorted(timelines.items()):
        per_stage = {k: [statistics.median(s.duration for s in tl.spans if s.rank == r
                                           and pass_kind(s.name) == k)
                         for r in range(stages)] for k in "FB"}
        sizes.append(batch / m)
        fwd.append(sum(per_stage["F"]))
        bwd.append(sum(per_stage["B"]))
    n = len(net)
    (sf, af), (sb, ab) = np.polyfit(sizes, fwd, 1), np.polyfit(sizes, bwd, 1)
    fixed = max((af + ab) / (2 * n), 0.0)
    ref = max(sizes)
    weights = _layer_weights(net, None, int(ref))
    share = [w / sum(weights) for w in weights]
    update = statistics.median(s.duration for tl in timelines.values() for s in tl.spans
                               if s.name == "update") * stages
    return sim.Measured(tuple(fixed + max(sf, 0) * ref * w for w in share),
                        tuple(fixed + max(sb, 0) * ref * w for w in share),
                        update, int(ref), net.params, fixed,
                        source=f"measured with {', '.join(map(str, sorted(timelines)))} micro-batches")
