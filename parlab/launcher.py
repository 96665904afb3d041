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
import os
import re
import secrets
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

from . import _worker, starting
from .errors import LaunchTimeout, TeardownWarning, WorkerError, _ranks, counted
from .hardware import DeviceSet, cpu_count, devices as describe_devices
from .launch_folder import LaunchFolder
from .launch_settings import (check_main_script, check_other_settings, check_port,
                              check_timeout, pack_worker, pinned_cores, threads_asked)
from .processes import LAUNCH_MARK, Guardian, group_has_live_member, stop_leftovers
from .rank_exits import PidFd, describe_exit, exit_code, exit_handle
from .rank_stacks import ask_for_stacks, death_report
from .trace import Span, Timeline

ERROR_GRACE_S = 0.3         # after a first failure, collect the others' for the report
STOP_GRACE_S = 2.0          # SIGTERM, then SIGKILL after this long
KILL_GRACE_S = 0.5          # after SIGKILL, how long to wait for the processes to vanish
# A rank that lost its connection to a peer usually failed because that peer did, even
# when (on a loaded machine) its report reached the launcher before the peer's death did.
PEER_LOST = re.compile(r"Connection (closed|reset) by peer|Broken pipe")


@dataclass
class LaunchResult:
    """What a launch returns: one result per rank (rank order) and the merged timeline."""

    results: list
    timeline: Timeline
    devices: DeviceSet | None
    wall_time: float

    def replayed(self, link=None):
        """This run on dedicated devices: ``sim.replay(self.timeline, link)``. Ranks grouped
        into nodes (``parlab.devices(n, nodes=k)``) are replayed on two links: this
        machine's idle link inside a node, the devices' ``between`` link across nodes."""
        from .sim import replay
        from .sim.replay import idle_link
        if link is None and self.devices is not None and (inside := idle_link()) is not None:
            link = self.devices.replay_link(inside)
        return replay(self.timeline, link)

    def __repr__(self) -> str:
        where = self.devices.describe() if self.devices else f"{len(self.results)} processes"
        return (f"LaunchResult({len(self.results)} ranks in {self.wall_time:.2f} s on "
                f"{where}; {self.timeline!r})")


