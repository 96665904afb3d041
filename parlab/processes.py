"""Process hygiene for everything parlab starts: no process outlives the one that started it.

Used by the ranks ``parlab.launch`` starts and by the processes a rank starts itself
(TensorFlow's gRPC servers), so it sits below both the strategies and the launcher.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1        # from <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """Exit when the launching process dies (e.g. a notebook kernel killed): no orphans.

    On Linux the kernel kills this process (SIGKILL) the moment its parent dies, even while
    it holds the GIL in one long C call, where no Python thread could notice. (Strictly,
    when the parent's thread that started it ends: the launch waits in that thread.)
    Elsewhere a thread watches the parent. Also used by processes a rank starts
    (TensorFlow servers).
    """
    if _kill_me_with_parent():
        if os.getppid() != parent_pid:  # the parent died before the request took effect
            os._exit(3)
        return
    _watch_parent(parent_pid)


def is_alive(pid: int) -> bool:
    """Whether a process of this id exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, someone else's
        return True
    return True


def _kill_me_with_parent() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no prctl: fall back to the watching thread
        return False


def _watch_parent(parent_pid: int) -> None:
    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(0.5)
    threading.Thread(target=watch, name="parlab-parent-watch", daemon=True).start()


# --------------------------------------------------------------------------- the guardian
# A rank's helpers normally die with the rank's process group, which the launcher signals.
# Two kinds escape that: a helper that left the group (``start_new_session=True``, a
# daemon), and every helper when the launcher itself is killed (SIGKILL, as a kernel
# restart does, or SIGTERM) — the ranks die with it (die_with_parent), their helpers are
# re-parented to init. So each rank puts a mark in its environment, which every program
# it starts inherits (``/proc/PID/environ``), and a small guardian process, started in a
# session of its own, waits on a pipe from the launcher: when the pipe closes without a
# "done", the launcher is gone, and the guardian stops the ranks' groups and every marked
# process. The launcher itself sweeps marked processes when a launch ends.
LAUNCH_MARK = "PARLAB_LAUNCH_MARK"
SWEEP_GRACE_S = 2.0         # SIGTERM, then SIGKILL after this long


def _proc_pids() -> list[int]:
    try:
        return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:          # no /proc (macOS, Windows): only process groups can be reached
        return []


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after "pid (command)": state first, process group third."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_has_live_member(pgid: int) -> bool:
    """False when all that is left in the group are zombies (where /proc tells).

    A helper whose rank exited first was re-parented to init, which may reap it late (or,
    in some containers, never); a zombie runs nothing, so waiting for it is pointless.
    """
    if not os.path.isdir("/proc"):
        return True
    return bool(leftovers(None, (pgid,)))


def leftovers(mark: str | None, groups=()) -> list[int]:
    """Live processes of this user that carry ``mark`` or belong to one of ``groups``."""
    needle = f"\0{LAUNCH_MARK}={mark}\0".encode() if mark else None
    groups, me, uid = set(groups), os.getpid(), os.getuid()
    found = []
    for pid in _proc_pids():
        fields = _stat_fields(pid)
        if pid == me or fields is None or fields[0] in ("Z", "X"):   # a zombie runs nothing
            continue
        if groups and int(fields[2]) in groups:
            found.append(pid)
            continue
        if needle is None:
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle in b"\0" + fh.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def stop_leftovers(mark: str | None, groups=(), grace: float = SWEEP_GRACE_S) -> int:
    """SIGTERM what ``leftovers`` finds, then SIGKILL what is left after ``grace``."""
    pids = leftovers(mark, groups)
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.5)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + wait_s
        while pids and time.monotonic() < end:
            time.sleep(0.02)
            pids = [p for p in pids if _running(p)]
        if not pids:
            break
    return len(pids)


def _running(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")   # a zombie runs nothing


class Guardian:
    """The launcher's side: start the guardian, tell it the ranks' groups, say "done"."""

    def __init__(self, mark: str):
        import subprocess
        self.proc = None
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)   # a terminal's Ctrl-C must not reach it
            self._say(f"mark {mark}")
        except OSError:
            self.proc = None             # no guardian: the launch still stops its own ranks

    def _say(self, line: str) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.write(f"{line}\n".encode())
            self.proc.stdin.flush()
        except OSError:
            pass

    def watch_group(self, pgid: int) -> None:
        self._say(f"group {pgid}")

    def done(self) -> None:
        """The launch cleaned up after itself: the guardian leaves without sweeping."""
        if self.proc is None:
            return
        self._say("done")
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5.0)
        except Exception:  # noqa: BLE001 - it exits by itself on the closed pipe
            pass


def _guardian_main() -> None:
    """Read "mark M" / "group G" / "done" lines until the pipe closes; then, unless "done"
    came, stop every process of the recorded groups and every marked process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    mark, groups, done = None, [], False
    for line in sys.stdin.buffer:
        word, _, value = line.decode(errors="replace").strip().partition(" ")
        if word == "mark":
            mark = value
        elif word == "group" and value.isdigit():
            groups.append(int(value))
        elif word == "done":
            done = True
    if done:
        return
    if os.path.isdir("/proc"):
        stop_leftovers(mark, groups)
    elif hasattr(os, "killpg"):        # no /proc: the groups can still be signalled whole
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    _guardian_main()
