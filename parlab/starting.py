"""How a rank's process is started: a fresh interpreter, or a fork of one that has torch.

Importing torch costs a new interpreter about 1.3 s of CPU; four ranks on two cores wait
about 2 s for it at every launch, longer than most of the labs' experiments. So on Linux,
ranks that join a torch process group are forked from multiprocessing's fork server, a
process that imported torch once (the first launch pays for it), runs no code of its own
between forks, and lives as long as the launching process. Forking from it is safe where
forking the launcher is not: a notebook kernel runs threads that may hold a lock at the
moment of the fork, and the child can hang on it (the reason multiprocessing's ``fork``
method is unsafe here). The server's only other thread is an idle worker of the BLAS
library numpy and torch load (OpenBLAS), which rebuilds its pool in a forked child
(``pthread_atfork``). Other ranks
(TensorFlow's, plain processes) and other systems use ``spawn``.

A forked rank inherits the fork server's state, not the launcher's: its environment and
standard output are those of whichever process started the server, maybe long ago (in
pytest, a finished test's captured output). So the launcher's current ones travel with
each rank and the rank takes them on first (``adopt``), as a spawned rank would have them
(multiprocessing itself sends the working folder and ``sys.path``). Set
``PARLAB_START=spawn`` to start every rank afresh.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys

START_ENV = "PARLAB_START"
# What the fork server imports once. The ranks' own settings (threads, devices) are
# applied after the fork: importing torch touches no GPU, and no parallel work has run.
# torch._dynamo too: the first optimizer a process builds imports it (torch.optim's
# constructors are wrapped to keep dynamo out), 1.3 s of CPU per rank, measured on a 2-core
# machine; imported here once, it starts no thread and the ranks share its pages.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "numpy", "cloudpickle"]


def uses_fork_server(process_group: bool) -> bool:
    """Whether ranks of this kind start from the fork server here."""
    if os.environ.get(START_ENV, "").strip().lower() == "spawn":
        return False
    return (process_group and sys.platform.startswith("linux")
            and "forkserver" in mp.get_all_start_methods())


def context(fork_server: bool):
    """The multiprocessing context that starts ranks: the fork server's, or spawn's."""
    if not fork_server:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read when the server starts (the first launch)
    return ctx


class LauncherState:
    """The launcher's environment and standard output and error, sent with a forked rank.

    Standard output and error travel as file descriptors (multiprocessing passes them to
    the fork server over its Unix socket while the rank starts), so the rank writes where
    the launcher writes now: a notebook cell, a terminal, a test's capture.
    """

    def __init__(self):
        self.environ = dict(os.environ)

    def __reduce__(self):
        from multiprocessing import reduction
        # Called while the rank starts (Process.start pickles it): DupFd hands the
        # descriptor to the process being started.
        stdio = tuple(reduction.DupFd(fd) if _is_open(fd) else None for fd in (1, 2))
        return (_Adopted, (self.environ, stdio))


class _Adopted:
    def __init__(self, environ, stdio):
        self.environ, self.stdio = environ, stdio


def adopt(state: _Adopted | None) -> None:
    """In a forked rank: take on the launcher's environment and output."""
    if state is None:
        return
    for target, fd in zip((1, 2), state.stdio):
        if fd is not None:
            received = fd.detach()
            os.dup2(received, target)
            os.close(received)
    os.environ.clear()
    os.environ.update(state.environ)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def fork_server_died() -> str | None:
    """How the fork server this process started ended ("killed by SIGKILL (exit code -9)"),
    or None while it runs or where there is none. Its ranks die with it (they watch their
    parent), and their exit codes, which it reports, are lost: multiprocessing says 255.
    """
    from multiprocessing import forkserver

    from .rank_exits import describe_exit
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None or not hasattr(os, "waitid"):
        return None
    try:   # WNOWAIT: multiprocessing reaps it, and starts a new one, at the next launch
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return "ended"
    if info is None:
        return None
    return describe_exit(info.si_status if info.si_code == os.CLD_EXITED else -info.si_status)