def launch(fn: Callable, world_size: int, args: Sequence = (), *,
           kwargs: dict | None = None, timeout: float = 120.0,
           devices: DeviceSet | None = None, seed: int = 0, port: int | None = None,
           process_group: bool = True, env: dict | None = None,
           pin_cores: bool = False) -> LaunchResult:
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
    env: extra environment variables for every rank; ``OMP_NUM_THREADS`` there sets the
        threads each rank computes with (by default one per simulated device).
    pin_cores: True pins each rank to cores of its own among the c cores this process
        may use (``os.sched_setaffinity``; Linux only, else ignored): with more ranks
        than cores rank r gets core r mod c, otherwise c // n cores each. Where ranks
        outnumber cores, the scheduler otherwise moves them between cores as they sleep
        and wake, and a woken rank waits for a core another rank holds; pinned, the same
        ranks share a core every step (lab 07's meshes, 4 ranks on 2 cores: steps 1.2-1.5x
        quicker). Whether it helps depends on who computes at once: measure.

    Raises ``WorkerError`` (with the failing rank and its traceback) when a rank raises
    or dies; the other ranks are stopped at once. When every rank returned its result
    but some were still tearing down at the timeout, the results are returned with a
    ``TeardownWarning``. Processes a rank started are stopped with it.
    """
    world_size = counted(world_size, "world_size=", 1, "pass e.g. world_size=2.")
    timeout = check_timeout(timeout)
    seed = counted(seed, "seed=", None, "pass e.g. seed=0.")
    check_port(port)
    check_other_settings(world_size, devices, process_group, env)
    threads = threads_asked(env)
    check_main_script()
    cores = pinned_cores(world_size, pin_cores)
    payload = pack_worker(fn, args, kwargs)

    mark = secrets.token_hex(8)  # inherited by whatever the ranks start: see processes.py
    rank_env = {"PYTHONUNBUFFERED": "1", **(env or {}), LAUNCH_MARK: mark}
    devs = devices
    if process_group:
        devs = devices or describe_devices(world_size)
        if devs.n != world_size:
            raise ValueError(f"devices describes {devs.n} devices but world_size is "
                             f"{world_size}: pass parlab.devices({world_size}).")
    folder = guardian = None
    procs, conns = [], []
    started = time.perf_counter()
    try:
        # A Ctrl-C while these are made waits until both are recorded: the cleanup below
        # then removes them (the folder's lock would otherwise live on with the traceback).
        with _interrupts_held():
            folder = LaunchFolder()
            guardian = Guardian(mark)  # stops what the ranks started if we are killed
        pg = None
        if process_group:
            pg = _process_group_spec(folder.file("store"), world_size, devs, timeout)
            pg["threads"] = threads or pg["threads"]
            rank_env.update(_framework_env(pg["threads"], devs))
        dump_paths = [folder.file(f"rank{r}.txt") for r in range(world_size)]
        forked = starting.uses_fork_server(process_group)
        state = starting.LauncherState() if forked else None
        specs = [_worker.RankSpec(rank, world_size, payload, os.getpid(), seed, rank_env, pg,
                                  dump_paths[rank], state, cores[rank])
                 for rank in range(world_size)]
        _start_ranks(specs, procs, conns, guardian, starting.context(forked))
        results, spans = _Collector(procs, conns, dump_paths, started, timeout, forked).run()
    finally:
        # A second Ctrl-C during the cleanup waits until it is done (then it is delivered).
        with _interrupts_held():
            _stop_all(procs)
            stop_leftovers(mark)  # helpers that left their rank's group (a new session)
            for conn in conns:
                conn.close()
            if folder is not None:
                folder.remove()
            if guardian is not None:
                guardian.done()
    labels = devs.labels() if devs else None
    timeline = Timeline([Span(*s) for s in spans], labels, range(world_size))
    return LaunchResult(results, timeline, devs, time.perf_counter() - started)


# --------------------------------------------------------------------------- settings


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
    then its result, or its error (frames only) and then its full traceback.
    """

    def __init__(self, procs, conns, dump_paths, started: float, timeout: float,
                 forked: bool = False):
        self.procs, self.conns, self.dump_paths = procs, conns, dump_paths
        self.forked = forked
        self.world_size = len(procs)
        self.started, self.timeout = started, timeout
        self.results: dict[int, Any] = {}
        self.spans: list[tuple] = []
        self.failures: list[tuple[float, int, str, str]] = []  # (when, rank, summary, tb)
        self.stage = {r: ("starting Python and importing modules", started)
                      for r in range(self.world_size)}
        self.startup_s: dict[int, float] = {}  # from the launch to the worker's call
        self.open_conns = {conn: rank for rank, conn in enumerate(conns)}
        self.running = {exit_handle(proc): rank for rank, proc in enumerate(procs)}

    def run(self):
        try:
            return self._run()
        finally:
            for handle in self.running:
                if isinstance(handle, PidFd):
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
                    if isinstance(obj, PidFd):
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
            try:
                self.results[rank] = cloudpickle.loads(msg[2])
            except Exception as exc:  # noqa: BLE001 - named for the rank that sent it
                self.failures.append((msg[4], rank, (
                    f"its result could not be rebuilt here ({type(exc).__name__}: {exc}): it "
                    "holds an object of a module or class only the rank had; return plain "
                    "data (numbers, arrays, lists, dicts), or import that module here too"),
                    ""))
                return
            self.spans.extend(msg[3])
        elif msg[0] == "traceback":   # the full text of the error this rank just sent
            self.failures = [(when, r, summary, msg[2] if r == rank else tb)
                             for when, r, summary, tb in self.failures]
        else:
            self.failures.append((msg[4], rank, msg[2], msg[3]))

    def _exited(self, rank: int) -> None:
        code = exit_code(self.procs[rank], block=True)
        conn = self.conns[rank]
        while conn in self.open_conns and conn.poll():
            self._read(conn)
        # All the rank wrote is read. A child it forked may hold its end of the pipe open
        # for a long while: the rank is done all the same, so stop waiting for the end.
        self.open_conns.pop(conn, None)
        reported = any(f[1] == rank for f in self.failures)
        server = starting.fork_server_died() if self.forked and code == 255 else None
        if rank not in self.results and not reported:
            summary, tb = death_report(code, self.dump_paths[rank])
            if server:
                summary = (f"the fork server that starts the ranks died during the launch "
                           f"({server}), and took its ranks along: memory ran out (the "
                           "kernel's OOM killer picks large processes) or something killed "
                           "it. The next launch starts a new one.")
            self.failures.append((time.time(), rank, summary, tb))
        elif server:
            pass   # the rank's result is here; its exit code was lost with the fork server
        elif rank in self.results and code != 0 and not reported:
            self.failures.append((time.time(), rank,
                                  f"crashed after returning its result ({describe_exit(code)})",
                                  ""))

    def _error(self) -> WorkerError:
        self.failures.sort(key=lambda f: (bool(PEER_LOST.search(f[2])), f[0]))
        _, rank, summary, tb = self.failures[0]
        done = sorted(r for r in self.results if self.procs[r].exitcode == 0)
        if PEER_LOST.search(summary) and done:
            # Nobody crashed: the peer had finished. Lab 09 teaches this bug.
            summary += (f" ({_ranks(done)} had already returned {'its' if len(done) == 1 else 'their'}"
                        f" result and exited normally: rank {rank} called a collective, send or "
                        "receive that its peers never called; check that every rank makes the "
                        "same calls, in the same order)")
        same = [r for _, r, s, _ in self.failures[1:] if s == summary]
        others = [f"rank {r}: {s.splitlines()[0] if s else s}"
                  for _, r, s, _ in self.failures[1:] if s != summary]
        return WorkerError(rank, self.world_size, summary, tb, others, same)

    def _timeout(self) -> LaunchTimeout:
        alive = sorted(self.running.values())
        starting = [r for r in alive if r not in self.startup_s and r not in self.results]
        working = [r for r in alive if r in self.startup_s and r not in self.results]
        stuck = ask_for_stacks(self.procs, working, self.dump_paths)
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
            stacklevel=_caller_level())


def _caller_level() -> int:
    """warnings' stacklevel of the first frame outside this module: the line that called
    ``launch`` (counted from the frame that calls ``warnings.warn``)."""
    import sys
    frame, level = sys._getframe(2), 2        # _warn_slow_teardown's frame is level 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


# --------------------------------------------------------------------------- stacks


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
            if sig == signal.SIGTERM and hasattr(signal, "SIGCONT"):
                # A stopped rank (SIGSTOP, a debugger, lab 09's frozen rank) keeps SIGTERM
                # pending until it runs again: let it run, so it dies now, not at SIGKILL.
                _signal_group(p, signal.SIGCONT)
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
    if exit_code(proc) is None:  # still our unreaped child, so the pid is still its own
        try:
            os.kill(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
