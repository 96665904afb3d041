"""The kinds of time and the measured interval (Span) every timeline is made of."""
from __future__ import annotations

from dataclasses import dataclass


COMPUTE = "compute"


COMM = "comm"


WAIT = "wait"


IDLE = "idle"  # derived: never recorded, only computed from the gaps between spans


# Derived too: the time a rank was ready to run but waited for a CPU core (the kernel's
# run-queue delay, measured at the edges of each span; see ``parlab.core_waits``).
CORE_WAIT = "core_wait"


KINDS = (COMPUTE, COMM, WAIT)                       # what a rank records
LANE_KINDS = (COMPUTE, COMM, WAIT, CORE_WAIT, IDLE)  # what a lane is made of, once drawn


@dataclass(frozen=True)
class Span:
    """One measured interval on one rank. Times are seconds on the merged clock."""

    rank: int
    kind: str
    name: str
    start: float
    end: float
    bytes: int = 0
    peer: int | None = None
    axis: str | None = None     # the mesh axis (group) a communication ran on, if any
    key: tuple | None = None    # (role, match) of a traced operation, until split (see split_waits)
    core_wait_s: float = 0.0    # of which waiting for a core, until carved out (see core_waits)
    # the recording thread's counters at the span's edges, (ran_s, waited_s) at its start
    # then at its end (core_waits.read_own); what the replay reads as the span's work.
    # A compute span reads no CPU clock (ran_s None): its work is its wall time less waited_s
    clock: tuple | None = None
    issuer: int | None = None   # the rank whose program issued a span drawn on another lane

    @property
    def duration(self) -> float:
        return self.end - self.start
