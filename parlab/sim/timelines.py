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
    tensor_parallel(net, cluster, batch, devices=2, scheme="column_row" | "naive")   lab 03
    pipeline(net, cluster, batch, stages=2, micro_batches=4,
             schedule="gpipe" | "1f1b" | "interleaved", chunks=2)  lab 04
    data_parallel(net, cluster, batch, devices=2, buckets=1, overlap=True)   lab 05
    parameter_server(net, cluster, batch, workers=2, mode="sync" | "async",
                     slow={worker: factor})                in sim.servers, lab 06
    hybrid(net, cluster, batch, dp=2, tp=1, pp=1, micro_batches=4)   lab 07

Ranks are laid out as in ``parlab.mesh`` (dp outermost, then pp, then tp fastest), and
each axis uses the cluster's fast link when its groups fit in one node.
"""
from __future__ import annotations

from ..errors import counted
from .costs import Network
from .engine import PredictedTimeline
from .model import Cluster
from .program import (SCHEDULES, all_gather_s, costs_for, notes_for, programs,  # noqa: F401
                      run_programs)

SCHEMES = ("column_row", "naive")


# ------------------------------------------------------------------ checks


# ------------------------------------------------------------------ collectives' seconds


# ------------------------------------------------------------------ the mesh


# ------------------------------------------------------------------ one stage's passes


# ------------------------------------------------------------------ data parallel gradients


# ------------------------------------------------------------------ the programs


# ------------------------------------------------------------------ the strategies
def single_device(net: Network, cluster: Cluster, batch: int, *, steps: int = 1,
                  costs=None) -> PredictedTimeline:
    """Lab 01: forward, backward and update of the whole batch on one device."""
    batch, steps = counted(batch, "batch"), counted(steps, "steps")
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, steps=steps)
    return run_programs(progs, mesh, steps, notes_for("single device", net, cluster, costs))


def manual_split(net: Network, cluster: Cluster, batch: int, *, devices: int = 2,
                 bounds=None, steps: int = 1, costs=None) -> PredictedTimeline:
    """Lab 02: layers ``bounds[k-1]:bounds[k]`` on device k (default: balanced by cost);
    the activation is sent on (blocking), the gradient sent back; one device works at a time."""
    batch, steps, devices = counted(batch, "batch"), counted(steps, "steps"), counted(devices, "devices")
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, pp=devices, bounds=bounds,
                            steps=steps, blocking=True)
    return run_programs(progs, mesh, steps, notes_for(f"manual split over {devices}", net, cluster, costs))


def tensor_parallel(net: Network, cluster: Cluster, batch: int, *, devices: int = 2,
                    scheme: str = "column_row", steps: int = 1, costs=None) -> PredictedTimeline:
    """Lab 03: every layer's neurons sliced over ``devices``; the whole batch on each.

    naive: every layer column-parallel, its output all-gathered and its input's
    gradient all-reduced. column_row: Megatron-LM's pairs (Shoeybi et al., 2019): one
    all-reduce per pair forward, one per pair backward (none for the first pair's input).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    batch, steps, devices = counted(batch, "batch"), counted(steps, "steps"), counted(devices, "devices")
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, tp=devices, scheme=scheme, steps=steps)
    return run_programs(progs, mesh, steps, notes_for(f"tensor parallel ({scheme}) over {devices}", net,
                                           cluster, costs))


def pipeline(net: Network, cluster: Cluster, batch: int, *, stages: int = 2,
             micro_batches: int = 4, schedule: str = "1f1b", chunks: int = 2, bounds=None,
             steps: int = 1, costs=None) -> PredictedTimeline:
    """Lab 04: a micro-batch pipeline (GPipe, 1F1B, or interleaved 1F1B with ``chunks``
    model chunks per device). Sends are non-blocking (``isend``), as in the course's
    pipeline; spans are named F<i> and B<i>; the bubble is the stages' idle share."""
    batch, steps = counted(batch, "batch"), counted(steps, "steps")
    stages, micro_batches = counted(stages, "stages"), counted(micro_batches, "micro_batches")
    chunks = counted(chunks, "chunks") if schedule == "interleaved" else 1
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, pp=stages, micro_batches=micro_batches,
                            schedule=schedule, chunks=chunks, bounds=bounds, steps=steps,
                            phase_names=None if micro_batches > 1 else ("F0", "B0"))
    return run_programs(progs, mesh, steps, notes_for(f"pipeline {schedule}, {stages} stages, "
                                           f"{micro_batches} micro-batches", net, cluster, costs))


def data_parallel(net: Network, cluster: Cluster, batch: int, *, devices: int = 2,
                  buckets=1, overlap: bool = True, steps: int = 1,
                  costs=None) -> PredictedTimeline:
    """Lab 05: each replica on batch / devices, gradients averaged by ring all-reduce.

    buckets: how many all-reduces (layers grouped last first, as DDP does), or
    "per_tensor". overlap: each bucket's all-reduce runs on a second lane ("rank r
    buckets") while the backward goes on, the update waits for them; without it they
    follow the backward.
    """
    batch, steps, devices = counted(batch, "batch"), counted(steps, "steps"), counted(devices, "devices")
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, dp=devices, buckets=buckets,
                            overlap=overlap, steps=steps)
    how = f"{buckets} bucket(s), {'overlapped' if overlap else 'after the backward'}"
    return run_programs(progs, mesh, steps, notes_for(f"data parallel over {devices}, {how}", net, cluster,
                                           costs), background=overlap and devices > 1)


def hybrid(net: Network, cluster: Cluster, batch: int, *, dp: int = 2, tp: int = 1, pp: int = 1,
           micro_batches: int = 4, schedule: str = "1f1b", scheme: str = "column_row",
           buckets=1, overlap: bool = False, bounds=None, steps: int = 1,
           costs=None) -> PredictedTimeline:
    """Lab 07: data parallel over replicas that each split the model (dp × tp, dp × pp).

    The replica runs tensor parallel or a pipeline (cut at ``bounds``, default balanced);
    then its gradients are averaged over the dp line, in one bucket after the backward
    (lab 07's ``bucket=True``)."""
    batch, steps = counted(batch, "batch"), counted(steps, "steps")
    dp, tp, pp = counted(dp, "dp"), counted(tp, "tp"), counted(pp, "pp")
    m = counted(micro_batches, "micro_batches") if pp > 1 else 1
    costs = costs_for(net, cluster, costs)
    progs, mesh = programs(net, cluster, costs, batch, dp=dp, tp=tp, pp=pp, micro_batches=m,
                            schedule=schedule, scheme=scheme, buckets=buckets, overlap=overlap,
                            bounds=bounds, steps=steps,
                            phase_names=("F0", "B0") if pp > 1 and m == 1 else None)
    shape = " × ".join(f"{a} {n}" for a, n in (("dp", dp), ("pp", pp), ("tp", tp)) if n > 1)
    return run_programs(progs, mesh, steps, notes_for(f"hybrid {shape or 'one device'}", net, cluster,
                                           costs), background=overlap and dp > 1)
