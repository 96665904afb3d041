"""Run one worker function on N ranks, each in its own process, and collect what they did.

``launch(fn, world_size)`` is the single way the labs start ranks. It owns everything
that makes a live demo safe: the environment, one thread per simulated device, deadlines,
a clear error naming the rank (or the setting) at fault, and cleanup of every process
after success, failure, timeout or interrupt.

Nothing a launch starts listens beyond the loopback: the ranks meet through a file in a
private folder (a ``FileStore``; a ``TCPStore`` would listen on every interface, whatever
host it is given, without authentication), and gloo is pinned to the loopback interface.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os
import re
import secrets
import shutil
import signal
import stat
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

from . import _worker, starting
from .errors import LaunchTimeout, TeardownWarning, WorkerError, whole_number
from .hardware import DeviceSet, cpu_count, devices as describe_devices
from .processes import LAUNCH_MARK, Guardian, group_has_live_member, stop_leftovers
from .trace import Span, Timeline

STACK_FRAMES = 6            # innermost frames shown for a hung or crashed rank
ERROR_GRACE_S = 0.3         # after a first failure, collect the others' for the report
STOP_GRACE_S = 2.0          # SIGTERM, then SIGKILL after this long
KILL_GRACE_S = 0.5          # after SIGKILL, how long to wait for the processes to vanish
DUMP_WAIT_S = 1.0           # how long a rank asked for its stack gets to write it
MAX_TIMEOUT_S = 30 * 24 * 3600   # a month: a longer timeout is surely a typo
# A rank that lost its connection to a peer usually failed because that peer did, even
# when (on a loaded machine) its report reached the launcher before the peer's death did.
PEER_LOST = re.compile(r"Connection (closed|reset) by peer|Broken pipe")
FOLDER_PREFIX = "parlab-launch-"
SWEEP_AFTER_S = 60          # a dead launch's folder is swept once it is this old


@dataclass
class LaunchResult:
    """What a launch returns: one result per rank (rank order) and the merged timeline."""

    results: list
    timeline: Timeline
    devices: DeviceSet | None
    wall_time: float

    def __repr__(self) -> str:
        where = self.devices.describe() if self.devices else f"{len(self.results)} processes"
        return (f"LaunchResult({len(self.results)} ranks in {self.wall_time:.2f} s on "
                f"{where}; {self.timeline!r})")


def launch(fn: Callable, world_size: int, args: Sequence = (), *,
           kwargs: dict | None = None, timeout: float = 120.0,
           devices: DeviceSet | None = None, seed: int = 0, port: int | None = None,
           process_group: bool = True, env: dict | None = None) -> LaunchResult:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` ranks; wait for all.

    fn: an importable function or one defined in a notebook cell (sent by value).
    args, kwargs: further positional and keyword arguments for ``fn``, the same for every
        rank, e.g. ``kwargs={"steps": 20, "lr": 0.1}``.
    timeout: seconds until every rank must have finished, start-up included; then all are
        stopped and ``LaunchTimeout`` (a ``TimeoutError``) says what each was doing.
    devices: a ``parlab.devices(...)`` choice; by default real GPUs if enough, else
        simulated CPU devices.
    seed: rank r seeds python, numpy and torch with ``seed + r``.
    port: accepted (and checked) for notebooks written for earlier versions, and unused:
        there is no network store. The ranks meet through a file in a folder only this
        user can enter, so a launch opens no port of its own.
    process_group: False starts plain processes with no torch process group (e.g. for
        TensorFlow workers).
    env: extra environment variables for every rank.

    Raises ``WorkerError`` (with the failing rank and its traceback) when a rank raises
    or dies; the other ranks are stopped at once. When every rank returned its result
    but some were still tearing down at the timeout, the results are returned with a
    ``TeardownWarning``. Processes a rank started are stopped with it.
    """
    world_size = _whole_number("world_size", world_size, 1, "world_size=2")
    timeout = _check_timeout(timeout)
    seed = _whole_number("seed", seed, None, "seed=0")
    _check_port(port)
    _check_other_settings(world_size, devices, process_group, env)
    payload = _pack(fn, args, kwargs)

    mark = secrets.token_hex(8)  # inherited by whatever the ranks start: see processes.py
    rank_env = {"PYTHONUNBUFFERED": "1", **(env or {}), LAUNCH_MARK: mark}
    devs = devices
    if process_group:
        devs = devices or describe_devices(world_size)
        if devs.n != world_size:
            raise ValueError(f"devices describes {devs.n} devices but world_size is "
                             f"{world_size}: pass parlab.devices({world_size}).")
    folder = _LaunchFolder()
    guardian = Guardian(mark)    # stops what the ranks started if this process is killed
    procs, conns = [], []
    started = time.perf_counter()
    try:
        pg = None
        if process_group:
            pg = _process_group_spec(folder.file("store"), world_size, devs, timeout)
            rank_env.update(_framework_env(pg["threads"], devs))
        dump_paths = [folder.file(f"rank{r}.txt") for r in range(world_size)]
        forked = starting.uses_fork_server(process_group)
        state = starting.LauncherState() if forked else None
        specs = [_worker.RankSpec(rank, world_size, payload, os.getpid(), seed, rank_env, pg,
                                  dump_paths[rank], state) for rank in range(world_size)]
        _start_ranks(specs, procs, conns, guardian, starting.context(process_group))
        results, spans = _Collector(procs, conns, dump_paths, started, timeout).run()
    finally:
        # A second Ctrl-C during the cleanup waits until it is done (then it is delivered).
        with _interrupts_held():
            _stop_all(procs)
            stop_leftovers(mark)  # helpers that left their rank's group (a new session)
            for conn in conns:
                conn.close()
            folder.remove()
            guardian.done()
    labels = devs.labels() if devs else None
    timeline = Timeline([Span(*s) for s in spans], labels, range(world_size))
    return LaunchResult(results, timeline, devs, time.perf_counter() - started)


