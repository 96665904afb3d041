"""How large a timeline the event engine draws, and how many layers a network may have.

The engine steps through every rank's operations in time order, and each event looks at
every rank: 10,000 data-parallel ranks took 25-60 s and about 4 GB, a million exhausted
memory, and a million steps ran past a minute. A timeline is meant to be read, lane by
lane: it draws at most ``MAX_RANKS`` ranks and ``MAX_OPERATIONS`` operations (a few
seconds at the engine's 20,000-50,000 operations a second). Runs of thousands of GPUs
are what the summary model is for (``sim.predict``: one number per part of the step,
in milliseconds whatever the size). Every model walks a network layer by layer, so a
``Network`` holds at most ``MAX_LAYERS`` (the deepest real networks have a few thousand;
a transformer's block is one layer).
"""
from __future__ import annotations

MAX_RANKS = 64
MAX_OPERATIONS = 100_000
MAX_LAYERS = 10_000

SUMMARY = ("for a larger run use the summary model, sim.predict(sim.Workload.of(net), "
           "cluster, sim.Plan(dp=, tp=, pp=, micro_batches=), batch)")


def ranks(strategy: str, what: str, n: int) -> int:
    """``n`` ranks, or a ValueError naming ``what`` (the strategy's argument) and the limit."""
    if n > MAX_RANKS:
        raise ValueError(f"{strategy}: {what} makes {n:,} ranks; a timeline draws at most "
                         f"{MAX_RANKS} (one lane each): use {MAX_RANKS} or fewer, or {SUMMARY}")
    return n


def operations(strategy: str, n: int, sizes: str) -> int:
    """``n`` operations the engine would run (at least), or a ValueError naming ``sizes``
    (the arguments that multiply to it) and the limit."""
    if n > MAX_OPERATIONS:
        raise ValueError(f"{strategy}: {sizes} make at least {n:,} operations; a timeline "
                         f"runs at most {MAX_OPERATIONS:,} (20,000-50,000 a second): use fewer "
                         f"steps or micro_batches, or a network of fewer layers, or {SUMMARY}")
    return n


def layers(owner: str, what: str, n: int) -> int:
    """``n`` layers, or a ValueError naming ``what`` (the argument that gives them)."""
    if n > MAX_LAYERS:
        raise ValueError(f"{owner}: {what} gives {n:,} layers; the cost model walks every "
                         f"layer and takes at most {MAX_LAYERS:,}: merge layers (a "
                         f"transformer's block is one layer), or give sim.predict a "
                         f"sim.Workload of numbers (its layers is only a count there)")
    return n
