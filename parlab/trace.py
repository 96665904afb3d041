"""Measured spans per device, merged onto one clock.

Every bar a parlab timeline draws is a :class:`Span` that was measured on a rank: a
compute span (``with parlab.span("forward"):``), a communication span (recorded by
``parlab.torch.comm`` around each send, receive and collective) or an explicit wait.
Idle time is never recorded: it is what is left between spans.

A blocking receive or collective starts when the rank arrives, not when the data can
move: until its peer arrives, the rank is waiting. Each traced operation carries a match
key, so a timeline finds the same operation on every rank and splits each span into the
part spent waiting for the last peer to arrive and the part spent transferring (see
``split_waits``). All ranks' spans are on one clock, which makes this a subtraction.
Where ranks outnumber cores, a rank can also be ready to run and get no core: each span
measures that time (Linux's run-queue delay) and a timeline draws it as ``core_wait``.

Where things live: ``spans`` (the kinds of time and ``Span``), ``recorders`` (the
``Recorder`` of a rank and ``parlab.span``), ``core_waits`` (the run-queue counter and
its carving), ``timeline`` (``Timeline``, the wait split, summaries). This module
gathers their names, as the rest of parlab and the labs use them.

This module imports neither torch nor tensorflow. The framework runtime installs a
timer on the process's :class:`Recorder` (CUDA events on a GPU) and a clock offset that
maps this rank's clock onto rank 0's; everything else is plain Python.
"""
from __future__ import annotations

from .recorders import (HostTimer, Recorder, disabled, install, recorder,  # noqa: F401
                        recording, span)
from .spans import COMM, COMPUTE, CORE_WAIT, IDLE, KINDS, LANE_KINDS, WAIT, Span  # noqa: F401
from .timeline import Segment, Summary, Timeline, split_waits  # noqa: F401
