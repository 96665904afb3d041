"""Recording spans on a rank: the process's Recorder, its timer, and ``parlab.span``.

The framework runtime installs a timer on the process's Recorder (CUDA events on a GPU)
and a clock offset that maps this rank's clock onto rank 0's.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from . import core_waits
from .spans import COMPUTE, KINDS, Span
from .timeline import Timeline


class HostTimer:
    """Host clock timestamps: right for CPU work, which is synchronous."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock

    def mark(self):
        return self.clock()

    def resolve(self, mark) -> float:
        return mark


class _SpanContext:
    """The hot path of tracing: two timer marks, two reads of the thread's counters (where
    the recorder measures them) and one list append per span.

    A plain class rather than a generator-based context manager: it costs about a
    third as much, and spans surround every operation of a training step.
    """

    __slots__ = ("rec", "kind", "name", "nbytes", "peer", "axis", "key", "start", "clock")

    def __init__(self, rec, kind, name, nbytes, peer, axis, key):
        self.rec, self.kind, self.name, self.nbytes, self.peer = rec, kind, name, nbytes, peer
        self.axis, self.key = axis, key

    def __enter__(self):
        if self.rec.core_waits:
            self.clock, self.start = core_waits.at_edge(self.rec.timer.mark, self._read)
        else:
            self.clock, self.start = None, self.rec.timer.mark()
        return self

    def _read(self, relist: bool = True):
        """(ran, waited) of this thread, and the wait this span carves: this thread's for
        compute, every thread's for communication (the library's threads move the bytes;
        the end reads the threads the start read)."""
        if self.kind == COMPUTE:
            return core_waits.read_wait()
        return core_waits.read_counters(relist)

    def _read_end(self):
        return self._read(relist=False)

    def __exit__(self, *exc):
        # The counters inside two reads of the clock, at both edges (core_waits.at_edge): a
        # thread that computes makes no system call and is often preempted at the next
        # one, the counters' read; the wait it brings must fall on the same side of the
        # counters and of the clock, or the replay would take it for work.
        rec = self.rec
        if self.clock is not None:
            after, end = core_waits.at_edge(rec.timer.mark, self._read_end)
        else:
            after, end = None, rec.timer.mark()
        waited, clock = 0.0, None
        if after is not None:
            clock = (*self.clock[:2], *after[:2])
            waited = after[2] - self.clock[2]
        rec._raw.append((self.kind, self.name, self.start, end, self.nbytes,
                         self.peer, None, self.axis, self.key, waited, clock))
        return False


class _NullContext:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL = _NullContext()


class Recorder:
    """Collects the spans of one process (one rank).

    ``offset`` is added to every timestamp so that ranks on different clocks line up
    (see ``parlab.torch.runtime.align_clocks``).
    """

    def __init__(self, rank: int = 0, timer=None):
        self.rank = rank
        self.timer = timer or HostTimer()
        self.offset = 0.0
        self.enabled = True
        self._raw: list[tuple] = []

    @property
    def core_waits(self) -> bool:
        """Whether spans read the thread's core-wait counter: host-clock spans only (a
        GPU's spans are timed on the device, where the host thread's waits are not theirs)."""
        return core_waits.MEASURED and type(self.timer) is HostTimer

    def span(self, name: str, kind: str = COMPUTE, bytes: int = 0, peer: int | None = None,
             axis: str | None = None, key: tuple | None = None):
        if not self.enabled:
            return _NULL
        if kind not in KINDS:
            raise ValueError(f"span kind must be one of {KINDS}, got {kind!r}")
        return _SpanContext(self, kind, name, bytes, peer, axis, key)

    def add(self, name: str, kind: str, start: float, end: float, bytes: int = 0, peer=None,
            lane: int | None = None, axis: str | None = None, key: tuple | None = None,
            core_wait_s: float = 0.0, clock: tuple | None = None):
        """Record an interval measured elsewhere (host-clock seconds on this rank).

        lane: draw it on another lane than this rank's, e.g. for work a background
        thread did while the rank's main thread went on (DDP's gradient all-reduce).
        core_wait_s: of the interval, the seconds the rank waited for a core, when the
        caller read ``core_waits.read_seconds`` at its ends (only if ``self.core_waits``).
        clock: the first two of the issuing thread's counters from ``core_waits.at_edge``
        at the start and at the end, concatenated (four numbers), where the caller read
        them: the replay's work.
        """
        self._raw.append((kind, name, ("host", start), ("host", end), int(bytes), peer, lane,
                          axis, key, core_wait_s, clock))

    def _resolve(self, mark) -> float:
        if isinstance(mark, tuple):
            return mark[1]
        return self.timer.resolve(mark)

    def spans(self) -> list[Span]:
        """All spans recorded so far, resolved to seconds on the merged clock."""
        return [
            Span(self.rank if lane is None else lane, kind, name, self._resolve(s) + self.offset,
                 self._resolve(e) + self.offset, nbytes, peer, axis, key, waited, clock,
                 None if lane is None else self.rank)
            for kind, name, s, e, nbytes, peer, lane, axis, key, waited, clock in self._raw
        ]

    def timeline(self, labels: dict[int, str] | None = None) -> "Timeline":
        return Timeline(self.spans(), labels)

    def clear(self) -> None:
        self._raw.clear()


_recorder: Recorder | None = None   # this process's, once a rank installs one


def recorder() -> Recorder:
    """This process's recorder (created on first use; a launched rank gets its own)."""
    global _recorder
    if _recorder is None:
        _recorder = Recorder(rank=0)
    return _recorder


def install(rec: Recorder) -> Recorder:
    """Make ``rec`` this process's recorder (the launcher does this on every rank)."""
    global _recorder
    _recorder = rec
    return rec


def span(name: str, kind: str = COMPUTE, bytes: int = 0, peer: int | None = None,
         axis: str | None = None, key: tuple | None = None):
    """Record the enclosed block as one span on this rank: ``with parlab.span("forward"):``."""
    return recorder().span(name, kind, bytes, peer, axis, key)


@contextlib.contextmanager
def recording(rank: int = 0, timer=None) -> Iterator[Recorder]:
    """Record spans in this process (e.g. a single-device lab) into a fresh recorder.

    >>> with parlab.recording() as rec:
    ...     with parlab.span("forward"): ...
    >>> rec.timeline()
    """
    global _recorder
    previous = _recorder
    rec = Recorder(rank, timer)
    _recorder = rec
    try:
        yield rec
    finally:
        _recorder = previous


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Turn span recording off for a block (used to measure the tracing overhead)."""
    rec = recorder()
    before = rec.enabled
    rec.enabled = False
    try:
        yield
    finally:
        rec.enabled = before
