"""Pipeline schedules past 1F1B, as orders of F, B and W per device. No framework needed.

* **Interleaved 1F1B** (Narayanan et al., 2021, section 2.2): each device holds ``v``
  chunks, placed round-robin; a micro-batch visits every device v times, so the warm-up
  and cool-down shrink by v and the bubble with them, at v times the hand-overs.
* **ZB-H1** (Qi et al., "Zero Bubble Pipeline Parallelism", 2024, section 3): 1F1B's
  order with the backward split into B (the input's gradient, which the previous stage
  waits for) and W (the weights' gradient, which nobody waits for). Stage s defers its
  W by s slots, so the W's fill the cool-down where 1F1B idles. Peak memory: p
  micro-batches on every stage, 1F1B's peak on stage 0.
* **DualPipeV** (DeepSeek-V3, 2024; the "cut-in-half" DualPipe of deepseek-ai/DualPipe):
  two chunks per device placed in a V (device d holds stages d and 2p-1-d), so the
  first and last stage share device 0; micro-batches enter from the first stage only,
  and one chunk's forward runs beside the other chunk's backward in the steady state.

``bubble(name, ...)`` gives each schedule's bubble share by formula, for passes of
equal cost: forward F, input gradient B, weight gradient W (a full backward is B + W).
"""
from __future__ import annotations

from collections import defaultdict, deque

PLACEMENTS = ("loop", "v")


class Schedule(list):
    """Per-device operation lists (``parlab.pipeline``'s language), with the device's
    chunk count and their placement: "loop" (chunk c of device d is virtual stage
    c·p + d) or "v" (device d holds stages d and 2p-1-d)."""

    def __init__(self, ops, chunks: int = 1, placement: str = "loop"):
        super().__init__(ops)
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if chunks < 1 or (placement == "v" and chunks != 2):
            raise ValueError(f"chunks must be at least 1 (exactly 2 in a V), got {chunks}")
        self.chunks, self.placement = chunks, placement


def check_sizes(stages: int, micro_batches: int) -> None:
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"need at least 1 stage and 1 micro-batch, got {stages} and {micro_batches}")


