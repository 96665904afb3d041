"""Benchmarks: ratios measured within one run, printed against their targets.

``registry`` (the ``@benchmark`` decorator and ``run``) is imported by each module listed
here; importing the package registers them all: ``labs`` (tracing overhead, launch
start-up, the GPU, one benchmark per lab), ``core_waits`` (a receiver's wait for a core
beside busy ranks against the pair alone), ``sim`` (the cost model against this
machine and against published runs), ``replay`` (the replay against measurements) and
``two_nodes`` (a slow link measured between two network namespaces, lab 14).
"""
from __future__ import annotations

from . import core_waits, labs, replay, sim, two_nodes  # noqa: F401 - importing registers them
from .registry import BENCHMARKS, benchmark, run  # noqa: F401