# --------------------------------------------------------------------------- settings
def _whole_number(name: str, value, minimum: int | None, example: str) -> int:
    """``value`` as an int: Python or numpy whole numbers, never a bool (True is not 1)."""
    number = whole_number(value)
    if number is None:
        raise ValueError(f"{name}= must be a whole number, got {value!r} "
                         f"({type(value).__name__}): pass e.g. {example}.")
    if minimum is not None and number < minimum:
        raise ValueError(f"{name}= must be at least {minimum}, got {number}: "
                         f"pass e.g. {example}.")
    return number


def _check_timeout(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise ValueError(f"timeout= must be a number of seconds, got {timeout!r} "
                         f"({type(timeout).__name__}): pass e.g. timeout=120.")
    seconds = float(timeout)
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise ValueError(f"timeout= must be a number of seconds above 0 and at most "
                         f"{MAX_TIMEOUT_S} (30 days), got {timeout!r}: it is when every rank "
                         "is stopped, so pass a finite time, e.g. timeout=3600 for a long run.")
    return seconds


def _check_port(port) -> None:
    """``port`` is only checked: ranks meet through a file, no launch opens a port."""
    if port is None:
        return
    number = whole_number(port)
    if number is None or not 0 <= number <= 65535:
        raise ValueError(f"port= must be None or a port number from 0 to 65535, got {port!r}. "
                         "It can be left out: the ranks meet through a file in a private "
                         "folder, and a launch opens no port of its own.")


def _check_other_settings(world_size, devices, process_group, env) -> None:
    if devices is not None and not isinstance(devices, DeviceSet):
        raise TypeError(f"devices= must be a parlab.devices(...) choice, got {devices!r}: "
                        f"pass devices=parlab.devices({world_size}), or leave it out.")
    if not isinstance(process_group, bool):
        raise ValueError(f"process_group= must be True or False, got {process_group!r}.")
    if env is None:
        return
    if not isinstance(env, dict):
        raise TypeError(f"env= must be a dict of environment variables, got "
                        f"{type(env).__name__}: write e.g. env={{'MY_SETTING': '1'}}.")
    for key, value in env.items():
        if not (isinstance(key, str) and isinstance(value, str)):
            raise TypeError(f"env= must map names to strings, got {key!r}: {value!r}: "
                            f"write env={{{str(key)!r}: {str(value)!r}}}.")


def _pack(fn, args, kwargs) -> bytes:
    """``fn`` and its arguments, serialized by value where needed (notebook functions)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args= must be a tuple of the worker's further arguments, got "
                        f"{type(args).__name__} {args!r}: for a single one write "
                        f"args=({args!r},).")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs= must be a dict of the worker's keyword arguments, got "
                        f"{type(kwargs).__name__}: write e.g. kwargs={{'steps': 20}}.")
    for key in kwargs:
        if not isinstance(key, str):
            raise TypeError(f"kwargs= keys must be strings (argument names), got {key!r}.")
        if key in ("rank", "world_size"):
            raise TypeError(f"kwargs= cannot set {key!r}: the launcher passes it to every "
                            "rank.")
    import cloudpickle
    try:
        return cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    except Exception as exc:
        raise TypeError(
            f"could not send {getattr(fn, '__name__', fn)!r} and its args to the ranks "
            f"({type(exc).__name__}: {exc}). Pass plain data (numbers, arrays, tensors) "
            "as args and kwargs, and build models, files or locks inside the worker."
        ) from exc


# --------------------------------------------------------------------------- set-up
def _process_group_spec(store_path: str, world_size: int, devs: DeviceSet, timeout) -> dict:
    """How each rank joins the process group: through a file store only we can reach."""
    from .torch.runtime import threads_for
    return {"backend": devs.backend, "device_kind": devs.kind, "store_path": store_path,
            "threads": threads_for(devs.simulated, world_size), "timeout_s": timeout}


def _framework_env(threads: int, devs: DeviceSet) -> dict:
    """Environment each rank needs before it imports torch."""
    from .torch.runtime import loopback_interface
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "MASTER_ADDR": "127.0.0.1"}
    lo = loopback_interface()
    if lo:  # all ranks are on this host: gloo (also used beside NCCL) listens on loopback only
        env["GLOO_SOCKET_IFNAME"] = lo
        env["NCCL_SOCKET_IFNAME"] = lo  # and NCCL's bootstrap sockets (not checked on a GPU)
    return env


class _LaunchFolder:
    """A folder only this user can enter (mode 0700), for one launch: the file the ranks
    meet through and their stack dumps.

    The launch removes it when it ends. A launcher that is killed, or terminated (SIGTERM
    runs no Python cleanup), leaves it behind: the next launch on this machine sweeps it.
    A lock held by the launcher tells a live launch's folder from a dead one's, whatever
    process ids say (they are reused, and differ between containers sharing /tmp).
    """

    def __init__(self):
        _sweep_dead_folders(tempfile.gettempdir())
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


def _sweep_dead_folders(parent: str) -> None:
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


@contextlib.contextmanager
def _interrupts_held():
    """Hold a Ctrl-C (SIGINT) until the block ends, then deliver it.

    Between creating a rank's process and recording it, a KeyboardInterrupt would leave a
    running interpreter that nothing stops. Only the main thread receives one, and only
    it may change signal handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # a handler not installed from Python: it cannot be restored
        yield
        return
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)  # the previous handler runs now


