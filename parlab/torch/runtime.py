"""What a PyTorch rank sets up before its rank function runs, and tears down after.

The same setup serves ``parlab.launch`` (ranks meet through a file in a private folder) and
``torchrun`` (a process group described by environment variables), so one rank function
runs unchanged under both.
"""
from __future__ import annotations

import statistics

import gc
import os
import random
import socket
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from .. import trace

# How many ping-pongs per rank when estimating clock offsets; the one with the
# shortest round trip wins (Cristian, "Probabilistic clock synchronization", 1989).
CLOCK_SAMPLES = 8

# How the traced layer (comm.py) moves tensors: "off" (the backend takes them as they are),
# "cuda" (ranks share a GPU: CUDA tensors go through host memory, see comm.py), or "all"
# (every tensor is copied through a host buffer: lets the tests run that path on a CPU).
_STAGING = "off"


class CudaEventTimer:
    """Span timestamps from CUDA events, mapped onto the host clock.

    A host clock read around an asynchronous kernel launch measures the launch, not the
    kernel. Events are recorded on the device's stream (the current one when the timer
    is made: the course's code runs on it), so they mark when the GPU reached that point.
    One reference event, recorded on an idle stream at a known host time, converts event
    times to host seconds.

    A mark is cheap only if its event is: creating a CUDA event and looking up the
    current stream cost the host most of the 33 us a span took on an H100 (two marks).
    So events are reused: every so often the times of the events the GPU has already
    passed are read (``query`` does not block) and those events go back to a free list.
    A mark returns a slot number; ``resolve`` waits for the GPU only for an event it has
    not passed yet.
    """

    FIRST_HARVEST = 256          # marks pending before their times are first read

    def __init__(self, device, clock=time.perf_counter):
        self.device = device
        self.stream = torch.cuda.current_stream(device)
        torch.cuda.synchronize(device)
        self.reference = torch.cuda.Event(enable_timing=True)
        self.reference.record(self.stream)
        torch.cuda.synchronize(device)
        self.reference_host = clock()
        self._free: list = []           # events whose time was read: ready to record again
        self._pending: list = []        # (event, slot) recorded, time not read yet
        self._times: list = []          # slot -> host seconds, None until read
        self._harvest_at = self.FIRST_HARVEST

    def mark(self) -> int:
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        slot = len(self._times)
        self._times.append(None)
        self._pending.append((event, slot))
        if len(self._pending) >= self._harvest_at:
            self._harvest()
            # where the GPU lags far behind, read less often: each read walks the pending list
            self._harvest_at = max(self.FIRST_HARVEST, 2 * len(self._pending))
        return slot

    def _harvest(self) -> None:
        """Read the times of the events the GPU has passed and free those events."""
        waiting = []
        for event, slot in self._pending:
            if event.query():
                self._times[slot] = self.reference_host + self.reference.elapsed_time(event) / 1e3
                self._free.append(event)
            else:
                waiting.append((event, slot))
        self._pending = waiting

    def resolve(self, slot: int) -> float:
        if self._times[slot] is None:
            self.stream.synchronize()   # the GPU has then passed every event recorded so far
            self._harvest()
        return self._times[slot]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def loopback_interface() -> str | None:
    """Name of the loopback interface ('lo' on Linux, 'lo0' on macOS), if there is one."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


def init_rank(rank: int, world_size: int, *, backend: str, device_kind: str,
              store_path: str | None = None,
              master_addr: str | None = None, master_port: int | None = None,
              seed: int = 0, threads: int | None = None, timeout_s: float = 600.0,
              local_rank: int | None = None) -> None:
    """Join the process group and prepare this rank's recorder.

    With ``store_path`` the ranks meet through a file store at that path (what
    ``parlab.launch`` does: one machine, no network port); with ``master_port`` the rank
    connects to a TCP store at that address; with neither, it reads torchrun's
    environment (``env://``).
    """
    if threads:
        torch.set_num_threads(threads)
    seed_everything(seed + rank)  # different data order per rank, reproducible per run
    local_rank = rank if local_rank is None else local_rank
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    timeout = timedelta(seconds=timeout_s)
    global _STAGING
    # CUDA ranks on plain gloo: several ranks share a GPU (NCCL would refuse them,
    # "Duplicate GPU detected"), or there is no NCCL. gloo sends only CPU tensors, so the
    # traced layer stages theirs through host memory.
    _STAGING = "cuda" if device_kind == "cuda" and backend == "gloo" else "off"
    if backend == "nccl":
        # NCCL carries only CUDA tensors; a rank function that keeps some tensors on the CPU
        # (most of the course's do, to run anywhere) sends those through gloo.
        backend = "cpu:gloo,cuda:nccl"
    # torch reads TORCH_DISTRIBUTED_DEBUG once, when it is imported. A rank forked from
    # the fork server imported torch before the launch's env= reached it: read it again,
    # or DETAIL's collective checks (a wrapper around the group, made here) never start.
    dist.set_debug_level_from_env()
    if store_path is not None or master_port is not None:
        dist.init_process_group(backend, store=_connect_store(store_path, master_addr,
                                                              master_port, world_size, timeout),
                                rank=rank, world_size=world_size, timeout=timeout)
    else:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    rec = trace.recorder()
    rec.rank = rank
    if device_kind == "cuda":
        rec.timer = CudaEventTimer(torch.cuda.current_device(), rec.timer.clock)
    align_clocks()


def _connect_store(store_path, master_addr, master_port, world_size, timeout):
    if store_path is not None:
        # A file in a folder only this user can enter: unlike a TCPStore, which listens on
        # every interface whatever host it is given, it is reachable from nowhere else.
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(timeout)
        return store
    return dist.TCPStore(master_addr or "127.0.0.1", master_port, world_size,
                         is_master=False, timeout=timeout)


def uses_gpus() -> bool:
    """True when this rank's process group moves CUDA tensors with NCCL."""
    return "nccl" in str(dist.get_backend()) and torch.cuda.is_available()


def shares_gpu() -> bool:
    """True when this rank computes on a GPU but sends through host memory over gloo.

    That is ranks sharing a GPU (NCCL refuses them), or a torch built without NCCL.
    """
    return _STAGING == "cuda"


def host_staging() -> str:
    """"off", "cuda" (CUDA tensors travel through host memory) or "all" (tests)."""
    return _STAGING


def stage_through_host(how: str = "all") -> str:
    """Set how the traced layer stages tensors; returns the previous setting.

    Used by tests to run the shared-GPU path with CPU tensors (how="all"); a rank of a
    shared-GPU launch gets "cuda" from ``init_rank``.
    """
    global _STAGING
    if how not in ("off", "cuda", "all"):
        raise ValueError(f"how must be 'off', 'cuda' or 'all', got {how!r}")
    before, _STAGING = _STAGING, how
    return before


def rank_device() -> torch.device:
    """The device this rank computes on: its GPU (own under NCCL, or shared), else the CPU."""
    if shares_gpu() or uses_gpus():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def library_device() -> torch.device:
    """The device for code that hands tensors to torch.distributed itself.

    DTensor, FSDP2 and ``torch.distributed.pipelining`` call the backend directly, past
    the traced layer's host staging. gloo takes CUDA tensors for broadcast and all_reduce
    (torch.distributed's backend table; its source also copies all_gather through the
    host), not for send/recv or reduce-scatter, which these need. So ranks sharing a GPU
    run those library demonstrations on the CPU (the README's GPU section says so). DDP
    stays on the GPU: its set-up uses broadcast and all_gather, and its buckets go
    through the traced hook.
    """
    return torch.device("cpu") if shares_gpu() else rank_device()


def _comm_device() -> torch.device:
    return library_device()   # the clock ping-pong below calls torch.distributed directly


def align_clocks(force_estimate: bool = False) -> float:
    """Set this rank's clock offset to rank 0's clock; returns the offset in seconds.

    Ranks on one host share the operating system's monotonic clock (``perf_counter``),
    so their offset is exactly zero. Across hosts (or with ``force_estimate``) each rank
    estimates it from ping-pongs with rank 0, keeping the sample with the shortest round
    trip: the error is at most half that round trip.
    """
    rec = trace.recorder()
    clock = getattr(rec.timer, "clock", time.perf_counter)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    hosts = [None] * world_size
    dist.all_gather_object(hosts, socket.gethostname())
    if not force_estimate and len(set(hosts)) == 1:
        rec.offset = 0.0
        return 0.0
    device = _comm_device()
    ping = torch.zeros(1, dtype=torch.float64, device=device)
    pong = torch.zeros(1, dtype=torch.float64, device=device)
    best_rtt, offset = float("inf"), 0.0
    for peer in range(1, world_size):
        for _ in range(CLOCK_SAMPLES):
            if rank == 0:
                dist.recv(ping, src=peer)
                pong.fill_(clock())
                dist.send(pong, dst=peer)
            elif rank == peer:
                t0 = clock()
                dist.send(ping, dst=0)
                dist.recv(pong, src=0)
                t1 = clock()
                if t1 - t0 < best_rtt:
                    best_rtt, offset = t1 - t0, float(pong.item()) - (t0 + t1) / 2
    rec.offset = offset if rank else 0.0
    return rec.offset


def to_plain(obj):
    """Tensors become numpy arrays (recursively), so results outlive the rank.

    A tensor handed to multiprocessing is shared through a file descriptor that dies
    with the process that made it; numpy arrays are copied.
    """
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [to_plain(v) for v in obj]
        return type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
    return obj


def finalize() -> None:
    """Leave the process group cleanly.

    Ranks that used DDP or DTensor can abort at interpreter exit when the process group
    is destroyed while C++ objects (reducers, meshes) still refer to it. Collecting
    garbage first drops those objects while the group still exists; the launcher then
    ends the process with ``os._exit`` so no static destructor runs afterwards.
    """
    gc.collect()
    if dist.is_initialized():
        if uses_gpus() or shares_gpu():
            torch.cuda.synchronize()
        dist.destroy_process_group()


def threads_for(simulated: bool, world_size: int) -> int:
    """One thread per simulated device; GPU ranks share the cores for host work.

    Simulated ranks sharing a few cores with default threading oversubscribe them badly
    (measured: 30 DDP steps on 4 ranks took 4.1 s with default threads, 0.46 s with one).
    """
    if simulated:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // world_size)


def synchronize(device=None) -> None:
    """Wait for this rank's GPU work to finish, so a host clock read after it is honest.

    CUDA kernels run asynchronously: a host timer around a launch measures the launch.
    On the CPU there is nothing to wait for.
    """
    if device is None:
        if not dist.is_initialized():
            return
        device = rank_device()
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_once(fn, *, before=None, device=None) -> float:
    """Seconds of one call of ``fn()``, timed between two ``synchronize(device)``: on a
    GPU the queued kernels count, not their launch. ``before()`` runs untimed ahead of
    the call (a barrier, so that every rank starts the call together)."""
    if before is not None:
        before()
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def timed_median(fn, repeats: int, *, warmup: int = 1, before=None, device=None) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls (``timed_once``), after ``warmup``
    untimed ones. The median, not the mean: on a shared machine a few calls are delayed
    by other processes and the mean follows them.
    """
    samples = [timed_once(fn, before=before, device=device) for _ in range(warmup + repeats)]
    return float(statistics.median(samples[warmup:]))
