"""Watching processes from a test: which pids still run, waiting for them, killing them."""
import os
import signal
import time
from pathlib import Path

import psutil


def alive(pids):
    """Those of ``pids`` still running (a zombie has finished: it only awaits its parent)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def gone_within(pids, seconds):
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pids)


def kill(pids):
    """Test cleanup: stop what a failing test left running, by pid."""
    for pid in alive(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def pids_in(path) -> list[int]:
    path = Path(path)
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def wait_for_pids(path, n: int, seconds: float = 60) -> list[int]:
    deadline = time.monotonic() + seconds
    while len(pids_in(path)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = pids_in(path)
    assert len(pids) >= n, f"only {len(pids)} of {n} processes reported in"
    return pids
