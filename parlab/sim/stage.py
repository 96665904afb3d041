"""The mesh of ranks and what one rank's stage does in a pass: its layers' compute and
their tensor-parallel collectives.

``Mesh``: dp × pp × tp ranks laid out as ``parlab.mesh`` does (tp fastest), each axis's
collectives priced by ``sim.collectives`` (its group's size and stride: inside a node,
across nodes over every card, NVLink SHARP), point-to-point sends over the link between
the stages' devices. ``Stage``: the layers of one pipeline stage (or chunk) on one rank,
sliced over tp: a Megatron block computes and all-reduces twice per pass (Shoeybi et
al., 2019, figure 4); plain linear layers pair column-then-row.
"""
from __future__ import annotations

from .checks import amount, count
from .collectives import all_reduce_time, half_ring_time
from .costs import Network, call_s, weight_grad_s
from .engine import Collective, Compute
from .model import Cluster


def all_gather_s(nbytes: float, n: int, link, overhead: float = 0.0) -> float:
    """Ring all-gather of S bytes in all (S/n from each rank): (n-1) alpha + (n-1)/n S/beta."""
    n = count("all_gather_s", "n (ranks)", n)
    nbytes = amount("all_gather_s", "nbytes", nbytes, unit="bytes")
    overhead = amount("all_gather_s", "overhead", overhead, unit="seconds")
    if n == 1:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bandwidth_Bps + overhead


class Mesh:
    """dp × pp × tp ranks, tp fastest (``parlab.mesh``'s order); each axis's collectives and
    the point-to-point link between neighbouring stages."""

    def __init__(self, cluster: Cluster, dp: int, pp: int, tp: int):
        self.dp, self.pp, self.tp = dp, pp, tp
        self.size = dp * pp * tp
        if self.size > cluster.devices:
            raise ValueError(f"{dp} × {pp} × {tp} (dp × pp × tp) needs {self.size} devices; "
                             f"{cluster.name} has {cluster.devices}: use a cluster with more "
                             "devices or a smaller mesh")
        span = {"tp": tp, "pp": pp * tp, "dp": self.size}
        self.link = {a: cluster.link(span[a]) for a in span}
        self.stride = {"tp": 1, "pp": tp, "dp": pp * tp}
        self.cluster = cluster
        self.overhead = cluster.collective_overhead_s
        self.wake = getattr(cluster, "wake_latency_s", 0.0)
        self.wake_curve = getattr(cluster, "wake_curve", ())
        self.handoff = getattr(cluster, "handoff_s", ()) or (0.0, 0.0)
        self.held = getattr(cluster, "held_send_share", 0.0)
        self.tp_operator = getattr(cluster, "tp_operator_s", 0.0)
        self.cores = getattr(cluster, "cores", 0)
        self.spread = (getattr(cluster, "message_spread_s", ()),
                       getattr(cluster, "collective_spread_s", ()))

    def engine_settings(self) -> dict:
        """What the engine takes from the cluster (``engine.run``, ``engine.Engine``)."""
        return {"wake_s": self.wake, "cores": self.cores, "spread": self.spread,
                "wake_curve": self.wake_curve, "handoff": self.handoff, "held": self.held}

    def rank(self, d: int, s: int, t: int) -> int:
        return (d * self.pp + s) * self.tp + t

    def tp_group(self, d, s) -> tuple:
        return tuple(self.rank(d, s, t) for t in range(self.tp))

    def dp_group(self, s, t) -> tuple:
        return tuple(self.rank(d, s, t) for d in range(self.dp))

    def all_reduce_s(self, axis: str, nbytes: float) -> float:
        """An all-reduce of ``nbytes`` over the axis's group (``collectives.all_reduce_time``)."""
        return all_reduce_time(self.cluster, nbytes, getattr(self, axis), self.stride[axis])

    def half_ring_s(self, axis: str, nbytes: float) -> float:
        """A reduce-scatter or an all-gather of an ``nbytes`` buffer over the axis's group."""
        return half_ring_time(self.cluster, nbytes, getattr(self, axis), self.stride[axis])


