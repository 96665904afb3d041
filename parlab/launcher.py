"""Run one worker function on N ranks, each in its own process, and collect what they did.

``launch(fn, world_size)`` is the single way the labs start ranks. It owns everything
that makes a live demo safe: a free port, the environment, one thread per simulated
device, deadlines, a clear error naming the rank that failed, and cleanup of every
process after success, failure, timeout or interrupt.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

from . import _worker
from .hardware import DeviceSet, devices as describe_devices
from .errors import LaunchTimeout, WorkerError
from .trace import Span, Timeline

STACK_FRAMES = 6            # innermost frames shown for a hung or crashed rank
ERROR_GRACE_S = 0.3         # after a first failure, collect the others' for the report
STOP_GRACE_S = 2.0          # SIGTERM, then SIGKILL after this long


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


def launch(fn: Callable, world_size: int, args: Sequence = (), *, timeout: float = 120.0,
           devices: DeviceSet | None = None, seed: int = 0, port: int | None = None,
           process_group: bool = True, env: dict | None = None) -> LaunchResult:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks and wait for all.

    fn: an importable function or one defined in a notebook cell (sent by value).
    timeout: seconds until every rank must have finished; then all are stopped and
        ``LaunchTimeout`` (a ``TimeoutError``) says what each was doing.
    devices: a ``parlab.devices(...)`` choice; by default real GPUs if enough, else
        simulated CPU devices.
    seed: rank r seeds python, numpy and torch with ``seed + r``.
    port: the rendezvous port on 127.0.0.1; None picks a free one.
    process_group: False starts plain processes with no torch process group (e.g. for
        TensorFlow workers).
    env: extra environment variables for every rank.

    Raises ``WorkerError`` (with the failing rank and its traceback) when a rank raises
    or dies; the other ranks are stopped at once.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    import cloudpickle
    try:
        payload = cloudpickle.dumps((fn, tuple(args)))
    except Exception as exc:
        raise TypeError(
            f"could not send {getattr(fn, '__name__', fn)!r} and its args to the ranks "
            f"({type(exc).__name__}: {exc}). Pass plain data (numbers, arrays, tensors) "
            "as args and build models, files or locks inside the worker.") from exc

    rank_env = {"PYTHONUNBUFFERED": "1", **(env or {})}
    store = pg = None
    if process_group:
        devs = devices or describe_devices(world_size)
        if devs.n != world_size:
            raise ValueError(f"devices describes {devs.n} devices but world_size is "
                             f"{world_size}: pass parlab.devices({world_size}).")
        store, pg = _host_store(port, world_size, devs, timeout)
        rank_env.update(_framework_env(pg["threads"], devs))
    else:
        devs = devices

    ctx = mp.get_context("spawn")
    procs, conns = [], []
    dumps = tempfile.mkdtemp(prefix="parlab-stacks-")
    dump_paths = [os.path.join(dumps, f"rank{r}.txt") for r in range(world_size)]
    started = time.perf_counter()
    try:
        for rank in range(world_size):
            reader, writer = ctx.Pipe(duplex=False)
            spec = _worker.RankSpec(rank, world_size, payload, os.getpid(), seed,
                                    rank_env, pg, dump_paths[rank])
            proc = ctx.Process(target=_worker.main, args=(spec, writer),
                               name=f"parlab-rank-{rank}")
            proc.start()
            writer.close()
            procs.append(proc)
            conns.append(reader)
        results, spans = _collect(procs, conns, dump_paths, world_size, started + timeout,
                                  timeout)
    finally:
        _stop_all(procs)
        for conn in conns:
            conn.close()
        del store  # closes the rendezvous port
        shutil.rmtree(dumps, ignore_errors=True)
    labels = devs.labels() if devs else None
    timeline = Timeline([Span(*s) for s in spans], labels, range(world_size))
    return LaunchResult(results, timeline, devs, time.perf_counter() - started)


# --------------------------------------------------------------------------- helpers
def _host_store(port, world_size, devs: DeviceSet, timeout):
    """Host the rendezvous store here, on 127.0.0.1, so no rank races for a port."""
    from datetime import timedelta

    import torch.distributed as dist

    from .torch.runtime import threads_for
    try:
        store = dist.TCPStore("127.0.0.1", port or 0, world_size, is_master=True,
                              wait_for_workers=False,
                              timeout=timedelta(seconds=max(timeout, 30)))
    except Exception as exc:  # RuntimeError / DistNetworkError: address in use
        raise RuntimeError(
            f"could not listen on 127.0.0.1:{port}: {exc}. The port is probably busy "
            "(another launch, or a notebook still running): pass port=None to pick a "
            "free one, or choose another port.") from exc
    pg = {"backend": devs.backend, "device_kind": devs.kind, "port": store.port,
          "threads": threads_for(devs.simulated, world_size), "timeout_s": timeout}
    return store, pg


def _framework_env(threads: int, devs: DeviceSet) -> dict:
    """Environment each rank needs before it imports torch."""
    from .torch.runtime import loopback_interface
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "MASTER_ADDR": "127.0.0.1"}
    lo = loopback_interface()
    if lo:  # all ranks are on this host: gloo (also used beside NCCL) listens on loopback only
        env["GLOO_SOCKET_IFNAME"] = lo
    return env


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


def _collect(procs, conns, dump_paths, world_size, deadline, timeout):
    """Wait for every rank's result; raise on the first failure or at the deadline."""
    results: dict[int, Any] = {}
    spans: list[tuple] = []
    failures: list[tuple[float, int, str, str]] = []   # (when, rank, summary, traceback)
    open_conns = {conn: rank for rank, conn in enumerate(conns)}
    running = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    first_failure_at = None

    def read(conn, rank):
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            open_conns.pop(conn, None)
            return
        if msg[0] == "result":
            import cloudpickle
            results[rank] = cloudpickle.loads(msg[2])
            spans.extend(msg[3])
        else:
            failures.append((msg[4], rank, msg[2], msg[3]))

    while running or open_conns:
        now = time.perf_counter()
        if first_failure_at is not None and now - first_failure_at > ERROR_GRACE_S:
            break
        if now >= deadline:
            stuck = [r for r in range(world_size)
                     if r not in results and procs[r].exitcode is None]
            raise LaunchTimeout(timeout, world_size, _ask_for_stacks(procs, stuck, dump_paths))
        ready = wait(list(open_conns) + list(running), timeout=min(deadline - now, 0.2))
        for obj in ready:  # messages first: a rank reports before it exits
            if obj in open_conns:
                read(obj, open_conns[obj])
        for obj in ready:
            if obj in running:
                rank = running.pop(obj)
                procs[rank].join()
                conn = conns[rank]
                while conn in open_conns and conn.poll():
                    read(conn, rank)
                code = procs[rank].exitcode
                reported = any(f[1] == rank for f in failures)
                if rank not in results and not reported:
                    failures.append((time.time(), rank, *_death_report(code, dump_paths[rank])))
                elif rank in results and code != 0 and not reported:
                    failures.append((time.time(), rank,
                                     f"crashed after returning its result "
                                     f"({_describe_exit(code)})", ""))
        if failures and first_failure_at is None:
            first_failure_at = time.perf_counter()
    if failures:
        failures.sort()
        _, rank, summary, tb = failures[0]
        others = [f"rank {r}: {s.splitlines()[0] if s else s}" for _, r, s, _ in failures[1:]]
        raise WorkerError(rank, world_size, summary, tb, others)
    return [results[r] for r in range(world_size)], spans