def _start_ranks(specs, procs: list, conns: list, guardian: Guardian, ctx) -> None:
    """Start one process per rank, each recorded (for _stop_all) before an interrupt lands."""
    for spec in specs:
        with _interrupts_held():
            reader, writer = ctx.Pipe(duplex=False)
            conns.append(reader)
            proc = ctx.Process(target=_worker.main, args=(spec, writer),
                               name=f"parlab-rank-{spec.rank}")
            procs.append(proc)
            try:
                proc.start()
            finally:
                writer.close()
            guardian.watch_group(proc.pid)   # the rank leads a process group of that id


# --------------------------------------------------------------------------- collecting
class _Collector:
    """Read what the ranks send until all have finished, one failed, or time ran out.

    A rank sends the start-up stage it is in, "started" when its worker is about to run,
    then its result or its error.
    """

    def __init__(self, procs, conns, dump_paths, started: float, timeout: float):
        self.procs, self.conns, self.dump_paths = procs, conns, dump_paths
        self.world_size = len(procs)
        self.started, self.timeout = started, timeout
        self.results: dict[int, Any] = {}
        self.spans: list[tuple] = []
        self.failures: list[tuple[float, int, str, str]] = []  # (when, rank, summary, tb)
        self.stage = {r: ("starting Python and importing modules", started)
                      for r in range(self.world_size)}
        self.startup_s: dict[int, float] = {}  # from the launch to the worker's call
        self.open_conns = {conn: rank for rank, conn in enumerate(conns)}
        self.running = {_exit_handle(proc): rank for rank, proc in enumerate(procs)}

    def run(self):
        try:
            return self._run()
        finally:
            for handle in self.running:
                if isinstance(handle, _PidFd):
                    handle.close()

    def _run(self):
        deadline = self.started + self.timeout
        first_failure_at = None
        while self.running or self.open_conns:
            now = time.perf_counter()
            if first_failure_at is not None and now - first_failure_at > ERROR_GRACE_S:
                break
            if now >= deadline:
                if self.failures:  # the root cause, rather than the hang it caused
                    break
                if len(self.results) < self.world_size:
                    raise self._timeout()
                self._warn_slow_teardown()
                break
            ready = wait(list(self.open_conns) + list(self.running),
                         timeout=min(deadline - now, 0.2))
            for obj in ready:  # messages first: a rank reports before it exits
                if obj in self.open_conns:
                    self._read(obj)
            for obj in ready:
                if obj in self.running:
                    rank = self.running.pop(obj)
                    if isinstance(obj, _PidFd):
                        obj.close()
                    self._exited(rank)
            if self.failures and first_failure_at is None:
                first_failure_at = time.perf_counter()
        if self.failures:
            raise self._error()
        return [self.results[r] for r in range(self.world_size)], self.spans

    def _read(self, conn) -> None:
        rank = self.open_conns[conn]
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            self.open_conns.pop(conn, None)
            return
        if msg[0] == "stage":
            self.stage[rank] = (msg[2], time.perf_counter())
        elif msg[0] == "started":
            self.startup_s[rank] = time.perf_counter() - self.started
        elif msg[0] == "result":
            import cloudpickle
            self.results[rank] = cloudpickle.loads(msg[2])
            self.spans.extend(msg[3])
        else:
            self.failures.append((msg[4], rank, msg[2], msg[3]))

    def _exited(self, rank: int) -> None:
        code = _exit_code(self.procs[rank], block=True)
        conn = self.conns[rank]
        while conn in self.open_conns and conn.poll():
            self._read(conn)
        # All the rank wrote is read. A child it forked may hold its end of the pipe open
        # for a long while: the rank is done all the same, so stop waiting for the end.
        self.open_conns.pop(conn, None)
        reported = any(f[1] == rank for f in self.failures)
        if rank not in self.results and not reported:
            self.failures.append((time.time(), rank, *_death_report(code, self.dump_paths[rank])))
        elif rank in self.results and code != 0 and not reported:
            self.failures.append((time.time(), rank,
                                  f"crashed after returning its result ({_describe_exit(code)})",
                                  ""))

    def _error(self) -> WorkerError:
        self.failures.sort(key=lambda f: (bool(PEER_LOST.search(f[2])), f[0]))
        _, rank, summary, tb = self.failures[0]
        same = [r for _, r, s, _ in self.failures[1:] if s == summary]
        others = [f"rank {r}: {s.splitlines()[0] if s else s}"
                  for _, r, s, _ in self.failures[1:] if s != summary]
        return WorkerError(rank, self.world_size, summary, tb, others, same)

    def _timeout(self) -> LaunchTimeout:
        alive = sorted(self.running.values())
        starting = [r for r in alive if r not in self.startup_s and r not in self.results]
        working = [r for r in alive if r in self.startup_s and r not in self.results]
        stuck = _ask_for_stacks(self.procs, working, self.dump_paths)
        now = time.perf_counter()
        for r in starting:  # its stack would only show importlib: say where start-up was
            stage, since = self.stage[r]
            stuck[r] = f"still starting up: {stage} (for {now - since:.1f} s)"
        for r in alive:
            if r in self.results:
                stuck[r] = "returned its result, still tearing down"
        return LaunchTimeout(self.timeout, self.world_size, stuck, starting, self.startup_s,
                             cpu_count())

    def _warn_slow_teardown(self) -> None:
        slow = sorted(self.running.values())
        names = ", ".join(f"rank {r}" for r in slow)
        warnings.warn(TeardownWarning(
            f"every rank returned its result, but {names} {'was' if len(slow) == 1 else 'were'}"
            f" still tearing down (leaving the process group, exiting) when timeout="
            f"{self.timeout:g} s ran out, and {'was' if len(slow) == 1 else 'were'} stopped. "
            "The results are complete. A slow teardown usually means something the worker "
            "left behind: a thread, a process, or an object whose cleanup blocks."),
            stacklevel=4)  # the caller of launch