class Stage:
    """The layers one rank runs (a pipeline stage, sliced over tp), and their transfers.

    The network's training options shape the passes: ``net.recompute`` ("full": every
    layer's forward again, its collectives too, before its backward; "selective": only
    attention's products and element-wise work, Korthikanti et al., 2022, section 5) and
    ``net.sequence_parallel`` (the work tp ranks repeated, split; a block's all-reduces
    become reduce-scatters and all-gathers of the same bytes in all, section 4.2.2).
    sharder: ZeRO-3 / FSDP's parameter gathers around each layer (``sim.sharding``).
    """

    def __init__(self, net: Network, costs, layers: range, mesh: Mesh, scheme: str,
                 sharder=None):
        self.net, self.costs, self.layers, self.mesh, self.scheme = net, costs, layers, mesh, scheme
        self.sharder = sharder

    def _sliced(self, i: int) -> int:
        """tp degree layer i is sliced by: an unpaired last layer stays whole (column_row)."""
        tp = self.mesh.tp
        if tp == 1 or self.scheme == "naive" or self.net.layers[i].tp_all_reduces:
            return tp
        k = i - self.layers.start
        return tp if (k % 2 == 1 or k + 1 < len(self.layers)) else 1

    def tp_collective(self, group, nbytes, seconds, what, name) -> list:
        """A tensor-parallel collective ``what`` inside the pass ``name``, then what it
        costs the rank beyond itself (``Cluster.tp_operator_s``, measured: the autograd
        function that calls it, resuming after it; nothing on the presets): lab 03's ranks
        computed 0.2-0.4 ms longer after each collective than its layers predicted."""
        ops = [Collective(group, nbytes, seconds, what, "tp")]
        operator = self.mesh.tp_operator
        return ops + [Compute(name, operator)] if operator > 0 else ops

    def _layer_forward(self, name: str, i: int, k: int, batch: float, group: tuple) -> list:
        m, ab = self.mesh, self.net.act_bytes
        out = self.net.layers[i].out_elems * batch * ab
        blocks = self.net.layers[i].tp_all_reduces
        if m.tp > 1 and blocks:         # a Megatron block: compute, all-reduce, twice
            return self._block(name, self.costs.forward_s(i, batch, m.tp), out, blocks, group, i)
        ops = [Compute(name, self.costs.forward_s(i, batch, self._sliced(i)), i)]
        if m.tp == 1:
            return ops
        if self.scheme == "naive":      # every layer's slices gathered whole
            ops += self.tp_collective(group, out / m.tp, m.half_ring_s("tp", out),
                                      "all-gather", name)
        elif k % 2 == 1:                 # a row-parallel layer: add the partial outputs
            ops += self.tp_collective(group, out, m.all_reduce_s("tp", out), "all-reduce", name)
        return ops

    def _call(self, name: str, which: int) -> list:
        """The pass's own call, paid once per pass whatever its layers (``costs.call_s``)."""
        seconds = call_s(self.costs)[which]
        return [Compute(name, seconds)] if seconds > 0 else []

    def forward(self, name: str, batch: float, group: tuple) -> list:
        ops = self._call(name, 0)
        for k, i in enumerate(self.layers):
            if self.sharder:
                ops += self.sharder.before(i, forward=True)
            ops += self._layer_forward(name, i, k, batch, group)
            if self.sharder:
                ops += self.sharder.after(i, forward=True)
        return ops

    def recompute(self, name: str, batch: float, group: tuple) -> list:
        """What activation recomputation runs again before this stage's backward pass."""
        how = self.net.recompute
        if how == "full":
            return [op for k, i in enumerate(self.layers)
                    for op in self._layer_forward(name, i, k, batch, group)]
        if how == "selective":
            return [Compute(name, self.costs.recompute_s(i, batch, self._sliced(i)), i)
                    for i in self.layers if self.net.layers[i].attention_elems]
        return []

    def backward(self, name: str, batch: float, group: tuple, split: bool = False) -> list:
        """The backward pass, from the last layer. split: the input's gradient only, a
        split backward's B (Qi et al., 2024), whose W (``weight_grads``) computes the
        weights' gradient later; its collectives are the same (they carry the input's
        gradient), and ZeRO-3's reduce-scatter of the weights' gradient moves to the W."""
        ops, m, ab = self._call(name, 1), self.mesh, self.net.act_bytes
        for k in reversed(range(len(self.layers))):
            i = self.layers[k]
            if self.sharder:
                ops += self.sharder.before(i, forward=False, scatters=not split)
            grad_in = self.net.out_elems(i - 1) * batch * ab
            blocks = self.net.layers[i].tp_all_reduces
            if m.tp > 1 and blocks:          # (the input data needs no gradient)
                ops += self._block(name, self._backward_s(i, batch, split), grad_in,
                                   blocks if i > 0 else 0, group, i)
            else:
                ops.append(Compute(name, self._backward_s(i, batch, split), i))
                # dL/dx of a column-parallel layer is a sum over the ranks; the input data
                # needs none (the first layer of the network)
                column = self.scheme == "naive" or (k % 2 == 0 and self._sliced(i) > 1)
                if m.tp > 1 and column and i > 0:
                    ops += self.tp_collective(group, grad_in, m.all_reduce_s("tp", grad_in),
                                              "all-reduce", name)
            if self.sharder and not split:
                ops += self.sharder.after(i, forward=False)
        return ops

    def _backward_s(self, i: int, batch: float, split: bool) -> float:
        full = self.costs.backward_s(i, batch, self._sliced(i))
        return full - weight_grad_s(self.costs, i, batch, self._sliced(i)) if split else full

    def weight_grads(self, name: str, batch: float) -> list:
        """A split backward's W: each layer's weights' gradient, from the last layer. No
        collective: each tensor-parallel rank owns its slice's gradient; ZeRO-3
        reduce-scatters a layer's gradient once it is computed. A pass of its own, it
        pays its own call (``costs.call_s``, the backward's)."""
        ops = self._call(name, 1)
        for i in reversed(self.layers):
            ops.append(Compute(name, weight_grad_s(self.costs, i, batch, self._sliced(i)), i))
            if self.sharder:
                ops += self.sharder.after(i, forward=False)
        return ops

    def _block(self, name, seconds, nbytes, all_reduces, group, layer) -> list:
        """A block's pass cut in ``all_reduces`` equal parts, each ending in one all-reduce
        (sequence parallel: a reduce-scatter here and an all-gather at the part's start,
        the same ring bytes in all)."""
        m, ops = self.mesh, []
        if all_reduces == 0:
            return [Compute(name, seconds, layer)]
        for _ in range(all_reduces):
            if self.net.sequence_parallel:
                ops += self.tp_collective(group, nbytes / m.tp, m.half_ring_s("tp", nbytes),
                                          "all-gather", name)
                ops.append(Compute(name, seconds / all_reduces, layer))
                ops += self.tp_collective(group, nbytes / m.tp, m.half_ring_s("tp", nbytes),
                                          "reduce-scatter", name)
            else:
                ops.append(Compute(name, seconds / all_reduces, layer))
                ops += self.tp_collective(group, nbytes, m.all_reduce_s("tp", nbytes),
                                          "all-reduce", name)
        return ops

    def params(self) -> float:
        return sum(self.net.layers[i].params / self._sliced(i) for i in self.layers)