def _read_dump(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _main_thread_frames(dump: str) -> list[str]:
    """The main thread's frames (innermost first) from the last faulthandler dump."""
    lines = dump.splitlines()
    if not lines or not lines[0].startswith("main-thread "):
        return []
    main_id = lines[0].split()[1].lower()
    frames, current = {}, None
    for line in lines[1:]:
        header = re.match(r"\s*(?:Current thread|Thread) (0x[0-9a-fA-F]+)", line)
        if header:
            current = header.group(1).lower()
            frames[current] = []
        elif current and line.strip().startswith("File "):
            frames[current].append(line.strip())
    return frames.get(main_id, [])


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
    """Signal each stuck rank to dump its stack (faulthandler), and read the dumps."""
    if hasattr(signal, "SIGUSR1"):
        for r in ranks:
            try:
                os.kill(procs[r].pid, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.3)
    report = {}
    for r in ranks:
        frames = _main_thread_frames(_read_dump(dump_paths[r]))
        if frames:
            report[r] = "stack, most recent call first: " + _format_frames(frames)
        else:
            report[r] = "still starting up (its Python stack was not available)"
    return report


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


def _stop_all(procs) -> None:
    """Stop every rank that is still running, and everything it started."""
    alive = [p for p in procs if p.exitcode is None and p.pid is not None]
    for sig in (signal.SIGTERM, getattr(signal, "SIGKILL", signal.SIGTERM)):
        for p in alive:
            _signal_group(p, sig)
        end = time.perf_counter() + STOP_GRACE_S
        for p in alive:
            p.join(max(0.0, end - time.perf_counter()))
        alive = [p for p in alive if p.exitcode is None]
        if not alive:
            break
    for p in procs:
        p.join(0.5)
        if p.exitcode is not None:
            p.close()  # releases the sentinel's file descriptor now, not at garbage collection


def _signal_group(proc, sig) -> None:
    # The rank leads its own process group (see _worker.main); while it is alive and not
    # reaped its pid cannot be reused, so signalling the group is safe.
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, sig)
            return
    except (ProcessLookupError, PermissionError):
        pass  # not yet a group leader (just started): signal the process itself
    try:
        os.kill(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
