"""Terms of the summary model priced layer by layer: FSDP's collectives, context
parallelism's ring passes, expert parallelism's all-to-alls (PREDICTIONS).

``sim.summary.predict`` adds each to a step; each takes the layers one device runs (its
pipeline stage) and prices them for one micro-batch with the same ``costs.Roofline``
the compute comes from.

* FSDP (ZeRO-3) overlapped (``fsdp_exposed_s``): one collective per layer and pass, each
  paying its own (n - 1) ring latencies (``collectives.half_ring_time``), not one ring
  over all the parameters: forward each layer's parameters all-gathered, backward
  gathered again and its gradient reduce-scattered (Rajbhandari et al., 2020, section
  5.3; Zhao et al., 2023, "PyTorch FSDP", section 3.3). The collectives run in order on
  one stream beside the compute stream; a gather is issued as soon as at most one other
  layer's gathered parameters are held (FSDP's prefetch of the next layer, its
  rate limiter: Zhao et al., 2023, section 4.4), a layer computes when its gather is
  done, and its reduce-scatter waits for its backward. What shows is the step's end
  beyond the compute: the first gather of each pass, every gather longer than the layer
  before it computes, and the last reduce-scatter.
* Context parallelism (``ring_passes_s``): per block, ring attention passes the rank's K
  and V chunk round the cp ranks, cp - 1 steps forward, and backward the K, V again and
  their gradients, 2 cp - 1 steps (``sim.context``'s count); each step hides behind the
  attention of the block just received (1/cp of the block's attention products) and
  what exceeds it shows (Liu et al., 2023, section 3).
* Expert parallelism (``all_to_all_s``): per mixture-of-experts block, the routed tokens
  dispatched to their experts and combined back, forward and again for their gradients
  backward (GShard, Lepikhin et al., 2020, section 2.2): four all-to-alls over ep ranks
  (six with full recomputation), each rank's tokens 1/tp of them (sequence parallel
  inside tp, as Megatron-Core requires with experts). Not overlapped.
"""
from __future__ import annotations

from .blocks import is_block
from .collectives import all_to_all_time, ring_link
from .gemm import pass_s
from .links import send_s


def fsdp_exposed_s(fwd: list, bwd: list, gather: list, scatter: list,
                   across: list | None = None) -> float:
    """Seconds FSDP's collectives add to one micro-batch of the device's layers, given, in
    forward order, each layer's forward and backward seconds (recomputation included) and
    its gather and (gradient) scatter seconds; across: HSDP's
    all-reduce of each layer's gradient shard between nodes, on a stream of its own (its
    own communicator, over the network cards) after that layer's scatter (see the module
    doc)."""
    k = len(fwd)
    comm = 0.0          # when the collective stream is free
    done = []           # when each layer's forward ends
    for j in range(k):
        held = done[j - 2] if j >= 2 else 0.0          # at most one other layer gathered
        comm = max(comm, held) + gather[j]
        done.append(max(done[-1] if done else 0.0, comm) + fwd[j])
    clock = forward_end = done[-1] if done else 0.0
    end = {}                                           # when each layer's backward ends
    order = list(range(k - 1, -1, -1))
    pending = []                                       # reduce-scatters not yet issued
    nodes = 0.0                                        # when the stream across is free

    def scatter_next():
        nonlocal comm, nodes
        ready, sj = pending.pop(0)
        comm = max(comm, ready) + scatter[sj]
        if across:
            nodes = max(nodes, comm) + across[sj]
    for pos, j in enumerate(order):
        issued = end[order[pos - 2]] if pos >= 2 else forward_end
        while pending and pending[0][0] <= issued:      # scatters issued before this gather
            scatter_next()
        comm = max(comm, issued) + gather[j]
        start = max(clock, comm)
        clock = start + bwd[j]
        end[j] = clock
        pending.append((clock, j))
    while pending:
        scatter_next()
    finish = max(clock, comm, nodes)
    return finish - sum(fwd) - sum(bwd)


def ring_step(net, x, mb: float, t: int, cp: int, c, stride: int) -> tuple:
    """One block's ring attention on a rank holding mb sequences' 1/cp: (the bytes of its K
    and V chunk, the seconds one pass of them takes, the seconds of the block's attention
    products forward and backward on the rank)."""
    link, ab = ring_link(c, cp, stride), net.act_bytes
    qkv, scores = x.gemms[0], x.gemms[1]
    kv_width = (qkv.n - qkv.k) / 2                       # K's (or V's) features
    chunk = 2 * mb * scores.m * kv_width / t * ab        # this rank's K and V
    attention = tuple(g for g in x.gemms if not g.weights)
    unit = getattr(c, "matrix", None)
    if unit is not None:
        fwd = pass_s(unit, attention, mb, t, ab)
        bwd = pass_s(unit, attention, mb, t, ab, backward=True)
    else:
        fwd = sum(g.flops for g in attention) * mb / t / c.flops
        bwd = 2 * fwd
    return chunk, send_s(chunk, link), fwd, bwd


def ring_passes_s(net, layers, mb: float, t: int, cp: int, c, stride: int) -> float:
    """Seconds ring attention's passes show for one micro-batch of the device's layers
    (each rank holds mb sequences' 1/cp; see the module doc)."""
    if cp == 1:
        return 0.0
    again = 2 if net.recompute == "full" else 1
    total = 0.0
    for i in layers:
        x = net.layers[i]
        if not is_block(x):
            continue
        _, step, fwd, bwd = ring_step(net, x, mb, t, cp, c, stride)
        total += again * (cp - 1) * max(0.0, step - fwd / cp)
        total += (2 * cp - 1) * max(0.0, step - bwd / (2 * cp - 1))
    return total


def one_all_to_all_s(net, x, mb: float, t: int, ep: int, c, stride: int) -> float:
    """One dispatch (or combine) of a mixture-of-experts block's routed tokens over ep
    ranks, the rank's tokens 1/tp of them (0 for a dense layer)."""
    routed = x.routed_elems
    return all_to_all_time(c, routed * mb / t * net.act_bytes, ep, stride) if routed else 0.0


def all_to_all_s(net, layers, mb: float, t: int, ep: int, c, stride: int) -> float:
    """Seconds of the device's expert-parallel all-to-alls for one micro-batch (see the
    module doc)."""
    if ep == 1:
        return 0.0
    times = 4 + (2 if net.recompute == "full" else 0)
    return sum(times * one_all_to_all_s(net, net.layers[i], mb, t, ep, c, stride)
               for i in layers)
