"""Waiting for a CPU core: measured per thread, carved out of the spans that hid it.

When more ranks than cores share a machine (4 simulated devices on 2 cores), a rank whose
message has arrived, or whose next layer could start, may still wait milliseconds before
the scheduler gives it a core. Without a measurement that time shows up as "transfer" or
"compute". Linux counts it per thread: the second field of ``/proc/<pid>/task/<tid>/
schedstat`` is the time the thread spent runnable on a run queue, waiting to run, in
nanoseconds (kernel documentation, "scheduler statistics": ``run_delay``). The recorder
reads that counter, with the thread's CPU time, at the start and the end of every span it
records, between two reads of its clock (``read_own``, ``read_wait``, ``read_counters``,
``at_edge``); a timeline moves the difference out of the span into a ``core_wait`` span
(``carve``), and the replay (``parlab.sim.replay``) prices the span's work without it.
Where the files do not exist (macOS, Windows) nothing is read, and the kind never appears
(``MEASURED`` is False).

Whose threads: a compute span reads the calling thread (the ranks compute on one
thread). A communication span reads every thread of the process, added up: the calling
thread sleeps while the library's threads move the bytes (gloo's ``gloo_tcp_loop`` and
``pt_gloo_runloop``), and when they wait for a core, so does the message. Threads that
sleep add nothing; two threads waiting at once could add more than the span lasted,
so a span gives up at most its whole length.

The counter says how long, not when: the carved span is drawn at the end of the span it
came from, where a woken receiver waits for its core. The amount is measured; the place
within the span is a drawing choice.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from typing import Iterable

from .spans import CORE_WAIT, Span

SCHEDSTAT = "/proc/thread-self/schedstat"
TASKS = "/proc/self/task"
MEASURED = os.path.exists(SCHEDSTAT)


class _Files:
    """Open counter files, one per thread: a file reads the thread it was opened for."""

    def __init__(self):
        self.own = threading.local()          # the calling thread's file
        self.tasks: dict[str, int] = {}       # every thread of the process, by thread id
        self.links = 0                        # /proc/self/task's link count when listed

    def calling_thread(self) -> int:
        fd = getattr(self.own, "fd", None)
        if fd is None:
            fd = self.own.fd = os.open(SCHEDSTAT, os.O_RDONLY)
        return fd

    def every_thread(self) -> list[int]:
        return list(self.by_thread().values())

    def by_thread(self) -> dict[str, int]:
        """The files of every live thread, by thread id; relisted only when the thread
        count changed (a new process group starts threads of its own), which a stat tells
        cheaply."""
        links = os.stat(TASKS).st_nlink
        if links != self.links:
            live = set(os.listdir(TASKS))
            for tid in [t for t in self.tasks if t not in live]:
                os.close(self.tasks.pop(tid))
            for tid in live - set(self.tasks):
                try:
                    self.tasks[tid] = os.open(f"{TASKS}/{tid}/schedstat", os.O_RDONLY)
                except FileNotFoundError:     # the thread ended between list and open
                    pass
            self.links = links
        return self.tasks


_files = _Files()


def _forget_files() -> None:
    """A forked child must not read its parent's threads through inherited files."""
    global _files
    _files = _Files()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_files)


def _delay(fd: int) -> float:
    try:
        return int(os.pread(fd, 64, 0).split(b" ", 2)[1]) * 1e-9
    except (OSError, IndexError):            # a thread that ended: it waits no more
        return 0.0


def read_own() -> tuple[float, float, float] | None:
    """(seconds the calling thread has run on a core, seconds it has waited for one, the
    wait again, as ``read_counters`` gives it) so far; None where not measured.

    The first is ``time.thread_time()``: schedstat's own first field is brought up to date
    only when the kernel next accounts the running thread (a tick, a switch), so a read
    from the running thread lags by up to a tick. Between two reads, what is neither is
    time the thread slept by its own choice: in a blocking call, or ``time.sleep``.
    """
    if not MEASURED:
        return None
    _files.own.files = 1
    ran, waited = time.thread_time(), _delay(_files.calling_thread())
    return ran, waited, waited


def read_wait() -> tuple[None, float, float] | None:
    """(None, seconds the calling thread has waited for a core, the same): what a compute
    span reads at its edges, shaped as ``read_own`` (for the replay, and the span's own
    wait to carve). The replay prices work as wall time less this wait, so a compute span
    needs no CPU clock (a system call more at each edge); None where not measured."""
    if not MEASURED:
        return None
    _files.own.files = 1
    waited = _delay(_files.calling_thread())
    return None, waited, waited


