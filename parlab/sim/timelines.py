"""Predicted timelines for every strategy of the course, in the measured Timeline type.

Each function writes what every rank's code does in a training step (see ``engine``),
with the seconds of the cost model, and runs it on paper. The result is a
``PredictedTimeline``: the same spans (compute, transfer, wait) and the same span
names as the measured runs ("forward", "backward", "update"; "F3"/"B3" in pipelines),
so ``plot.timeline`` and ``Timeline.summary()`` work on both, and a prediction sits
beside its measurement. Every one takes:

    net      a ``Network`` (``Network.mlp(sizes)``, ``Network.transformer(...)``)
    cluster  a ``Cluster`` (its links, and its rates when ``costs`` is not given)
    batch    the global batch of one step (samples, or sequences)
    steps    how many identical steps to run (default 1)
    costs    where the seconds of a layer's pass come from: ``Roofline(net, cluster)``
             (the default) or ``Measured`` (e.g. ``Measured.from_timeline``)

Strategies (``sim.timeline(name, ...)`` dispatches by name, see ``sim.strategies``):

    single_device(net, cluster, batch)
    manual_split(net, cluster, batch, devices=2, bounds=None)       lab 02
    tensor_parallel(net, cluster, batch, devices=2, scheme="column_row" | "naive",
                    sequence_parallel=False)                         lab 03
    pipeline(net, cluster, batch, stages=2, micro_batches=4,
             schedule="gpipe" | "1f1b" | "interleaved" | "pipedream" | "zb-h1" |
             "dualpipev", chunks=2)                                  lab 04, lab 12
    data_parallel(net, cluster, batch, devices=2, buckets=1, overlap=True,
                  zero=0 | 1 | 2 | 3)                               lab 05 (ZeRO, FSDP: lab 08)
    parameter_server(net, cluster, batch, workers=2, mode="sync" | "async",
                     slow={worker: factor})                in sim.servers, lab 06
    hybrid(net, cluster, batch, dp=2, tp=1, pp=1, micro_batches=None,
           schedule="1f1b" | "gpipe" | "interleaved" | "zb-h1" | "dualpipev", chunks=2,
           zero=0, sequence_parallel=False)                          lab 07

``recompute=None | "selective" | "full"`` (activation recomputation, Korthikanti et
al., 2022) is accepted by every one but the parameter server (``net.trained(...)``
sets it, with sequence parallelism, on the network itself).

Ranks are laid out as in ``parlab.mesh`` (dp outermost, then pp, then tp fastest), and
each axis uses the cluster's fast link when its groups fit in one node.
"""
from __future__ import annotations

from ..errors import counted
from . import limits
from .blocks import check_expert_parallel, is_block
from .costs import Network
from .engine import PredictedTimeline
from .model import Cluster
from .program import (CHUNKED, SCHEDULES, all_gather_s, costs_for, notes_for,  # noqa: F401
                      programs, run_programs)

SCHEMES = ("column_row", "naive")


# ------------------------------------------------------------------ the strategies
def _trained(net: Network, recompute=None, sequence_parallel=False) -> Network:
    """The network with the strategy's training options (its own, where none are given)."""
    if recompute is None and not sequence_parallel:
        return net
    return net.trained(recompute=recompute or net.recompute,
                       sequence_parallel=sequence_parallel or net.sequence_parallel)


def single_device(net: Network, cluster: Cluster, batch: int, *, micro_batches: int = 1,
                  recompute=None, steps: int = 1, costs=None) -> PredictedTimeline:
    """Lab 01: forward, backward and update of the whole batch on one device (in
    ``micro_batches`` passes whose gradients add up, when given)."""
    batch, steps = counted(batch, "batch"), counted(steps, "steps")
    net = _trained(net, recompute)
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, steps=steps,
                           micro_batches=counted(micro_batches, "micro_batches"))
    return run_programs(progs, mesh, steps, notes_for("single device", net, cluster, costs))


def manual_split(net: Network, cluster: Cluster, batch: int, *, devices: int = 2,
                 bounds=None, steps: int = 1, costs=None) -> PredictedTimeline:
    """Lab 02: layers ``bounds[k-1]:bounds[k]`` on device k (default: balanced by cost);
    the activation is sent on (blocking), the gradient sent back; one device works at a time."""
    batch, steps, devices = counted(batch, "batch"), counted(steps, "steps"), counted(devices, "devices")
    limits.ranks("manual_split", "devices", devices)
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, pp=devices, bounds=bounds,
                            steps=steps, blocking=True)
    return run_programs(progs, mesh, steps, notes_for(f"manual split over {devices}", net, cluster, costs))


