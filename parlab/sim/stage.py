"""The mesh of ranks and what one rank's stage does in a pass: its layers' compute and
their tensor-parallel collectives.

``Mesh``: dp × pp × cp × tp ranks laid out as ``parlab.mesh`` does (tp fastest), each axis's
collectives priced by ``sim.collectives`` (its group's size and stride: inside a node,
across nodes over every card, NVLink SHARP), point-to-point sends over the link between
the stages' devices. ``Stage``: the layers of one pipeline stage (or chunk) on one rank,
sliced over tp: a Megatron block computes and all-reduces twice per pass (Shoeybi et
al., 2019, figure 4); plain linear layers pair column-then-row. With context parallelism
a block's attention passes K and V round the cp ranks, and a mixture of experts sends its
routed tokens to their experts and back (``Stage._ring``, ``Stage._all_to_alls``).
"""
from __future__ import annotations

from dataclasses import replace

from .blocks import is_block
from .checks import amount, count, expert_ranks
from .collectives import all_reduce_time, half_ring_time
from .costs import Network, call_s, weight_grad_s
from .engine import Collective, Compute, Join
from .model import Cluster
from .summary_terms import one_all_to_all_s, ring_step


def all_gather_s(nbytes: float, n: int, link, overhead: float = 0.0) -> float:
    """Ring all-gather of S bytes in all (S/n from each rank): (n-1) alpha + (n-1)/n S/beta."""
    n = count("all_gather_s", "n (ranks)", n)
    nbytes = amount("all_gather_s", "nbytes", nbytes, unit="bytes")
    overhead = amount("all_gather_s", "overhead", overhead, unit="seconds")
    if n == 1:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bandwidth_Bps + overhead