def read_counters(relist: bool = True) -> tuple[float, float, float] | None:
    """``read_own()`` and ``read_seconds(every_thread=True)`` in one pass over the
    threads' files (a communication span reads both at each edge); None where not
    measured. ``relist=False`` reads the threads listed last time: a span's end reads
    the threads its start read, so that a thread started meanwhile does not add the
    wait of its whole life to the span."""
    if not MEASURED:
        return None
    own, total, mine = str(threading.get_native_id()), 0.0, None
    files = _files.by_thread() if relist else _files.tasks
    _files.own.files = len(files)
    for tid, fd in files.items():
        waited = _delay(fd)
        total += waited
        if tid == own:
            mine = waited
    if mine is None:                          # a thread started since the last listing
        mine = _delay(_files.calling_thread())
    return time.thread_time(), mine, total


# A preemption takes the thread off its core for a scheduler slice, hundreds of
# microseconds or more; a read takes a few microseconds a counter file.
EDGE_LIMIT_S = 50e-6
FILE_READ_S = 10e-6


def at_edge(clock, read=None):
    """(counters, time) at one edge of a span, agreeing with each other.

    ``read`` gives counters (ran, waited, wait to carve): ``read_own``, ``read_wait``,
    ``read_counters``; ``clock`` the time. The kernel may preempt the thread at the
    return of the system call that read them, after the value was taken and before the
    clock: that wait would be in the wall time and in no counter. So the read is
    bracketed by the clock; where the bracket is longer than a read of that many counter
    files takes (``EDGE_LIMIT_S`` + ``FILE_READ_S`` a file), the thread was preempted in
    it and the edge is taken again (at most three times). The time returned is the
    bracket's end.

    The reads are tracing's own work, not the rank's: a process with many threads (a
    mesh's process groups each start gloo threads) reads a file for each at every
    communication span's edge. So the time this thread has spent in them is moved, in
    the counters returned, from ``ran`` to ``waited``, where the replay does not price it
    as work; the third number, what a span carves as waiting for a core, is left as read.
    None for the counters where they are not measured.
    """
    read = read or read_own
    for _ in range(3):
        t0 = clock()
        counters = read()
        t = clock()
        files = getattr(_files.own, "files", 1)
        if counters is None or t - t0 < EDGE_LIMIT_S + FILE_READ_S * files:
            break
    if counters is None:
        return None, t
    own = _files.own
    own.spent = spent = getattr(own, "spent", 0.0) + (t - t0)
    ran = counters[0]
    return (None if ran is None else ran - spent, counters[1] + spent, *counters[2:]), t


def read_seconds(every_thread: bool = False) -> float:
    """Seconds the calling thread (or every thread of this process, added up) has waited
    for a core so far; 0.0 where not measured. One ``pread`` per thread of an open file:
    about a microsecond each, cheap enough for every span.
    """
    if not MEASURED:
        return 0.0
    if every_thread:
        return sum(_delay(fd) for fd in _files.every_thread())
    return _delay(_files.calling_thread())


def note() -> str:
    """One line for a lab's first output: whether waiting for a core is measured here."""
    if MEASURED:
        return ("waiting for a core: measured per rank (Linux run-queue delay, "
                f"{SCHEDSTAT}), drawn as its own kind")
    return ("waiting for a core: not measured on this system (no "
            f"{SCHEDSTAT}); it hides inside compute and transfer")


def waiting_name(name: str) -> str:
    """The name of the core wait carved out of a span called ``name``: a name of its own,
    so that what reads a span by name (a phase's duration, a step's first span) reads
    the span without its wait."""
    return f"{name} (core wait)"


def carve(spans: Iterable[Span]) -> list[Span]:
    """Move each span's measured ``core_wait_s`` into a ``core_wait`` span at its end,
    named ``waiting_name(span.name)``.

    Spans nest (a ``step`` around ``forward``); a counter read around the outer span
    includes what its inner spans waited, so each span gives up only its own share: its
    wait less that of the spans directly inside it. A wait longer than the span (clock
    granularity) takes the whole span. The returned spans carry no wait, so carving
    twice changes nothing.
    """
    spans = list(spans)
    if not any(s.core_wait_s for s in spans):     # carved already: a window, a filter, a merge
        return spans
    own = [s.core_wait_s for s in spans]
    by_rank: dict[int, list[int]] = {}
    for i, s in enumerate(spans):
        by_rank.setdefault(s.rank, []).append(i)
    for members in by_rank.values():
        members.sort(key=lambda i: (spans[i].start, -spans[i].end))
        stack: list[int] = []
        for i in members:
            while stack and spans[stack[-1]].end < spans[i].end:
                stack.pop()
            if stack and spans[stack[-1]].start <= spans[i].start:
                own[stack[-1]] -= spans[i].core_wait_s
            stack.append(i)
    out = []
    for s, waited in zip(spans, own):
        if s.core_wait_s == 0.0:
            out.append(s)
            continue
        piece = min(max(waited, 0.0), s.duration)
        cut = s.end - piece
        out.append(replace(s, end=cut, core_wait_s=0.0))
        if piece > 0:
            out.append(Span(s.rank, CORE_WAIT, waiting_name(s.name), cut, s.end, 0, s.peer,
                            s.axis))
    return out
