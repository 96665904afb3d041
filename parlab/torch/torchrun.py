"""Run a ``parlab.launch`` rank function under ``torchrun`` (one node or several), unchanged.

torchrun starts the processes and describes the process group in environment variables
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); this module joins that group
with the same setup ``parlab.launch`` uses, runs ``fn(rank, world_size, *args)``, and
gathers results and spans on rank 0::

    torchrun --standalone --nproc-per-node 2 -m parlab run parlab.examples:hello_allreduce
"""
from __future__ import annotations

import os
import re
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import trace
from ..errors import LaunchTimeout
from ..hardware import MODE_ENV
from . import runtime


def under_torchrun() -> bool:
    """True in a process started by torchrun (or any launcher that sets its variables)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run_here(fn, args=(), *, seed: int = 0, timeout_s: float = 600.0):
    """Join torchrun's process group, run the rank function, gather on rank 0.

    Returns ``(results, timeline)`` on rank 0 and ``(None, None)`` elsewhere.
    """
    if not under_torchrun():
        raise RuntimeError("not started by torchrun: RANK, WORLD_SIZE, MASTER_ADDR and "
                           "MASTER_PORT are not all set. Use parlab.launch instead.")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    # $PARLAB_DEVICES as for parlab.devices: "cpu" keeps the ranks on the CPU; "shared-gpu"
    # puts more ranks than GPUs on them, messages through host memory (see runtime)
    mode = os.environ.get(MODE_ENV, "").strip() or "auto"
    shared = mode == "shared-gpu" and local_gpus > 0
    on_gpu = (mode != "cpu" and local_gpus >= local_size and dist.is_nccl_available()) or shared
    trace.install(trace.Recorder(rank))
    started = time.monotonic()
    runtime.init_rank(rank, world_size, backend="nccl" if on_gpu and not shared else "gloo",
                      device_kind="cuda" if on_gpu else "cpu", seed=seed,
                      timeout_s=timeout_s, local_rank=local_rank)
    # monitored_barrier, which names the ranks that did not arrive, runs on gloo alone
    monitor = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    try:
        result = runtime.to_plain(fn(rank, world_size, *args))
        _all_finished(rank, world_size, monitor, timeout_s - (time.monotonic() - started),
                      timeout_s)
        gathered = [None] * world_size if rank == 0 else None
        payload = (result, trace.recorder().spans(), socket.gethostname())
        dist.gather_object(payload, gathered, dst=0)
    finally:
        runtime.finalize()
    if rank != 0:
        return None, None
    results = [g[0] for g in gathered]
    spans = [s for g in gathered for s in g[1]]
    where = "cuda (shared)" if shared else "cuda" if on_gpu else "cpu"
    labels = {r: f"rank {r} · {gathered[r][2]} {where} (torchrun)" for r in range(world_size)}
    return results, trace.Timeline(spans, labels, range(world_size))


def _all_finished(rank: int, world_size: int, group, left_s: float, timeout_s: float) -> None:
    """Wait for every rank to finish its function, within what is left of the timeout.

    Under torchrun no launcher watches the ranks: a rank still working when the time is up
    would only show as a gather that timed out. ``monitored_barrier`` (gloo) instead tells
    rank 0 which ranks did not arrive, and the error names them.
    """
    try:
        dist.monitored_barrier(group=group, timeout=timedelta(seconds=max(left_s, 0.001)),
                               wait_all_ranks=True)
    except RuntimeError as exc:
        text = str(exc)
        late = re.search(r"Ranks? ([\d, ]+) failed to pass", text)
        ranks = [int(r) for r in late.group(1).replace(",", " ").split()] if late else []
        if rank == 0 and ranks:
            raise LaunchTimeout(timeout_s, world_size,
                                {r: "had not finished its rank function (under torchrun: no "
                                    "stack to show)" for r in ranks}) from None
        if rank != 0:
            raise LaunchTimeout(timeout_s, world_size,
                                {rank: "finished, but rank 0 did not confirm that every rank "
                                       "had: see rank 0's error for the ranks still working"}
                                ) from None
        raise
