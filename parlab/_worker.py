"""The code a launched rank runs first: a trampoline around the learner's function.

``parlab.launch`` starts each rank afresh (``spawn``) or forked from a fork server that
imported torch (see starting.py); never by forking the launcher (``fork`` after torch or
TensorFlow initialised, or beside a notebook's threads, can hang). Either way the rank
cannot import a function defined in a notebook cell, so the function and its arguments
arrive serialized by value (cloudpickle) and are rebuilt here. This module imports no
framework at import time: the environment (threads, interfaces) must be set first.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

from . import starting, trace
from .processes import die_with_parent, is_alive


@dataclass
class RankSpec:
    rank: int
    world_size: int
    payload: bytes                      # cloudpickle of (fn, args)
    parent_pid: int
    seed: int = 0
    env: dict = field(default_factory=dict)
    process_group: dict | None = None   # backend, device_kind, store_path, threads, timeout_s
    dump_path: str | None = None        # where faulthandler writes this rank's stacks
    launcher: object = None             # starting.LauncherState for a forked rank
    cores: frozenset | None = None      # the CPU cores this rank may run on (pinned)


class _PrefixedStream:
    """Prefix each line a rank prints with ``[rank k]``, writing whole lines at once.

    Ranks share the terminal or notebook cell; ``print`` makes several writes per line,
    so without line buffering the ranks' words interleave mid-line.
    """

    def __init__(self, stream, prefix: str):
        self._stream, self._prefix, self._pending = stream, prefix, ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        if lines:
            self._stream.write("".join(f"{self._prefix}{line}\n" for line in lines))
            self._stream.flush()
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._stream.write(self._prefix + self._pending)
            self._pending = ""
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


@functools.lru_cache(maxsize=None)
def _tgkill():
    """libc's tgkill (signal one thread of another process), where there is one."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    try:
        return ctypes.CDLL(None, use_errno=True).tgkill  # glibc >= 2.30
    except (OSError, AttributeError):
        return None


def request_stack(pid: int) -> None:
    """Ask a rank to dump its main thread's stack (see _arm_stack_dumps)."""
    tgkill = _tgkill()
    try:
        if tgkill is not None:
            tgkill(pid, pid, int(signal.SIGUSR1))  # the main thread's id is the pid
        else:
            os.kill(pid, signal.SIGUSR1)
    except (ProcessLookupError, PermissionError):
        pass


def _arm_stack_dumps(path: str | None):
    """Let the launcher ask for this rank's Python stack, even while it blocks in C.

    The file starts with the main thread's id, so the launcher can pick its stack out of
    an all-threads dump. SIGUSR1 dumps on request (a timeout); a fatal signal (segfault,
    abort) dumps on its own.
    """
    if not path:
        return None
    import faulthandler
    dump = open(path, "w")
    dump.write(f"main-thread 0x{threading.main_thread().ident:016x}\n")
    dump.flush()
    faulthandler.enable(file=dump, all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        # Where the launcher can signal the main thread itself (request_stack), dump that
        # thread only: reading other threads' stacks while they run (TensorFlow starts
        # many) can crash the process with SIGSEGV.
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=_tgkill() is None)
    return dump


