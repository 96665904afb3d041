"""How a rank ended: waiting on its exit, its exit code, and that code in words."""
from __future__ import annotations

import os
import signal


class PidFd:
    """A file descriptor that becomes readable when the process exits (Linux pidfd).

    multiprocessing's own sentinel is a pipe the rank holds open until it exits; a child
    the rank forks (or execs without closing it) holds it open too, so the sentinel would
    only fire when that child exits as well. A pidfd fires when the rank itself exits.
    """

    def __init__(self, fd: int):
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def exit_handle(proc):
    """What to wait on for the rank's exit: a pidfd where the system has one."""
    if hasattr(os, "pidfd_open"):
        try:
            return PidFd(os.pidfd_open(proc.pid))
        except OSError:   # an older kernel: fall back to the sentinel
            pass
    return proc.sentinel


def exit_code(proc, block: bool = False) -> int | None:
    """The rank's exit code, or None while it runs; without reaping it where possible.

    Until a rank is reaped its pid, and so its process-group id, cannot be reused, which
    keeps signalling that group in _stop_all safe. Ranks are reaped only there. (A rank
    forked from the fork server is its child: reaped there at once. Its group id stays
    reserved while anything it started lives, which is when signalling it matters.)
    """
    if not (hasattr(os, "waitid") and hasattr(os, "WNOWAIT")):
        if block:
            proc.join()
        return proc.exitcode
    flags = os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG)
    try:
        info = os.waitid(os.P_PID, proc.pid, flags)
    except ChildProcessError:  # already reaped, or a child of the fork server
        if block:
            proc.join()  # the fork server reports the code once it has reaped the rank
        return proc.exitcode
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {code})"
    return f"exit code {code}"
