"""Experiments the labs run: check the settings, start the ranks, return what was measured.

This module sits above the strategies (``parlab.torch.*``, ``parlab.tf.*``) and the
launcher: a strategy module only says what one rank does, and never starts processes
itself. A notebook calls one function here instead of validating and launching by hand.
"""
from __future__ import annotations

from .launcher import LaunchResult, launch


def run_pipeline(cfg, stages: int, micro_batches: int, schedule="1f1b", *,
                 timeout: float = 120.0, devices=None) -> LaunchResult:
    """A micro-batch pipeline of ``stages`` ranks: validated first, then launched.

    schedule: "gpipe", "1f1b" or explicit per-stage lists of ("F" | "B", i). A batch
    that does not divide into the micro-batches, a schedule that deadlocks or more stages
    than layers are refused before any rank starts.
    """
    from .torch import pipeline
    cfg, ops = pipeline.prepare(cfg, stages, micro_batches, schedule)
    return launch(pipeline.train_pipeline, stages, args=(cfg, micro_batches, ops),
                  timeout=timeout, devices=devices)