def main(spec: RankSpec, conn) -> None:
    """Entry point of a rank: set up, run ``fn(rank, world_size, *args, **kwargs)``,
    report.

    Besides the result or error, the rank tells the launcher which start-up stage it is
    in and when the worker starts, so a timeout can say whether start-up used it up.
    """
    # First: a launcher killed from here on takes us along.
    if spec.launcher is None:
        die_with_parent(spec.parent_pid)
    else:  # forked: our parent is the fork server, which exits when the launcher does
        die_with_parent(os.getppid())
        if not is_alive(spec.parent_pid):
            os._exit(3)
        starting.adopt(spec.launcher)
    # Programs the rank starts (os.system, Popen(close_fds=False)) must not inherit its end
    # of the launcher's pipe: the launcher would wait for them to close it.
    os.set_inheritable(conn.fileno(), False)
    if hasattr(os, "setpgrp"):
        os.setpgrp()  # own process group: a terminal Ctrl-C reaches only the launcher,
        #               and the launcher can stop this rank with anything it started
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.cores is not None:  # before torch starts its threads: they inherit the cores
        os.sched_setaffinity(0, spec.cores)
    dump = _arm_stack_dumps(spec.dump_path)  # noqa: F841 - kept open for faulthandler
    os.environ.update(spec.env)
    sys.stdout = _PrefixedStream(sys.stdout, f"[rank {spec.rank}] ")
    sys.stderr = _PrefixedStream(sys.stderr, f"[rank {spec.rank}] ")
    rec = trace.install(trace.Recorder(spec.rank))
    rank_pid = os.getpid()
    ok = False
    try:
        import cloudpickle
        conn.send(("stage", spec.rank, "loading the worker function and its modules"))
        fn, args, kwargs = cloudpickle.loads(spec.payload)
        pg = spec.process_group
        if pg is not None:
            conn.send(("stage", spec.rank, "importing torch and joining the process group"))
            from .torch import runtime
            runtime.init_rank(spec.rank, spec.world_size, backend=pg["backend"],
                              device_kind=pg["device_kind"], store_path=pg["store_path"],
                              seed=spec.seed, threads=pg["threads"],
                              timeout_s=pg["timeout_s"])
            to_plain = runtime.to_plain
        else:
            import random
            random.seed(spec.seed + spec.rank)
            to_plain = _identity
        conn.send(("started", spec.rank))
        result = fn(spec.rank, spec.world_size, *args, **kwargs)
        if os.getpid() != rank_pid:
            # a process the worker forked (os.fork) ran on to here: the rank's result is
            # its own process's, so the copy leaves without a word
            os._exit(0)
        blob = _packed(to_plain, result)
        spans = [dataclasses.astuple(s) for s in rec.spans()]
        del result
        conn.send(("result", spec.rank, blob, spans, time.time()))
        ok = True
        if pg is not None:
            runtime.finalize()
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the launcher
        if os.getpid() != rank_pid:
            os._exit(1)           # a forked copy's error is not the rank's (see above)
        summary = f"{type(exc).__name__}: {_text(exc)}"
        if ok:
            summary = f"crashed while leaving the process group, after returning: {summary}"
        try:
            # Two messages: the error with its frames first, made without reading a file,
            # then the full traceback (source lines, chained causes). A library's own thread
            # can abort the process just after its exception (TensorFlow does after a
            # collective's timeout); what was sent by then is the report.
            conn.send(("error", spec.rank, summary, _frames(exc), time.time()))
            conn.send(("traceback", spec.rank, traceback.format_exc()))
        except Exception:  # noqa: BLE001 - the launcher sees the exit code instead
            pass
        ok = False
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    # A hard exit after flushing: nothing left for interpreter teardown to abort on.
    os._exit(0 if ok else 1)


def _identity(x):
    return x


def _frames(exc: BaseException) -> str:
    """A traceback of ``exc`` without source lines: quick, it reads no file."""
    lines = [f'  File "{frame.f_code.co_filename}", line {lineno}, in {frame.f_code.co_name}\n'
             for frame, lineno in traceback.walk_tb(exc.__traceback__)]
    return ("Traceback (most recent call last):\n" + "".join(lines)
            + f"{type(exc).__name__}: {_text(exc)}\n")


def _text(exc: BaseException) -> str:
    """``str(exc)``, or what went wrong making it: an exception whose ``__str__`` raises
    must still reach the launcher with its type."""
    try:
        return str(exc)
    except Exception as inner:  # noqa: BLE001
        return f"(its message could not be made: str() raised {type(inner).__name__})"


def _packed(to_plain, result) -> bytes:
    """The worker's result, plain and pickled, or a clear error where it cannot be."""
    import cloudpickle
    try:
        return cloudpickle.dumps(to_plain(result))
    except RecursionError:
        raise ValueError(
            f"the worker's result ({type(result).__name__}) is nested too deeply, or contains "
            "itself, to be sent back to the launcher: return plain data (numbers, arrays, "
            "lists and dicts a few levels deep).") from None