def tensor_parallel(net: Network, cluster: Cluster, batch: int, *, devices: int = 2,
                    scheme: str = "column_row", sequence_parallel: bool = False,
                    recompute=None, steps: int = 1, costs=None) -> PredictedTimeline:
    """Lab 03: every layer's neurons sliced over ``devices``; the whole batch on each.

    naive: every layer column-parallel, its output all-gathered and its input's
    gradient all-reduced. column_row: Megatron-LM's pairs (Shoeybi et al., 2019): one
    all-reduce per pair forward, one per pair backward (none for the first pair's input).
    sequence_parallel: a block's all-reduces become reduce-scatters and all-gathers and
    the ranks split the work they repeated (Korthikanti et al., 2022).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    batch, steps, devices = counted(batch, "batch"), counted(steps, "steps"), counted(devices, "devices")
    limits.ranks("tensor_parallel", "devices", devices)
    net = _trained(net, recompute, sequence_parallel)
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, tp=devices, scheme=scheme, steps=steps)
    return run_programs(progs, mesh, steps, notes_for(f"tensor parallel ({scheme}) over {devices}", net,
                                           cluster, costs))


def pipeline(net: Network, cluster: Cluster, batch: int, *, stages: int = 2,
             micro_batches: int = 4, schedule: str = "1f1b", chunks: int = 2, bounds=None,
             recompute=None, steps: int = 1, costs=None) -> PredictedTimeline:
    """Lab 04: a micro-batch pipeline (GPipe, 1F1B, interleaved 1F1B with ``chunks``
    model chunks per device, or PipeDream: 1F1B that never flushes, the micro-batches of
    all ``steps`` in one stream, each stage updating after each m backward passes).
    Lab 12's: "zb-h1" (1F1B with each backward split into B, the input's gradient, and a
    later W, the weights', Qi et al., 2024) and "dualpipev" (2 chunks per device in a
    V, m >= 2 x stages; DeepSeek-V3, 2024); orders from ``parlab.pipeline_orders``.
    Sends are non-blocking (``isend``), as in the course's pipeline; spans are named F<i>,
    B<i> and W<i>; the bubble is the stages' idle share.
    recompute: GPipe re-materialises (Huang et al., 2019): its recomputation runs
    before the gradient arrives, in the cool-down's wait."""
    batch, steps = counted(batch, "batch"), counted(steps, "steps")
    stages, micro_batches = counted(stages, "stages"), counted(micro_batches, "micro_batches")
    limits.ranks("pipeline", "stages", stages)
    chunks = counted(chunks, "chunks") if schedule in CHUNKED else 1
    net = _trained(net, recompute)
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, pp=stages, micro_batches=micro_batches,
                            schedule=schedule, chunks=chunks, bounds=bounds, steps=steps,
                            phase_names=None if micro_batches > 1 else ("F0", "B0"))
    return run_programs(progs, mesh, steps, notes_for(f"pipeline {schedule}, {stages} stages, "
                                           f"{micro_batches} micro-batches", net, cluster, costs))


def data_parallel(net: Network, cluster: Cluster, batch: int, *, devices: int = 2,
                  buckets=1, overlap: bool = True, zero: int = 0, micro_batches: int = 1,
                  recompute=None, steps: int = 1, costs=None) -> PredictedTimeline:
    """Lab 05: each replica on batch / devices, gradients averaged by ring all-reduce.

    buckets: how many all-reduces (layers grouped last first, as DDP does), or
    "per_tensor". overlap: each bucket's all-reduce runs on a second lane ("rank r
    buckets") while the backward goes on, the update waits for them; without it they
    follow the backward. zero: 1 and 2 reduce-scatter the gradients and all-gather the
    updated parameters, 3 (FSDP) gathers each layer's parameters before its passes
    (``sim.sharding``). micro_batches: passes whose gradients add up before the exchange.
    """
    batch, steps, devices = counted(batch, "batch"), counted(steps, "steps"), counted(devices, "devices")
    limits.ranks("data_parallel", "devices", devices)
    net = _trained(net, recompute)
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, dp=devices, buckets=buckets,
                            overlap=overlap, steps=steps, zero=zero,
                            micro_batches=counted(micro_batches, "micro_batches"))
    how = f"{buckets} bucket(s), {'overlapped' if overlap else 'after the backward'}"
    what = f"ZeRO-{zero} " if zero else ""
    return run_programs(progs, mesh, steps, notes_for(f"{what}data parallel over {devices}, {how}",
                                                      net, cluster, costs),
                        background=overlap and devices > 1)