def interleaved_1f1b(p: int, m: int, v: int = 2) -> Schedule:
    """Interleaved 1F1B: v chunks per device, micro-batches in groups of p.

    Device d warms up with (p - d - 1)·2 + (v - 1)·p forwards, then runs one forward and
    one backward in turn (Megatron-LM's ``forward_backward_pipelining_with_interleaving``);
    forwards visit the chunks in order, backwards in reverse, a group of p at a time.
    """
    check_sizes(p, m)
    if v < 2:
        raise ValueError(f"an interleaved schedule needs chunks >= 2, got {v}")
    if m % p:
        raise ValueError(f"interleaved 1F1B runs micro-batches in groups of the {p} stages: "
                         f"micro_batches={m} must be a multiple of {p}")
    total = m * v

    def unit(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // p) % v
        return (k // (p * v)) * p + k % p, (v - 1 - chunk if backward else chunk)

    out = []
    for d in range(p):
        warm = min((p - d - 1) * 2 + (v - 1) * p, total)
        ops = [("F", *unit(k, False)) for k in range(warm)]
        f, b = warm, 0
        while b < total:
            if f < total:
                ops.append(("F", *unit(f, False)))
                f += 1
            ops.append(("B", *unit(b, True)))
            b += 1
        out.append(ops)
    return Schedule(out, chunks=v)


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1: 1F1B with each backward split into B and W, stage d's W's d slots late.

    Stage d warms up with p - d - 1 forwards, then runs F, B (and from its d-th pair on,
    the oldest W still due) until its forwards are done, then B and W to the end.
    """
    check_sizes(p, m)
    out = []
    for d in range(p):
        warm = min(p - d - 1, m)
        ops = [("F", i, 0) for i in range(warm)]
        due: deque = deque()
        f, b = warm, 0
        while b < m:
            if f < m:
                ops.append(("F", f, 0))
                f += 1
            ops.append(("B", b, 0))
            due.append(b)
            b += 1
            if b > d:                      # the d-th pair on: one W each
                ops.append(("W", due.popleft(), 0))
        ops += [("W", i, 0) for i in due]
        out.append(ops)
    return Schedule(out, chunks=1)


def dualpipev(p: int, m: int) -> Schedule:
    """DualPipeV's order on p devices (2p stages in a V) for m >= 2p micro-batches.

    Its eight phases on device d (chunk 0 = stage d, chunk 1 = stage 2p-1-d):
    (p-d-1)·2 forwards of chunk 0; d+1 pairs of forwards, chunk 0 then 1; p-d-1 times a
    split backward of chunk 1, its W, a forward of chunk 1; the steady state, each slot a
    forward of one chunk beside a backward of the other (run one after the other here);
    p-d-1 times a backward of chunk 1 then a forward of chunk 1 beside a backward of
    chunk 0; d+1 pairs of backwards, the later half split; the rest of chunk 0's
    backwards, each after a W due; the last W's.
    """
    check_sizes(p, m)
    if m < 2 * p:
        raise ValueError(f"DualPipeV needs at least as many micro-batches as stages (2 x {p} "
                         f"devices = {2 * p}), got {m}")
    out = []
    for d in range(p):
        ops: list = []
        nxt: dict = defaultdict(int)
        due: deque = deque()

        def fwd(c):
            ops.append(("F", nxt["F", c], c))
            nxt["F", c] += 1

        def bwd(c, split=False):
            i = nxt["B", c]
            ops.append(("B", i, c))
            nxt["B", c] += 1
            if split:
                due.append((i, c))

        def weight():
            if due:
                i, c = due.popleft()
                ops.append(("W", i, c))

        for _ in range((p - d - 1) * 2):
            fwd(0)
        for _ in range(d + 1):
            fwd(0)
            fwd(1)
        for _ in range(p - d - 1):
            bwd(1, split=True)
            weight()
            fwd(1)
        for _ in range(m - 2 * p + d + 1):
            fwd(0)
            bwd(1)
            fwd(1)
            bwd(0)
        for _ in range(p - d - 1):
            bwd(1)
            fwd(1)
            bwd(0)
        split = False
        for j in range(d + 1):
            split = split or (j == (d + 1) // 2 and d % 2 == 1)
            bwd(1, split)
            split = split or (j == (d + 1) // 2 and d % 2 == 0)
            bwd(0, split)
        for _ in range(p - d - 1):
            weight()
            bwd(0, split)
        while due:
            weight()
        out.append(ops)
    return Schedule(out, chunks=2, placement="v")


def bubble(name: str, p: int, m: int, v: int = 1, f: float = 1.0, b: float = 1.0,
           w: float = 1.0) -> float:
    """The bubble share by formula, with F, B (input gradient) and W costs f, b, w for
    a device's whole share of the model (a full backward costs b + w).

    1F1B and GPipe: (p-1)(F+B+W) idle beside m(F+B+W) of work, (p-1)/(m+p-1).
    Interleaved: chunks of 1/v the work, so the warm-up and cool-down shrink v-fold,
    (p-1)/(v·m+p-1) (Narayanan et al., 2021, eq. in section 2.2.1).
    ZB-H1: (p-1)(F+B-W) idle (Qi et al., 2024, section 3.1; (PP-1)(F+B-2W) in
    DeepSeek-V3's table, whose B is the full backward).
    """
    work = m * (f + b + w)
    if name in ("gpipe", "1f1b"):
        idle = (p - 1) * (f + b + w)
    elif name == "interleaved":
        idle = (p - 1) * (f + b + w) / v
    elif name == "zb-h1":
        idle = (p - 1) * max(f + b - w, 0.0)
    else:
        raise ValueError(f"no formula for {name!r}: use gpipe, 1f1b, interleaved or zb-h1 "
                         "(DualPipeV's bubble: pipeline.simulate)")
    return idle / (work + idle)
