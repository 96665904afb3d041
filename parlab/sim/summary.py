"""The summary model (lab 07, and thousands of GPUs): one number per part of a step.

``predict(workload, cluster, plan, global_batch)`` -> ``Prediction``: memory per device
and a step's seconds as compute, bubble, tp, pp, dp and update, without drawing a
timeline (``sim.timelines`` draws those, of at most 64 ranks, ``sim.limits``; this has
no such limit). For a workload made from a ``Network`` (``Workload.of(net)``) each layer is
priced as the timelines price it (``costs.Roofline``: matrix products by shape, element-
wise work, a fixed cost per pass, recomputation) and its tensor-parallel collectives as
``sim.stage`` places them; a workload given only as numbers takes its FLOPs at the rate.

A pipeline of p stages (v model chunks each, interleaved 1F1B, Narayanan et al., 2021,
section 2.2) and m micro-batches runs m slots of its busiest device and idles (p - 1)/v
slots of the mean one (GPipe's (p - 1)/(m + p - 1) when balanced and v = 1). Without
``bounds`` the layers spread evenly over the stages; with them, stage by stage (e.g.
Megatron-LM's: the blocks evenly, the embedding on the first stage, the logits on the
last), and the busiest device sets the pace.

Data parallelism (``sim.collectives`` prices each collective for its group: inside a
node, over every network card across nodes, NVLink SHARP):

* ``zero=0``: one all-reduce of the device's gradients; ``zero`` 1 and 2: a
  reduce-scatter of the gradients and an all-gather of the updated parameters (the
  same bytes; Rajbhandari et al., 2020); ``zero=3`` (FSDP): per micro-batch the
  parameters gathered for the forward and again for the backward, the gradients
  reduce-scattered (1.5x the traffic, the ZeRO paper, section 7.2.1); ``sharding="hsdp"``
  shards within a node and all-reduces the shards across nodes (PyTorch's HYBRID_SHARD).
  Over dp x cp ranks with context parallelism; a mixture of experts' expert weights over
  the dp x cp / ep ranks that hold the same experts.
* ``overlap_dp``: hidden behind compute, as far as it goes: plain data parallel behind
  the last micro-batch's backward (2/3 of its slot: gradients accumulate over the
  others, DDP's no_sync), ZeRO 1/2 behind that backward and the next step's first
  forward (a whole slot: Megatron-Core's overlapped reduce and parameter gather); but
  the last of the workload's ``dp_messages`` buckets is only ready when the backward
  ends, and its exchange always shows. ZeRO-3 of a ``Network`` goes layer by layer: one
  gather or scatter per layer and pass, each with its own ring latencies, prefetched one
  layer ahead (``summary_terms.fsdp_exposed_s``); what the compute cannot cover shows.
* ``overlap_tp``: each layer's tensor-parallel collectives run behind its own compute
  (communication split under the matrix products, as Transformer Engine does) and only
  what exceeds it shows.

* ``Plan(cp=)``: context parallelism: each rank computes 1/cp of every sequence, and
  ring attention's passes of keys and values show where they outlast the attention they
  hide behind (part "cp"); ``Plan(ep=)``: a mixture of experts' experts spread over ep
  ranks, their all-to-alls in part "ep" (``summary_terms``; a ``Network`` workload only).

The update: the device's parameters (its 1/N under ZeRO) read and written at the memory
bandwidth. Everything here is a PREDICTION.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..split import check_bounds
from .blocks import check_expert_parallel
from .checks import count, expert_ranks
from .costs import Roofline
from .collectives import (all_reduce_time, cards_per_device, describe, half_ring_time,
                          members_per_node, spans_nodes)
from .links import Link, send_s
from .sharding import check_zero, sharded_states
from .summary_terms import all_to_all_s, fsdp_exposed_s, ring_passes_s

AXES = ("dp", "pp", "tp")      # the default order: tensor parallel innermost (fastest)
SHARDINGS = ("", "fsdp", "hsdp")


@dataclass(frozen=True)
class Plan:
    """A mesh shape: dp × pp × tp (× cp) devices, m micro-batches, and the axes' order.

    order: outermost first, the last varying fastest (innermost, the fastest links).
    cp: context parallelism, each sequence split over cp ranks placed just outside tp
    (Megatron-Core's order tp, cp, dp, pp). ep: expert parallelism, the experts of a
    mixture-of-experts layer spread over ep of the dp x cp ranks (which divide by it).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    order: tuple = AXES
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "micro_batches", "cp", "ep"):
            count("Plan", name, getattr(self, name))
        if sorted(self.order) != sorted(AXES):
            raise ValueError(f"Plan: order must name each of {AXES} once (outermost first), "
                             f"got {self.order!r}")
        expert_ranks("Plan", self.dp, self.cp, self.ep)

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def span(self, axis: str) -> int:
        """Consecutive devices covered by a group of ``axis`` and every faster axis (cp
        sits just outside tp)."""
        if axis == "cp":
            return self.span("tp") * self.cp
        i = self.order.index(axis)
        inner = self.order[i:]
        return math.prod(getattr(self, a) for a in inner) * (
            self.cp if "tp" in inner and axis != "tp" else 1)

    def label(self) -> str:
        used = [f"{a} {getattr(self, a)}" for a in (*self.order, "cp", "ep")
                if getattr(self, a) > 1]
        return " × ".join(used) or "one device"