def hybrid(net: Network, cluster: Cluster, batch: int, *, dp: int = 2, tp: int = 1, pp: int = 1,
           micro_batches: int | None = None, schedule: str = "1f1b", chunks: int = 2,
           scheme: str = "column_row", buckets=1, overlap: bool = False, bounds=None,
           zero: int = 0, sequence_parallel: bool = False, recompute=None, steps: int = 1,
           costs=None, cp: int = 1, ep: int = 1) -> PredictedTimeline:
    """Lab 07: data parallel over replicas that each split the model (dp × tp × pp).

    The replica runs tensor parallel and/or a pipeline (cut at ``bounds``, default
    balanced; ``schedule="interleaved"``: ``chunks`` model chunks per device, with tp too,
    Narayanan et al., 2021; "zb-h1", "dualpipev": as ``pipeline``); then its gradients
    are averaged over the dp line, in one bucket after the backward (lab 07's
    ``bucket=True``; after the W where a backward is split), or sharded (``zero``).
    micro_batches: per replica and step (default: 4 with a pipeline, 1 without; without a
    pipeline they run one after another, their gradients adding up).
    cp: each sequence split over cp ranks just outside tp, ring attention's K/V passes in
    every block (lab 10; a network of ``blocks``, e.g. ``Network.llama``); ep: a mixture
    of experts' experts spread over ep of the dp × cp ranks, two all-to-alls a block and
    pass (lab 11; ``Network.llama(experts=, top_k=)``). Both as ``Stage`` writes them."""
    batch, steps = counted(batch, "batch"), counted(steps, "steps")
    dp, tp, pp = counted(dp, "dp"), counted(tp, "tp"), counted(pp, "pp")
    cp, ep = counted(cp, "cp"), counted(ep, "ep")
    _check_spread(net, cp, ep, zero)
    limits.ranks("hybrid", f"dp × tp × pp × cp = {dp} × {tp} × {pp} × {cp}" if cp > 1 else
                 f"dp × tp × pp = {dp} × {tp} × {pp}", dp * tp * pp * cp)
    m = counted(micro_batches, "micro_batches") if micro_batches is not None else (
        4 if pp > 1 else 1)
    chunks = counted(chunks, "chunks") if schedule in CHUNKED else 1
    net = _trained(net, recompute, sequence_parallel)
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, dp=dp, tp=tp, pp=pp, micro_batches=m,
                            schedule=schedule, chunks=chunks, scheme=scheme, buckets=buckets,
                            overlap=overlap, bounds=bounds, steps=steps, zero=zero,
                            phase_names=("F0", "B0") if pp > 1 and m == 1 else None, cp=cp, ep=ep)
    shape = " × ".join(f"{a} {n}" for a, n in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp),
                                               ("ep", ep)) if n > 1)
    return run_programs(progs, mesh, steps, notes_for(f"hybrid {shape or 'one device'}", net, cluster,
                                           costs), background=overlap and dp > 1)


def _check_spread(net: Network, cp: int, ep: int, zero: int) -> None:
    """What context and expert parallelism need of the network, refused by name."""
    if cp > 1 and not any(is_block(x) for x in net.layers):
        raise ValueError(f"cp={cp} splits the sequences of transformer blocks; {net.name} has "
                         "none: build it with Network.llama or Network.decoder, or use cp=1")
    if ep > 1 and not any(x.routed_elems for x in net.layers):
        raise ValueError(f"ep={ep} spreads a mixture of experts; {net.name} has no expert "
                         "layer: build it with Network.llama(..., experts=, top_k=), or use ep=1")
    check_expert_parallel(net, ep, "hybrid")
    if ep > 1 and zero:
        raise ValueError(f"zero={zero} with ep={ep}: the timeline shards dense states only; "
                         "use zero=0 here, or sim.predict(..., Plan(ep=...), zero=...) for "
                         "the step's parts")
