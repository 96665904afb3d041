"""Measure latency and bandwidth of point-to-point and collective operations.

A rank function for ``parlab.launch``: ``launch(sweep, 2, kwargs=dict(sizes=sizes))``. Every operation goes
through the traced communication layer, so the sweep also leaves a timeline.
"""
from __future__ import annotations

import time

import torch

from . import comm, runtime

OPS = ("send_recv", "all_reduce", "all_gather", "broadcast")


def default_sizes(max_bytes: int = 16 * 2**20) -> list[int]:
    """Message sizes from 4 bytes to ``max_bytes``, a factor of 4 apart."""
    sizes, s = [], 4
    while s <= max_bytes:
        sizes.append(s)
        s *= 4
    return sizes


def repeats_for(nbytes: int, traffic_bytes: float = 48e6, lo: int = 5, hi: int = 40) -> int:
    """Repetitions per size: many for tiny messages (noisy), few for large (slow), never
    fewer than 5 (a median of 3 let one slow repetition of 16 MB decide, on 2 cores).

    Computed from the size alone, so every rank agrees without talking.
    """
    return int(min(hi, max(lo, traffic_bytes // max(nbytes, 1))))


def rounds(sizes, warmup: int = 2) -> list[list[tuple[int, bool]]]:
    """The order of a sweep: rounds, each a list of (size, timed). Every size is sent in
    each of the ``warmup`` rounds, untimed, then timed ``repeats_for(size)`` times spread
    evenly over the rounds that follow, so that a moment when the machine is busy falls
    on every size alike instead of on whichever size was being measured then. Within a
    timed round the sizes come in an order shuffled by the round's number (every rank
    draws the same): no size always follows the largest, or always comes first."""
    import random
    total = max((repeats_for(n) for n in sizes), default=0)
    order = [[(n, False) for n in sizes] for _ in range(warmup)]
    for i in range(total):
        one = [(n, True) for n in sizes
               if i * repeats_for(n) // total != (i + 1) * repeats_for(n) // total]
        random.Random(i).shuffle(one)
        order.append(one)
    return order


def _time_op(op: str, buf: torch.Tensor, rank: int, world_size: int) -> float:
    """One timed operation. For send_recv: half a ping-pong between ranks 0 and 1."""
    device = buf.device
    runtime.synchronize(device)
    t0 = time.perf_counter()
    if op == "send_recv":
        if rank == 0:
            comm.send(buf, 1)
            comm.recv(buf, 1)
        elif rank == 1:
            comm.recv(buf, 0)
            comm.send(buf, 0)
    elif op == "all_reduce":
        comm.all_reduce(buf)
    elif op == "all_gather":
        comm.all_gather(buf)
    elif op == "broadcast":
        comm.broadcast(buf, 0)
    else:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    runtime.synchronize(device)  # GPU collectives are asynchronous: wait before reading the clock
    elapsed = time.perf_counter() - t0
    return elapsed / 2 if op == "send_recv" else elapsed


def sweep(rank: int, world_size: int, sizes=None, ops=("send_recv", "all_reduce"),
          warmup: int = 2) -> list[dict]:
    """Median (and lower quartile) time of each op at each message size, as seen by rank 0.

    Returns records {op, world_size, bytes, seconds (the median), lower_quartile_s,
    repeats, times_s (every repeat's time, sorted)}; other ranks return [].
    The sizes are taken in turn, round after round (``rounds``). For all_reduce on n
    ranks, the slowest rank decides when the operation is done, so each repetition
    starts after a barrier and rank 0 reports the median.
    """
    if "send_recv" in ops and world_size < 2:
        raise ValueError("send_recv needs at least 2 ranks")
    device = runtime.rank_device()
    sizes = list(sizes or default_sizes())
    bufs = {n: torch.zeros(max(n // 4, 1), dtype=torch.float32, device=device) for n in sizes}
    records = []
    for op in ops:
        times = {n: [] for n in sizes}
        for one_round in rounds(sizes, warmup):
            for nbytes, timed in one_round:
                comm.barrier()  # a fair start for every repetition (shows on the timeline)
                t = _time_op(op, bufs[nbytes], rank, world_size)
                if timed:
                    times[nbytes].append(t)
        for nbytes in sizes:
            ts = sorted(times[nbytes])
            records.append({"op": op, "world_size": world_size, "bytes": bufs[nbytes].numel() * 4,
                            "seconds": ts[len(ts) // 2], "lower_quartile_s": ts[len(ts) // 4],
                            "repeats": len(ts), "times_s": tuple(ts)})
    return records if rank == 0 else []