class Mesh:
    """dp × pp × cp × tp ranks, tp fastest, then cp (``parlab.mesh``'s order, with context
    parallelism just outside tp as Megatron-Core places it); each axis's collectives and
    the point-to-point link between neighbouring stages. ep: the experts of a mixture of
    experts spread over ep of the dp × cp ranks (which divide by it); a rank's gradients
    go over all dp × cp ranks, its experts' over the dp × cp / ep that hold the same ones."""

    def __init__(self, cluster: Cluster, dp: int, pp: int, tp: int, cp: int = 1, ep: int = 1):
        self.dp, self.pp, self.tp, self.cp, self.ep = dp, pp, tp, cp, ep
        self.size = dp * pp * cp * tp
        expert_ranks("Mesh", dp, cp, ep)
        if self.size > cluster.devices:
            shape = f"{dp} × {pp} × {tp} (dp × pp × tp)" if cp == 1 else (
                f"{dp} × {pp} × {cp} × {tp} (dp × pp × cp × tp)")
            raise ValueError(f"{shape} needs {self.size} devices; "
                             f"{cluster.name} has {cluster.devices}: use a cluster with more "
                             "devices or a smaller mesh")
        span = {"tp": tp, "cp": cp * tp, "pp": pp * cp * tp, "dp": self.size}
        self.link = {a: cluster.link(span[a]) for a in span}
        self.stride = {"tp": 1, "cp": tp, "pp": cp * tp, "dp": pp * cp * tp}
        # gradients go over dp × cp ranks, priced at cp's stride where there is cp (as
        # ``sim.summary`` does); experts' all-to-alls at dp's, their gradients' every ep-th
        dp_stride = tp if cp > 1 else self.stride["dp"]
        self.groups = {"tp": (tp, 1), "cp": (cp, tp), "pp": (pp, cp * tp),
                       "dp": (dp * cp, dp_stride), "ep": (ep, self.stride["dp"]),
                       "edp": (dp * cp // ep, dp_stride * ep)}
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

    def rank(self, d: int, s: int, t: int, q: int = 0) -> int:
        """The rank of replica d, stage s, tp slice t and context part q."""
        return ((d * self.pp + s) * self.cp + q) * self.tp + t

    def tp_group(self, d, s, q: int = 0) -> tuple:
        return tuple(self.rank(d, s, t, q) for t in range(self.tp))

    def cp_group(self, d, s, t) -> tuple:
        return tuple(self.rank(d, s, t, q) for q in range(self.cp))

    def dp_group(self, s, t) -> tuple:
        """Every rank that holds the same (dense) parameters: dp × cp of them."""
        return tuple(self.rank(j // self.cp, s, t, j % self.cp) for j in range(self.dp * self.cp))

    def ep_group(self, d, s, t, q: int = 0) -> tuple:
        """The ep ranks (of the dp × cp) whose experts together make a whole layer's."""
        first = (d * self.cp + q) // self.ep * self.ep
        return tuple(self.rank(j // self.cp, s, t, j % self.cp)
                     for j in range(first, first + self.ep))

    def expert_dp_group(self, d, s, t, q: int = 0) -> tuple:
        """The dp × cp / ep ranks that hold the same experts."""
        mine = (d * self.cp + q) % self.ep
        return tuple(self.rank(j // self.cp, s, t, j % self.cp)
                     for j in range(mine, self.dp * self.cp, self.ep))

    def all_reduce_s(self, axis: str, nbytes: float) -> float:
        """An all-reduce of ``nbytes`` over the axis's group (``collectives.all_reduce_time``)."""
        return all_reduce_time(self.cluster, nbytes, *self.groups[axis])

    def half_ring_s(self, axis: str, nbytes: float) -> float:
        """A reduce-scatter or an all-gather of an ``nbytes`` buffer over the axis's group."""
        return half_ring_time(self.cluster, nbytes, *self.groups[axis])


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
                 sharder=None, where: tuple = (0, 0, 0, 0)):
        self.net, self.costs, self.layers, self.mesh, self.scheme = net, costs, layers, mesh, scheme
        self.sharder = sharder
        self.where = where          # (replica, stage, tp slice, context part) of the rank

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
        return self._spread(name, i, batch, self._sliced_forward(name, i, k, batch, group), False)

    def _sliced_forward(self, name: str, i: int, k: int, batch: float, group: tuple) -> list:
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
                layer = self._block(name, self._backward_s(i, batch, split), grad_in,
                                    blocks if i > 0 else 0, group, i)
            else:
                layer = [Compute(name, self._backward_s(i, batch, split), i)]
                # dL/dx of a column-parallel layer is a sum over the ranks; the input data
                # needs none (the first layer of the network)
                column = self.scheme == "naive" or (k % 2 == 0 and self._sliced(i) > 1)
                if m.tp > 1 and column and i > 0:
                    layer += self.tp_collective(group, grad_in, m.all_reduce_s("tp", grad_in),
                                                "all-reduce", name)
            ops += self._spread(name, i, batch, layer, True)
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

    def _spread(self, name: str, i: int, batch: float, ops: list, backward: bool) -> list:
        """Layer i's pass with what context and expert parallelism add to it."""
        m, x = self.mesh, self.net.layers[i]
        if m.cp > 1 and is_block(x):
            ops = self._ring(name, i, batch, ops, backward)
        if m.ep > 1 and x.routed_elems:
            ops = self._all_to_alls(i, batch, ops)
        return ops

    def _ring(self, name: str, i: int, batch: float, ops: list, backward: bool) -> list:
        """Ring attention (Liu et al., 2023, section 3): the rank sends its K and V chunk on
        to the next cp rank while it computes attention against the chunk it holds, and
        receives the previous rank's: cp - 1 passes forward, 2 cp - 1 backward (K, V and
        their gradients; ``sim.context``'s count), each beside 1/cp (1/(2 cp - 1)) of the
        block's attention products, as ``summary_terms.ring_passes_s`` prices them. A pass
        runs on the rank's second lane, as DDP's buckets do (after any posted before it)."""
        m, (d, s, t, _) = self.mesh, self.where
        chunk, step, fwd, bwd = ring_step(self.net, self.net.layers[i], batch, m.tp, m.cp,
                                          m.cluster, m.stride["cp"])
        passes = 2 * m.cp - 1 if backward else m.cp - 1
        piece = bwd / passes if backward else fwd / m.cp
        group, ring = m.cp_group(d, s, t), []
        for _ in range(passes):     # every member sends on as it receives: one collective
            ring += [Collective(group, chunk, step, "K/V pass", "cp", background=True),
                     Compute(name, piece, i), Join("wait for K/V")]
        return ring + _less(ops, i, passes * piece)

    def _all_to_alls(self, i: int, batch: float, ops: list) -> list:
        """A mixture of experts' pass: the routed tokens dispatched to the ep ranks that
        hold their experts, computed there, and combined back (GShard, Lepikhin et al.,
        2020, section 2.2), not overlapped; the layer's last compute is halved around the
        dispatch (the experts run after the attention, in the block's second half)."""
        m, (d, s, t, q), x = self.mesh, self.where, self.net.layers[i]
        seconds = one_all_to_all_s(self.net, x, batch, m.tp, m.ep, m.cluster, m.groups["ep"][1])
        nbytes = x.routed_elems * batch / m.tp * self.net.act_bytes
        group = m.ep_group(d, s, t, q)
        k = max(j for j, op in enumerate(ops) if isinstance(op, Compute) and op.layer == i)
        half = replace(ops[k], seconds=ops[k].seconds / 2)
        return ops[:k] + [half, Collective(group, nbytes, seconds, "all-to-all dispatch", "ep"),
                          half, Collective(group, nbytes, seconds, "all-to-all combine", "ep"),
                          *ops[k + 1:]]

    def params(self) -> float:
        """The parameters this rank holds (its 1/ep of a mixture's experts)."""
        ep = self.mesh.ep
        return sum((self.net.layers[i].params - self.net.layers[i].expert_params * (1 - 1 / ep))
                   / self._sliced(i) for i in self.layers)


def _less(ops: list, layer: int, seconds: float) -> list:
    """``ops`` with ``seconds`` of layer ``layer``'s compute taken out, from the first on
    (what ring attention already computed between its passes)."""
    out = []
    for op in ops:
        if seconds > 0 and isinstance(op, Compute) and op.layer == layer:
            take = min(seconds, op.seconds)
            seconds -= take
            op = replace(op, seconds=op.seconds - take)
        out.append(op)
    return out