class _PidFd:
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


def _exit_handle(proc):
    """What to wait on for the rank's exit: a pidfd where the system has one."""
    if hasattr(os, "pidfd_open"):
        try:
            return _PidFd(os.pidfd_open(proc.pid))
        except OSError:   # an older kernel: fall back to the sentinel
            pass
    return proc.sentinel


def _exit_code(proc, block: bool = False) -> int | None:
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


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {code})"
    return f"exit code {code}"


# --------------------------------------------------------------------------- stacks
def _read_dump(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _main_thread_frames(dump: str) -> list[str]:
    """The main thread's frames (innermost first) from the last faulthandler dump.

    A dump of one thread ("Stack (most recent call first):") answers a request sent to
    the main thread itself; an all-threads dump names each thread, and the file's first
    line names the main one.
    """
    lines = dump.splitlines()
    if not lines or not lines[0].startswith("main-thread "):
        return []
    main_id = lines[0].split()[1].lower()
    frames, main_frames = None, []
    for line in lines[1:]:
        text = line.strip()
        header = re.match(r"(?:Current thread|Thread) (0x[0-9a-fA-F]+)", text)
        if header or text.startswith("Stack ("):
            frames = []
            if header is None or header.group(1).lower() == main_id:
                main_frames = frames
        elif frames is not None and text.startswith("File "):
            frames.append(text)
    return main_frames


def _format_frames(frames: list[str]) -> str:
    for i, frame in enumerate(frames):  # below the worker call is only parlab's plumbing
        if "_worker.py" in frame and frame.endswith(" in main"):
            frames = frames[:i]
            break
    shown = [re.sub(r'^File "(.*)", line (\d+) in (.*)$',
                    lambda m: f"{m.group(3)} ({_short_path(m.group(1))}:{m.group(2)})", f)
             for f in frames[:STACK_FRAMES]]
    return " <- ".join(shown) + (" <- ..." if len(frames) > STACK_FRAMES else "")


def _short_path(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


def _ask_for_stacks(procs, ranks, dump_paths) -> dict[int, str]:
    """Ask each rank for its main thread's stack (faulthandler), and read the dumps.

    A rank that dies from the request (a multi-threaded TensorFlow rank sometimes does)
    is reported as such.
    """
    if not ranks:
        return {}
    if not hasattr(signal, "SIGUSR1"):
        return {r: "running the worker (stacks cannot be requested on this system)"
                for r in ranks}
    sizes = {r: len(_read_dump(dump_paths[r])) for r in ranks}
    for r in ranks:
        _worker.request_stack(procs[r].pid)
    _wait_for_dumps(procs, ranks, dump_paths, sizes)
    report = {}
    for r in ranks:
        frames = _main_thread_frames(_read_dump(dump_paths[r]))
        where = _format_frames(frames) if frames else ""
        code = _exit_code(procs[r])
        if code is not None:
            report[r] = (f"died when asked for its stack ({_describe_exit(code)})"
                         + (f"; its stack then: {where}" if where else ""))
        elif where:
            report[r] = "stack, most recent call first: " + where
        else:
            report[r] = f"running the worker; its stack did not arrive within {DUMP_WAIT_S:g} s"
    return report


def _wait_for_dumps(procs, ranks, dump_paths, sizes) -> None:
    """Until each rank has written a dump (its file grew, then stopped growing) or died."""
    end = time.perf_counter() + DUMP_WAIT_S
    pending, last = set(ranks), dict(sizes)
    while pending and time.perf_counter() < end:
        time.sleep(0.05)
        for r in list(pending):
            size = len(_read_dump(dump_paths[r]))
            if _exit_code(procs[r]) is not None or sizes[r] < size == last[r]:
                pending.discard(r)
            last[r] = size


def _death_report(code, dump_path) -> tuple[str, str]:
    """Summary and traceback text for a rank that died without reporting an error."""
    dump = _read_dump(dump_path)
    if not dump.startswith("main-thread "):
        # The worker never ran: the process died while Python was starting it.
        return (f"the process died while starting ({_describe_exit(code)}), before parlab's "
                "worker code ran; its error is printed above. In a script, the call to "
                "parlab.launch must sit under `if __name__ == \"__main__\":` (spawned "
                "processes import the main script).", "")
    frames = _main_thread_frames(dump)
    where = f"; last stack: {_format_frames(frames)}" if frames else ""
    return (f"the process died ({_describe_exit(code)}) without reporting an error{where}",
            dump.split("\n", 1)[1] if "Fatal Python error" in dump else "")


# --------------------------------------------------------------------------- stopping
def _stop_all(procs) -> None:
    """Stop every rank and everything it started, whether the rank still runs or not.

    A rank leads its own process group (see _worker.main), and what it starts (a server,
    a TensorFlow worker) joins that group and stays in it after the rank exits: so every
    rank's group is signalled, not only the ranks still running.
    """
    left = [p for p in procs if p.pid is not None]
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S),
                       (getattr(signal, "SIGKILL", signal.SIGTERM), KILL_GRACE_S)):
        for p in left:
            _signal_group(p, sig)
        left = _wait_stopped(left, grace)
        if not left:
            break
    for p in procs:
        if p.pid is not None:
            p.join(0.5)
        if p.pid is None or p.exitcode is not None:
            p.close()  # releases the sentinel's file descriptor now, not at garbage collection


def _wait_stopped(procs, seconds: float) -> list:
    """Wait until each rank has exited and its group is empty; return those that are not."""
    end = time.perf_counter() + seconds
    while True:
        left = [p for p in procs if _still_running(p)]
        if not left or time.perf_counter() >= end:
            return left
        time.sleep(0.02)


def _still_running(proc) -> bool:
    # Reaping an exited rank here is safe: while members of its group live, its pid
    # stays reserved as their group id.
    if proc.exitcode is None:
        return True
    if not hasattr(os, "killpg"):
        return False
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return group_has_live_member(proc.pid)


def _signal_group(proc, sig) -> None:
    if hasattr(os, "killpg"):
        try:
            os.killpg(proc.pid, sig)  # the rank and everything it started
            return
        except ProcessLookupError:
            pass  # no such group: the rank has not reached os.setpgrp yet, or all are gone
        except PermissionError:
            return
    if _exit_code(proc) is None:  # still our unreaped child, so the pid is still its own
        try:
            os.kill(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
