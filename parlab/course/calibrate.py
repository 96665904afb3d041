"""Calibrating the cost model on this machine in one launch (``measure_this_machine``)."""
from __future__ import annotations

from ..launcher import launch
from ..torch.calibrate import (CALIBRATION_MESSAGES, HELD_COMPUTE_S, LONG_BLOCK_S,
                               SHORT_BLOCK_S, calibration_ranks)


def measure_this_machine(sizes=(64, 256, 256, 128, 10), *, batches=(32, 128), fit_batches=None,
                         steps: int = 15, messages=CALIBRATION_MESSAGES, devices: int = 4,
                         timeout: float = 300.0) -> dict:
    """Calibrate the cost model here, in one launch of two ranks (PREDICTIONS follow from it).

    Measures lab 00's link (one message, and an all-reduce of two ranks, per size in
    ``messages``), how late a rank that blocked on a message resumes (the cluster's
    ``wake_latency_s``, after a 20 ms block, and ``wake_curve``, after a short one and that:
    on a busy CPU the scheduler must give it a core back) and lab 01's step of the MLP
    ``sizes`` at each batch size, back to back and between messages, with what a pass's call
    costs whatever its layers (``Measured.call_s``, timed on a one-layer network), and what
    a DDP bucket's all-reduce costs its rank before it starts and after it ends
    (``handoff_s``), what DDP's wrapper adds to a step's passes (``ddp_wrapper_s``), and
    what lab 03's operators cost around each collective inside a pass (``tp_operator_s``),
    and how often a pinned rank's isend waited for its compute (``held_send_share``).
    Returns {"cluster": a ``sim.Cluster`` of ``devices`` simulated devices
    sharing this machine's cores, with the measured link and collective overhead
    (``sim.measured_link``: medians) and how far each measured message strayed from them
    (``sim.calibrate.spread_from_records``), "costs": ``sim.Measured`` per-layer costs of
    the step run back to back (lab 01), "costs_between_messages": the same timed as a rank
    of a distributed step computes, after a blocking message (use these for two ranks or
    more: timed on both ranks, pooled), both fitted on ``fit_batches`` (default: all
    ``batches``), "timelines": {batch: the measured single-device steps, back to back},
    "timelines_between_messages" (the same, between messages, both ranks' spans as rank
    0's), "links": the sweep's records}.
    """
    import os
    import statistics
    from dataclasses import replace

    from .. import sim
    from ..trace import Timeline
    batches = tuple(batches)
    res = launch(calibration_ranks, 2, args=(tuple(sizes), batches, steps, tuple(messages)),
                 timeout=timeout)
    names = ("forward", "backward", "update")
    phases = {r: [s for s in res.timeline if s.rank == r and s.name in names] for r in (0, 1)}
    per_run = 3 * steps * len(batches)

    def by_batch(*runs) -> dict:
        """{batch: Timeline}: three phases a step, the batch sizes taking turns step by
        step (calibration_steps); each run's spans in turn (rank 0's, then rank 1's,
        counted as rank 0's: pooled)."""
        return {b: Timeline([replace(s, rank=0) for run in runs
                             for i, s in enumerate(run) if i // 3 % len(batches) == k])
                for k, b in enumerate(batches)}
    # back to back: rank 0 alone; between messages: both ranks computed (calibration_steps)
    timelines = by_batch(phases[0][:per_run])
    woken = by_batch(phases[0][per_run:], phases[1])
    # the tiny network's passes, "call forward" ...: what each call costs (Measured.call_s)
    calls = {r: [replace(s, rank=0, name=s.name[len("call "):]) for s in res.timeline
                 if s.rank == r and s.name in {"call " + n for n in names}] for r in (0, 1)}
    calls_alone = Timeline(calls[0][:3 * steps])
    calls_woken = Timeline(calls[0][3 * steps:] + calls[1])
    net = sim.Network.mlp(sizes)
    fit = tuple(fit_batches or batches)
    costs = sim.Measured.from_timeline({b: timelines[b] for b in fit}, net, skip=2,
                                       calls=calls_alone)
    between = sim.Measured.from_timeline({b: woken[b] for b in fit}, net, skip=2,
                                         calls=calls_woken)
    records = res.results[0]["links"]
    by_op = {op: {r["bytes"]: r["seconds"] for r in records if r["op"] == op}
             for op in ("send_recv", "all_reduce")}
    link, overhead = sim.measured_link(by_op["send_recv"], by_op["all_reduce"])
    # each message's stray from that price, so that predictions meet the slow ones too
    p2p_spread, collective_spread = sim.calibrate.spread_from_records(records, link, overhead)

    def late_beyond_the_message(key: str) -> float:
        late = [b - a for a, b in zip(res.results[0][key], res.results[1][key])]
        return max(statistics.median(late) - link.time(8), 0.0)
    wake = late_beyond_the_message("wake")
    curve = ((SHORT_BLOCK_S, late_beyond_the_message("wake_short")), (LONG_BLOCK_S, wake))
    held = held_share(res.results[0]["held"])
    handoff = bucket_handoff(res.timeline, lane=2)     # rank 0's lane: world size + rank
    wrapper = ddp_wrapper(res.timeline)
    operators = tp_operator(res.timeline)
    flops = flop_rate(costs, net, max(fit))
    cluster = sim.Cluster("this machine (measured)", devices, 8e9, flops, costs.fixed_s, devices,
                          link, link, overhead, wake_latency_s=wake, wake_curve=curve,
                          handoff_s=handoff, held_send_share=held, ddp_wrapper_s=wrapper,
                          tp_operator_s=operators,
                          cores=os.cpu_count() or 1,
                          message_spread_s=p2p_spread, collective_spread_s=collective_spread)
    return {"cluster": cluster, "costs": costs, "costs_between_messages": between,
            "timelines": timelines, "timelines_between_messages": woken, "links": records}


def flop_rate(costs, net, batch: int) -> float:
    """FLOP/s of this machine's core: a pass's FLOPs (forward + backward = 3x forward,
    Kaplan et al. 2020) over what its layers cost. A tiny network's layers can fit to no
    time at all beside a busy core (its passes are nearly all call, ``Measured.call_s``);
    then the whole pass, call included, prices them: a lower bound on the rate, and a
    finite one."""
    layers_s = sum(costs.forward_s(i, batch) + costs.backward_s(i, batch) for i in range(len(net)))
    if layers_s <= 0:
        layers_s = layers_s + costs.call_s[0] + costs.call_s[1]
    if layers_s <= 0:
        raise RuntimeError("the calibration measured no time in the forward and backward "
                           "passes: run it with a wider network or larger batches")
    return 3 * batch * sum(layer.flops for layer in net.layers) / layers_s


def held_share(receives: list[float], compute_s: float = HELD_COMPUTE_S) -> float:
    """The share of ``torch.calibrate.held_sends``' receives that took over half the
    sender's compute after its post: their data left only once that compute ended (the
    rest took 0.1-0.3 ms here; a message's own time is far below half of 3 ms)."""
    if not receives:
        raise RuntimeError("the calibration measured no isend (held_sends): nothing to "
                           "measure the held share from")
    return sum(r > compute_s / 2 for r in receives) / len(receives)


def bucket_handoff(timeline, lane: int) -> tuple[float, float]:
    """(before, after): the medians, over rank 0's steps of ``bucket_handoffs``, of how
    long after its last gradient its bucket's all-reduce was posted on ``lane``, and how
    long after the all-reduce ended ``backward()`` returned.

    Posted, not started: the timeline splits the lane's span into waiting for the peer,
    then transferring (``trace.split_waits``), and the engine adds that wait itself (a
    wake-up at a collective's start). Read to the transfer, "before" held the peer's
    lateness too: 0.07-1.27 ms in five calibrations, where lab 05's DDP launches between
    them posted 0.05-0.07 ms after the last gradient (medians, both ranks, 2026-11-26).
    """
    import statistics

    from ..trace import COMM, WAIT
    reduces = [s for s in timeline if s.rank == lane and s.kind in (WAIT, COMM)
               and s.name.startswith("bucket all_reduce")]
    before, after = [], []
    for wait in (s for s in timeline if s.rank == 0 and s.name == "handoff wait"):
        inside = [r for r in reduces if wait.start <= r.start and r.end <= wait.end]
        if inside:
            before.append(min(r.start for r in inside) - wait.start)
            after.append(wait.end - max(r.end for r in inside))
    if not before:
        raise RuntimeError("the calibration's DDP steps left no bucket all-reduce inside "
                           "their wait: nothing to measure the hand-off from")
    return statistics.median(before), statistics.median(after)


def ddp_wrapper(timeline) -> tuple[float, float]:
    """(forward, backward): what DDP's wrapper adds to a step's forward and backward
    passes, from ``bucket_handoffs``' steps on both ranks: the median DDP forward less the
    median plain forward of the same MLP, taking turns with it; the median backward until
    the last gradient is ready ("handoff backward": DDP's hooks mark each gradient ready
    and copy it into its bucket) less the median plain backward. Never below nothing: a
    cost the noise hides is none."""
    import statistics

    def median(name: str) -> float:
        times = [s.duration for s in timeline if s.rank in (0, 1) and s.name == name]
        if not times:
            raise RuntimeError(f"the calibration's DDP steps left no {name!r} spans: nothing "
                               "to measure DDP's wrapper from")
        return statistics.median(times)
    return (max(median("ddp forward") - median("plain forward"), 0.0),
            max(median("handoff backward") - median("plain backward"), 0.0))


def tp_operator(timeline, skip: int = 2) -> float:
    """What a collective inside a pass costs its rank beyond the collective itself, from
    ``tp_operators``' steps on both ranks: the median sliced step (forward start to
    backward end) less its all-reduces' spans (waiting, transferring, waiting for a core),
    less the median unsliced step, over its two collectives. Never below nothing.

    A step ends where its backward did before the timeline carved the backward's own wait
    for a core off its end (``core_waits.carve``): cut there, the backward's last
    all-reduce could end past the step and stay in it, and the two steps would keep
    different shares of their waits."""
    import statistics

    from ..core_waits import waiting_name

    def steps(rank: int, name: str) -> list[float]:
        spans = [s for s in timeline if s.rank == rank]
        forwards = sorted((s for s in spans if s.name == f"{name} forward"), key=lambda s: s.start)
        backwards = sorted((s for s in spans if s.name == f"{name} backward"),
                           key=lambda s: s.start)
        if not forwards:
            raise RuntimeError(f"the calibration left no {name!r} steps on rank {rank}: nothing "
                               "to measure tensor parallelism's operators from")
        carved = {s.start: s.end for s in spans if s.name == waiting_name(f"{name} backward")}
        collectives = [s for s in spans if s.name.startswith("all_reduce")
                       and s.start >= forwards[0].start]        # none in an unsliced step
        pairs = list(zip(forwards, backwards))
        out = []
        for f, b in pairs[skip:] if len(pairs) > skip else pairs:
            end = carved.get(b.end, b.end)
            out.append((end - f.start) - sum(c.duration for c in collectives
                                             if f.start <= c.start and c.end <= end))
        return out
    sliced = [t for r in (0, 1) for t in steps(r, "sliced")]
    unsliced = [t for r in (0, 1) for t in steps(r, "unsliced")]
    return max((statistics.median(sliced) - statistics.median(unsliced)) / 2, 0.0)
