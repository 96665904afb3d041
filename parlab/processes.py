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