@dataclass
class Prediction:
    """The cost model's answer for one plan. Every number is PREDICTED."""

    plan: Plan
    memory: dict                    # bytes per device: states, activations, total
    fits: bool
    parts: dict                     # seconds per step: compute, bubble, tp, pp, dp, update
    links: dict = field(default_factory=dict)   # axis -> "intra" / "inter"
    paths: dict = field(default_factory=dict)   # axis -> how its exchanges travel, in words

    @property
    def step_s(self) -> float:
        return sum(self.parts.values())


def predict(w, c, plan: Plan, global_batch: int, *, overlap_dp: bool = False, zero: int = 0,
            sharding: str = "", chunks: int = 1, bounds=None,
            overlap_tp: bool = False) -> Prediction:
    """Memory per device and the time of one training step for ``plan`` (PREDICTED); see
    the module doc. chunks: model chunks per pipeline device (interleaved 1F1B); bounds:
    the p * chunks - 1 cut points between stages (None: an even spread)."""
    if plan.devices > c.devices:
        raise ValueError(f"{plan.label()} needs {plan.devices} devices; {c.name} has {c.devices}")
    if global_batch % plan.dp or (global_batch // plan.dp) % plan.micro_batches:
        raise ValueError(f"a global batch of {global_batch} does not split into dp={plan.dp} "
                         f"replicas of m={plan.micro_batches} micro-batches")
    zero = check_zero(zero)
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding must be one of {SHARDINGS}, got {sharding!r}")
    b = global_batch // plan.dp                  # the replica's samples
    m, p, t, cp = plan.micro_batches, plan.pp, plan.tp, plan.cp
    v = count("predict", "chunks", chunks)      # checked with or without a pipeline
    v = v if p > 1 else 1
    net = w.network
    if (cp > 1 or plan.ep > 1) and net is None:
        raise ValueError("context and expert parallelism need a workload made from a "
                         "Network (sim.Workload.of(net)): its layers say what they split")
    if net is not None:
        check_expert_parallel(net, plan.ep, "predict")
    link = {a: c.link(plan.span(a)) for a in plan.order}
    stride = {a: plan.span(a) // getattr(plan, a) for a in (*plan.order, "cp")}
    mb = b / m / cp                              # each rank's share of a micro-batch
    dev = _devices(w, c, mb, t, p, v, bounds, stride["tp"], plan.ep)
    busiest = max(range(p), key=lambda d: dev["compute"][d] + dev["tp"][d])
    slot_c, slot_t = dev["compute"][busiest], dev["tp"][busiest]
    if overlap_tp:
        slot_t = max(0.0, slot_t - slot_c)
    mean = sum(dev["compute"][d] + dev["tp"][d] for d in range(p)) / p
    parts = {"compute": m * slot_c, "bubble": (p - 1) / v * mean, "tp": m * slot_t}
    parts["pp"] = 0.0 if p == 1 else (m + p - 1) * 2 * v * _boundary_s(w, c, mb, t, link,
                                                                           stride["tp"])
    mine = dev["layers"][busiest]
    if cp > 1 or plan.ep > 1:
        parts["cp"] = m * ring_passes_s(net, mine, mb, t, cp, c, stride["cp"])
        parts["ep"] = m * all_to_all_s(net, mine, mb, t, plan.ep, c, stride["dp"])
    params = dev["params"][busiest]              # on one tp rank of the busiest stage
    experts = dev["experts"][busiest]            # of which the experts' (1/ep of them)
    n, dp_stride = plan.dp * cp, stride["cp"] if cp > 1 else stride["dp"]
    dp_s, shards = _data_parallel_s(w, c, n, params - experts, m, zero, sharding, dp_stride)
    if experts:                                  # reduced over the ranks holding the same ones
        e_s, _ = _data_parallel_s(w, c, n // plan.ep, experts, m, zero, sharding,
                                  dp_stride * plan.ep)
        dp_s += e_s
    window = {0: 2 / 3 * (slot_c + slot_t), 1: slot_c + slot_t, 2: slot_c + slot_t,
              3: m * (slot_c + slot_t)}[zero]
    # the last bucket's exchange (ZeRO 1/2: and the first one's gather) starts only when
    # the backward has made it: it never hides (w.dp_messages buckets of equal size)
    tail = dp_s / w.dp_messages if zero < 3 else 0.0
    parts["dp"] = max(tail, dp_s - window) if overlap_dp else dp_s
    # FSDP layer by layer (with experts, whose weights shard over fewer ranks than the
    # rest: the rings over all of them above)
    if zero == 3 and overlap_dp and net is not None and n > 1 and not experts:
        parts["dp"] = m * _fsdp_s(net, c, dev, mine, t, n, sharding, dp_stride)
    if net is not None:
        parts["update"] = c.layer_overhead_s + params / (shards if zero else 1) * \
            net.update_bytes / c.memory_bandwidth_Bps
    memory = _memory(w, plan, b / m / cp, params, zero, shards, experts)
    used = [a for a in plan.order if getattr(plan, a) > 1]
    where = {a: ("inter" if (link[a] is not c.intra if a == "pp" else
                             spans_nodes(c, getattr(plan, a), stride[a])) else "intra")
             for a in used}
    paths = {a: (f"{'inside a node' if where[a] == 'intra' else 'between nodes'}: "
                 f"{link[a].bandwidth_Bps / 1e9:,.0f} GB/s point to point") if a == "pp"
             else describe(c, getattr(plan, a), stride[a]) for a in used}
    return Prediction(plan, memory, memory["total"] <= c.memory_bytes, parts, where, paths)


def _devices(w, c, mb: float, t: int, p: int, v: int, bounds, tp_stride: int = 1,
             ep: int = 1) -> dict:
    """Per pipeline device, one micro-batch's compute and tp seconds, its parameters (on
    one tp rank; the experts' 1/ep of them), the experts' part, and its layers."""
    net = w.network
    if net is None:                              # numbers only: FLOPs at the rate
        comp = w.flops_per_sample * mb / t / c.flops + 2 * w.layers * c.layer_overhead_s
        tp = 0.0 if t == 1 else w.tp_messages * all_reduce_time(
            c, w.tp_bytes * mb / w.tp_messages, t, tp_stride)
        return {"compute": [comp / p] * p, "tp": [tp / p] * p,
                "params": [w.params / (t * p)] * p, "experts": [0.0] * p, "layers": [[]] * p}
    r = Roofline(net, c)
    fwd, bwd, tps = [], [], []
    paired = [i for i, x in enumerate(net.layers) if not x.tp_all_reduces]
    for i in range(len(net)):
        s = r.backward_s(i, mb, t)
        if net.recompute == "full":
            s += r.forward_s(i, mb, t)
        elif net.recompute == "selective":
            s += r.recompute_s(i, mb, t)
        fwd.append(r.forward_s(i, mb, t))
        bwd.append(s)
        tps.append(_layer_tp_s(net, c, i, mb, t, paired, tp_stride))
    comp = [f + b for f, b in zip(fwd, bwd)]
    experts = [x.expert_params / (t * ep) for x in net.layers]
    sizes = [(x.params - x.expert_params) / t + e for x, e in zip(net.layers, experts)]
    passes = {"fwd": fwd, "bwd": bwd}        # per layer (forward, backward with recomputation)
    if bounds is None:
        return {**passes, "compute": [sum(comp) / p] * p, "tp": [sum(tps) / p] * p,
                "params": [sum(sizes) / p] * p, "experts": [sum(experts) / p] * p,
                "layers": [list(range(len(net)))] * p if p == 1 else
                [list(range(d * len(net) // p, (d + 1) * len(net) // p)) for d in range(p)]}
    edges = [0, *check_bounds(bounds, len(net), p * v), len(net)]
    out = {**passes, "compute": [0.0] * p, "tp": [0.0] * p, "params": [0.0] * p,
           "experts": [0.0] * p, "layers": [[] for _ in range(p)]}
    for k, (a, z) in enumerate(zip(edges, edges[1:])):
        for key, values in (("compute", comp), ("tp", tps), ("params", sizes),
                            ("experts", experts)):
            out[key][k % p] += sum(values[a:z])
        out["layers"][k % p] += list(range(a, z))
    return out


def _layer_tp_s(net, c, i: int, mb: float, t: int, paired: list, stride: int = 1) -> float:
    """Layer i's tensor-parallel collectives for one micro-batch, forward and backward
    (and the forward's again under full recomputation), as ``sim.stage`` places them:
    a Megatron block all-reduces its output per part forward and its input's gradient
    backward; plain layers pair column-then-row (``model._tp_exchanges``)."""
    if t == 1:
        return 0.0
    layer, ab = net.layers[i], net.act_bytes
    out_b, in_b = layer.out_elems * mb * ab, net.out_elems(i - 1) * mb * ab
    again = 2 if net.recompute == "full" else 1

    def ar(nbytes):
        return all_reduce_time(c, nbytes, t, stride)
    if layer.tp_all_reduces:
        r = layer.tp_all_reduces
        return again * r * ar(out_b) + (r * ar(in_b) if i > 0 else 0.0)
    k = paired.index(i)
    if k % 2 == 1:
        return again * ar(out_b)
    return ar(in_b) if 0 < k < len(paired) - 1 else 0.0


def _boundary_s(w, c, mb: float, t: int, link: dict, tp_stride: int = 1) -> float:
    """One activation (or gradient) between stages: each tp rank sends 1/t of it and the
    receivers all-gather it (Narayanan et al., 2021, section 4.1). Between nodes every
    device sends at once: a node with fewer network cards than devices shares them."""
    nbytes, pp = w.boundary_bytes * mb, link["pp"]
    if pp is c.inter and cards_per_device(c) < 1:
        pp = Link(pp.latency_s, pp.bandwidth_Bps * cards_per_device(c))
    if t == 1:
        return send_s(nbytes, pp)
    return send_s(nbytes / t, pp) + half_ring_time(c, nbytes, t, tp_stride)


def _fsdp_s(net, c, dev: dict, layers, t: int, n: int, sharding: str, stride: int) -> float:
    """FSDP's collectives that show in one micro-batch, layer by layer
    (``summary_terms.fsdp_exposed_s``); HSDP: sharded within a node, each layer's
    gradient shard all-reduced across nodes after its reduce-scatter."""
    g = members_per_node(c, n, stride) if sharding == "hsdp" else n
    sizes = [net.layers[i].params / t for i in layers]
    gather = [half_ring_time(c, x * net.state["params"], g, stride) for x in sizes]
    scatter = [half_ring_time(c, x * net.grad_wire_bytes, g, stride) for x in sizes]
    across = [all_reduce_time(c, x * net.grad_wire_bytes / g, n // g, stride * g)
              for x in sizes] if g < n else None
    return fsdp_exposed_s([dev["fwd"][i] for i in layers], [dev["bwd"][i] for i in layers],
                          gather, scatter, across)


def _data_parallel_s(w, c, n: int, params: float, m: int, zero: int, sharding: str,
                     stride: int) -> tuple[float, int]:
    """(seconds of the step's data-parallel collectives over n ranks, ranks the states
    are sharded over): see the module doc."""
    if n == 1:
        return 0.0, 1
    grads = params * w.grad_bytes_per_param
    net = w.network
    weights = params * (net.state["params"] if net is not None else w.grad_bytes_per_param)
    if zero == 0:
        return w.dp_messages * all_reduce_time(c, grads / w.dp_messages, n, stride), n
    if zero in (1, 2):
        return half_ring_time(c, grads, n, stride) + half_ring_time(c, weights, n, stride), n
    g = members_per_node(c, n, stride) if sharding == "hsdp" else n
    s = m * (2 * half_ring_time(c, weights, g, stride) + half_ring_time(c, grads, g, stride))
    if g < n:                                    # the shards all-reduced across nodes
        s += all_reduce_time(c, grads / g, n // g, stride * g)
    return s, g


def _memory(w, plan: Plan, mb: float, params: float, zero: int, shards: int,
            experts: float = 0.0) -> dict:
    """Bytes per device: the states of its parameters (sharded by ZeRO; of them the
    experts' over the ranks that hold the same experts), the activations of the (per-rank
    share of the) micro-batches in flight (1F1B: at most p on the first stage) / pp, their
    tp-split part / tp."""
    net = w.network
    if net is not None:
        states = sum(sharded_states(params - experts, net.state, shards, zero).values()) + \
            sum(sharded_states(experts, net.state, max(1, shards // plan.ep), zero).values())
    else:
        states = params * w.state_bytes_per_param
    in_flight = mb * min(plan.pp, plan.micro_batches)
    acts = in_flight * (w.act_split_bytes / plan.tp + w.act_whole_bytes) / plan.pp
    return {"states": states, "activations": acts, "total": states + acts}


def plans(devices: int, axes=("dp", "tp"), *, micro_batches: int = 1, order=AXES) -> list[Plan]:
    """Every way to arrange ``devices`` over ``axes`` (the others 1), dp largest first."""
    out = []
    for combo in _factorizations(devices, len(axes)):
        kw = dict(zip(axes, combo))
        if kw.get("pp", 1) > 1:
            kw["micro_batches"] = micro_batches
        out.append(Plan(order=order, **kw))
    return sorted(out, key=lambda q: (-q.dp, -q.pp, q.tp))


def _factorizations(n: int, k: int) -> list[tuple]:
    if k == 1:
        return [(n,)]
    return [(d, *rest) for d in range(1, n + 1) if n % d == 0
            for rest in _factorizations(n // d, k - 1)]
