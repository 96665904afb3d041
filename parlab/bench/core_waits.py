"""Waiting for a core: a receiver of small messages beside busy ranks, against the pair alone.

The test suite checks the contended half only (tests/test_core_waits.py): that the core
wait is measured and is most of what a tiny message costs among busy ranks. How much
less the pair waits alone is a ratio of two runs' timings, which any other process on
the machine moves (a CI run once read 0.18 s alone against 0.37 s contended, a ratio the
test wanted at least 3): it is printed here, never asserted.
"""
from __future__ import annotations

import os
import statistics
import time

from .registry import benchmark

MESSAGES = 600          # 64-byte messages from rank 0 to rank 1
BUSY_S = 2.0            # how long each of the other ranks computes flat out


def small_messages_beside_busy_ranks(rank: int, world_size: int, messages: int,
                                     busy_s: float) -> int:
    """Rank 0 sends ``messages`` 64-byte tensors to rank 1; ranks 2 and up compute flat out
    for ``busy_s``. Every rank runs on the same two cores (the first two this process may
    use), so on any machine 4 ranks contend for 2 cores as on the course's laptop (where
    there is no affinity call, macOS, on whatever cores the system gives)."""
    import torch

    import parlab
    from parlab.torch import comm
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    comm.barrier()
    x = torch.zeros(16)
    if rank >= 2:
        with parlab.span("spin"):
            end = time.perf_counter() + busy_s
            while time.perf_counter() < end:
                pass
    else:
        for _ in range(messages):
            if rank == 0:
                comm.send(x, dst=1)
            else:
                comm.recv(x, src=0)
    return rank


def receiver(timeline) -> dict:
    """Rank 1's seconds waiting for a core and transferring, from a launch's timeline."""
    row = timeline.summary()[1]
    return {"core_wait_s": row["core_wait_s"], "comm_s": row["comm_s"]}


def report(contended: list[dict], alone: list[dict], messages: int = MESSAGES,
           load: float | None = None) -> list[str]:
    """The lines printed: medians over interleaved rounds, and the contended/alone ratio
    of each round (the two launches of a round ran back to back, so drift hits both)."""
    def med(runs, key):
        return statistics.median(r[key] for r in runs)
    busy_wait, busy_comm = med(contended, "core_wait_s"), med(contended, "comm_s")
    quiet_wait, quiet_comm = med(alone, "core_wait_s"), med(alone, "comm_s")
    ratios = sorted(b["core_wait_s"] / q["core_wait_s"] for b, q in zip(contended, alone)
                    if q["core_wait_s"] > 0)
    n = len(contended)
    where = f", load average {load:.1f} at the start" if load is not None else ""
    lines = [f"receiver of {messages} 64-byte messages, 4 ranks computing beside it on the same "
             f"2 cores: waited for a core {busy_wait * 1e3:.1f} ms "
             f"({busy_wait / messages * 1e3:.2f} ms a message), transfer {busy_comm * 1e3:.1f} ms "
             f"(medians of {n}{where})",
             f"the pair alone: waited for a core {quiet_wait * 1e3:.1f} ms, transfer "
             f"{quiet_comm * 1e3:.1f} ms (medians of {n}, interleaved)"]
    if not ratios:
        return lines + ["contended/alone core wait: no ratio (the pair alone never waited)"]
    left_out = f"; {n - len(ratios)} round(s) whose pair alone never waited left out" \
        if len(ratios) < n else ""
    return lines + [f"contended/alone core wait: {statistics.median(ratios):.1f}x (median of the "
                    f"rounds' ratios; least {ratios[0]:.1f}x, most {ratios[-1]:.1f}x{left_out})"]


@benchmark("core_waits")
def core_waits_bench(quick: bool = False) -> list[str]:
    from parlab import core_waits
    from parlab.launcher import launch
    if not core_waits.MEASURED:
        return ["waiting for a core is not measured on this system: skipped"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    contended, alone = [], []
    for _ in range(3 if quick else 8):
        contended.append(receiver(launch(small_messages_beside_busy_ranks, 6,
                                         args=(MESSAGES, BUSY_S), timeout=120).timeline))
        alone.append(receiver(launch(small_messages_beside_busy_ranks, 2,
                                     args=(MESSAGES, 0.0), timeout=120).timeline))
    return report(contended, alone, MESSAGES, load)
