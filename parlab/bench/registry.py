"""The benchmarks' registry: each benchmark prints ratios measured within one run.

``python -m parlab bench`` runs them all; ``--only NAME`` one. A module of ``parlab.bench``
adds its own with ``@benchmark``. Timings on shared machines are noisy, so each
benchmark interleaves the variants it compares and reports medians; nothing here is
asserted in the test suite.
"""
from __future__ import annotations

import time
from typing import Callable

BENCHMARKS: dict[str, Callable[[], list[str]]] = {}


def benchmark(name: str):
    def register(fn):
        BENCHMARKS[name] = fn
        return fn
    return register


def run(only: str | None = None, quick: bool = False) -> int:
    names = [only] if only is not None else list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark {unknown[0]!r}; known: {', '.join(BENCHMARKS)}")
        return 2
    for name in names:
        print(f"== {name}")
        started = time.perf_counter()
        for line in BENCHMARKS[name](quick=quick):
            print(f"   {line}")
        print(f"   ({time.perf_counter() - started:.1f} s)")
    return 0
