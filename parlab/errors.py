"""The errors a launch can end with. They name the rank and say what to change."""
from __future__ import annotations


class WorkerError(RuntimeError):
    """A rank raised an exception or died; the other ranks were stopped.

    ``rank`` is the rank that failed first (the likely root cause: when one rank dies,
    its peers usually fail a moment later on a broken connection). ``remote_traceback``
    is that rank's traceback as text; ``other_failures`` lists what else went wrong.
    """

    def __init__(self, rank: int, world_size: int, summary: str,
                 remote_traceback: str = "", other_failures: list[str] | None = None):
        self.rank = rank
        self.world_size = world_size
        self.summary = summary
        self.remote_traceback = remote_traceback
        self.other_failures = other_failures or []
        message = f"rank {rank} of {world_size} failed: {summary}"
        if self.other_failures:
            message += ("\n(afterwards, probably as a consequence: "
                        + "; ".join(self.other_failures) + ")")
        if remote_traceback:
            message += f"\n\n--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}"
        super().__init__(message)


class LaunchTimeout(TimeoutError):
    """Ranks were still running when the launch's timeout ran out; all were stopped.

    ``stuck`` maps each unfinished rank to what it was doing (its innermost open span),
    when that is known.
    """

    def __init__(self, timeout: float, world_size: int, stuck: dict[int, str]):
        self.timeout = timeout
        self.world_size = world_size
        self.stuck = stuck
        lines = [f"rank {r}: {what}" for r, what in sorted(stuck.items())]
        super().__init__(
            f"{len(stuck)} of {world_size} ranks still running after timeout={timeout:g} s; "
            "all ranks were stopped.\n  " + "\n  ".join(lines)
            + "\nA rank blocked in a receive or collective usually waits for a peer that never"
              " sends (mismatched send/recv or a collective not called on every rank). If the"
              " work is just slow, pass a larger timeout=.")
