"""The errors a launch can end with. They name the rank and say what to change."""
from __future__ import annotations

import operator


def whole_number(value) -> int | None:
    """``value`` as an int if it is a whole number (Python or numpy), else None.

    A bool is not a count (``True`` is not 1 device), and 2.0 is not a whole number: the
    one rule every setting that counts something checks before its own error message.
    """
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def counted(value, what: str, least: int | None = 1, hint: str = "") -> int:
    """``value`` as an int when it is a whole number of at least ``least`` (None: any);
    else a ValueError naming ``what`` and, after a colon, the ``hint`` (what to pass)."""
    n = whole_number(value)
    if n is None or (least is not None and n < least):
        bound = f" >= {least}" if least is not None else ""
        raise ValueError(f"{what} must be a whole number{bound}, got {value!r}"
                         + (f": {hint}" if hint else ""))
    return n


class WorkerError(RuntimeError):
    """A rank raised an exception or died; the other ranks were stopped.

    ``rank`` is the rank that failed first (the likely root cause: when one rank dies,
    its peers usually fail a moment later on a broken connection). ``remote_traceback``
    is that rank's traceback as text; ``other_failures`` lists what else went wrong;
    ``same_error`` the other ranks that raised the very same error themselves (a setting
    every rank checks, say), which is no consequence of the first.
    """

    def __init__(self, rank: int, world_size: int, summary: str,
                 remote_traceback: str = "", other_failures: list[str] | None = None,
                 same_error: list[int] | None = None):
        self.rank = rank
        self.world_size = world_size
        self.summary = summary
        self.remote_traceback = remote_traceback
        self.other_failures = other_failures or []
        self.same_error = sorted(same_error or [])
        if self.same_error and len(self.same_error) + 1 == world_size:
            message = f"every rank of {world_size} failed with the same error: {summary}"
        else:
            message = f"rank {rank} of {world_size} failed: {summary}"
            if self.same_error:
                message += (f"\n({_ranks(self.same_error)} failed with the same error, "
                            "each on its own)")
        if self.other_failures:
            message += ("\n(afterwards, probably as a consequence: "
                        + "; ".join(self.other_failures) + ")")
        if remote_traceback:
            message += f"\n\n--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}"
        super().__init__(message)


class LaunchTimeout(TimeoutError):
    """Ranks were still running when the launch's timeout ran out; all were stopped.

    ``stuck`` maps each unfinished rank to what it was doing (its innermost frames, or the
    start-up stage it had reached). ``starting`` holds the ranks that had not reached the
    worker function yet; ``startup_s`` how long start-up took for those that had.
    """

    def __init__(self, timeout: float, world_size: int, stuck: dict[int, str],
                 starting=(), startup_s: dict[int, float] | None = None, cores: int = 0):
        self.timeout = timeout
        self.world_size = world_size
        self.stuck = stuck
        self.starting = set(starting)
        self.startup_s = dict(startup_s or {})
        lines = [f"{_ranks(rs)}: {what}" for what, rs in _grouped(stuck)]
        hint = (_startup_hint(self.starting, self.startup_s, world_size, timeout, cores)
                if self.starting else
                "A rank blocked in a receive or collective usually waits for a peer that never"
                " sends (mismatched send/recv or a collective not called on every rank). If"
                " the work is just slow, pass a larger timeout=.")
        super().__init__(
            f"{len(stuck)} of {world_size} ranks still running after timeout={timeout:g} s; "
            "all ranks were stopped.\n  " + "\n  ".join(lines) + "\n" + hint)


def _grouped(stuck: dict[int, str]) -> list[tuple[str, list[int]]]:
    """Ranks doing the same thing share one line (16 ranks starting up: one line)."""
    groups: dict[str, list[int]] = {}
    for rank, what in sorted(stuck.items()):
        groups.setdefault(what, []).append(rank)
    return sorted(groups.items(), key=lambda item: item[1][0])


def _ranks(ranks: list[int]) -> str:
    """'rank 4', or 'ranks 0-3, 5' for several."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return "ranks " + ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _startup_hint(starting, startup_s, world_size, timeout, cores) -> str:
    if not startup_s:
        what = (f"start-up used up the whole timeout: after {timeout:g} s none had reached "
                "the worker function")
    else:
        low, high = f"{min(startup_s.values()):.1f}", f"{max(startup_s.values()):.1f}"
        what = (f"start-up was still going on: {len(starting)} of {world_size} ranks had not "
                f"reached the worker function, and those that had took "
                f"{low if low == high else f'{low}-{high}'} s to start")
    on = f"; here {world_size} of them share {cores} cores" if 0 < cores < world_size else ""
    return (f"Not the worker but {what}. Each rank is a new process that starts Python and "
            f"imports its framework{on}. Pass a larger timeout= (it counts from the launch, "
            "start-up included), or launch fewer ranks.")


class TeardownWarning(RuntimeWarning):
    """Every rank returned its result, but some had not exited when the timeout ran out.

    They were stopped; the results are complete and were returned.
    """
