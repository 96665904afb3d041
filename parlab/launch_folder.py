"""The private folder of one launch, and the sweeping of folders that dead launches left."""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time


FOLDER_PREFIX = "parlab-launch-"


SWEEP_AFTER_S = 60          # a dead launch's folder is swept once it is this old


class LaunchFolder:
    """A folder only this user can enter (mode 0700), for one launch: the file the ranks
    meet through and their stack dumps.

    The launch removes it when it ends. A launcher that is killed, or terminated (SIGTERM
    runs no Python cleanup), leaves it behind: the next launch on this machine sweeps it.
    A lock held by the launcher tells a live launch's folder from a dead one's, whatever
    process ids say (they are reused, and differ between containers sharing /tmp).
    """

    def __init__(self):
        sweep_dead_folders(tempfile.gettempdir())
        self.path = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-")
        self._lock = _hold_lock(self.path)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()  # released after the folder is gone: never swept while used


def _hold_lock(folder: str):
    try:
        import fcntl
    except ImportError:  # Windows: no sweeping; a launch still removes its own folder
        return None
    lock = open(os.path.join(folder, "lock"), "w")  # not inherited by the ranks
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return lock


def sweep_dead_folders(parent: str) -> None:
    """Remove the folders of launches whose launcher died without cleaning up."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        if name.startswith(FOLDER_PREFIX) and _abandoned(path):
            shutil.rmtree(path, ignore_errors=True)


def _abandoned(path: str) -> bool:
    try:
        import fcntl
        info = os.lstat(path)
    except (ImportError, OSError):
        return False
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or time.time() - info.st_mtime < SWEEP_AFTER_S):  # young: maybe being set up
        return False
    try:
        with open(os.path.join(path, "lock"), "r") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its launcher lives
    except FileNotFoundError:
        return True   # its launcher died before it could lock
    except OSError:
        return False
    return True
