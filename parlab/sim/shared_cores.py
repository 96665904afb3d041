"""What a wake-up costs on CPU cores that the simulated devices share (``sim.engine``):
how many runnable threads queue per core, how late a blocked receive resumes, and the
wake-ups of a ring collective's steps. Measured on this machine: see ``sim.engine``'s
module notes and ``course.calibrate``."""
from __future__ import annotations


def oversubscription(threads: int, cores: int) -> float:
    """Runnable threads per core when they outnumber the cores; else 1 (and 1 on GPUs)."""
    return threads / cores if cores and threads > cores else 1.0


def wake_after(blocked: float, curve: tuple) -> float:
    """The straight line through the measured (seconds blocked, seconds late) points of
    ``curve`` at ``blocked``, starting from nothing at no block, flat after the last."""
    x0, y0 = 0.0, 0.0
    for x1, y1 in curve:
        if blocked <= x1:
            return y0 + (y1 - y0) * (blocked - x0) / (x1 - x0) if x1 > x0 else y1
        x0, y0 = x1, y1
    return y0


def ring_wakeups_s(members: int, wake_s: float, over: float) -> float:
    """Oversubscribed cores: a ring collective's 2(n - 1) steps are blocking receives,
    each one wake-up (not queued: the other members are blocked in the collective too);
    0 when not oversubscribed."""
    if over <= 1.0 or members < 2:
        return 0.0
    return 2 * (members - 1) * wake_s


def held_s(share: float, program: list, at: int) -> float:
    """How late, on the mean, the data of the isend at ``program[at]`` leaves its rank.

    gloo writes a message on the process's own communication thread (``gloo_tcp_loop``),
    not on the thread that posted it; with the rank pinned to its core, that thread must
    take the core from the rank's main thread. Measured here (2 ranks pinned, a message
    of 16-256 KB, the sender computing 3 ms after posting it): in a quarter of the sends
    the receiver got the data only once the sender's compute had ended, at once in the
    rest; unpinned, in about half (``torch.calibrate.held_sends``). So a send followed by
    computing (a GPipe stage's next micro-batch) is late by ``share`` of the seconds the
    rank computes before it next blocks, where a send followed by a receive (1F1B's) is
    not. ``share``: ``Cluster.held_send_share``, measured pinned; 0 on the presets, where
    NCCL's own threads or kernels move the data.
    """
    if share <= 0:
        return 0.0
    ahead = 0.0
    for op in program[at + 1:]:     # by class name: the engine's op classes import this module
        kind = type(op).__name__
        if kind == "Compute":
            ahead += op.seconds
        elif not (kind == "Send" and not op.blocking):    # anything else may block the rank
            break
    return share * ahead
