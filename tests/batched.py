"""Several rank functions in one launch: starting ranks costs more than most of the runs.

``launch_each({key: (fn, args)}, world_size)`` runs every ``fn(rank, world_size, *args)``
in turn on the same ranks of one launch and gives, per key, what a launch of that call
alone would: ``.results`` in rank order and ``.timeline`` (that call's spans only). Each
strategy seeds its own model and data, so running after another changes nothing (the
equivalence tests would say so). One failing call fails the launch, naming its rank.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import parlab
from parlab.trace import Span, Timeline


def run_each(rank, world_size, calls):
    """On every rank: each call in turn, with the spans it recorded."""
    from parlab import trace
    rec = trace.recorder()
    out = []
    for fn, args in calls:
        before = len(rec.spans())
        result = fn(rank, world_size, *args)
        spans = [dataclasses.astuple(s) for s in rec.spans()[before:]]
        out.append({"result": result, "spans": spans})
    return out


@dataclass
class Run:
    results: list
    timeline: Timeline


def launch_each(calls: dict, world_size: int, timeout: float = 300) -> dict:
    keys = list(calls)
    out = parlab.launch(run_each, world_size, args=([calls[k] for k in keys],),
                        timeout=timeout)
    runs = {}
    for i, key in enumerate(keys):
        spans = [Span(*t) for r in out.results for t in r[i]["spans"]]
        runs[key] = Run([r[i]["result"] for r in out.results],
                        Timeline(spans, out.timeline.labels, range(world_size)))
    return runs


def launch_by_size(calls: dict) -> dict:
    """``{world_size: {key: (fn, args)}}``: one launch per world size, every key's Run in
    one dict (keys are unique across sizes); no rank may outlive the launches."""
    from conftest import rank_processes
    runs = {}
    for world_size, sized in calls.items():
        runs.update(launch_each(sized, world_size))
    assert not rank_processes(), "ranks left running"
    return runs
