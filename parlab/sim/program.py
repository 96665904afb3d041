"""What the strategy functions of ``timelines`` and ``servers`` share: checks, the mesh,
one stage's passes, gradient buckets, schedules, and the step program of every rank.

A program is the list of what one rank does in a step (``engine``'s Compute, Send,
Recv, Collective, Join); ``programs`` writes them for a dp × tp × pp mesh and
``run_programs`` runs them on paper.
"""
from __future__ import annotations

from ..errors import counted
from ..pipeline import check as check_schedule
from ..pipeline import gpipe, one_f_one_b
from ..split import balance, check_bounds
from .costs import Network, Roofline
from .engine import Collective, Compute, Join, PredictedTimeline, Recv, Send, run
from .model import Cluster, all_reduce_s, send_s

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def divides(batch: int, parts: int, what: str) -> int:
    if batch % parts:
        raise ValueError(f"a batch of {batch} does not split into {parts} {what}: use a "
                         f"multiple of {parts} (e.g. {parts * max(batch // parts, 1)})")
    return batch // parts


def all_gather_s(nbytes: float, n: int, link, overhead: float = 0.0) -> float:
    """Ring all-gather of S bytes in all (S/n from each rank): (n-1) alpha + (n-1)/n S/beta."""
    if n == 1:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bandwidth_Bps + overhead


def all_reduce_seconds(nbytes, n, link, overhead) -> float:
    return 0.0 if n == 1 else all_reduce_s(nbytes, n, link) + overhead


class Mesh:
    """dp × pp × tp ranks, tp fastest (``parlab.mesh``'s order), and each axis's link."""

    def __init__(self, cluster: Cluster, dp: int, pp: int, tp: int):
        self.dp, self.pp, self.tp = dp, pp, tp
        self.size = dp * pp * tp
        if self.size > cluster.devices:
            raise ValueError(f"{dp} × {pp} × {tp} (dp × pp × tp) needs {self.size} devices; "
                             f"{cluster.name} has {cluster.devices}: use a cluster with more "
                             "devices or a smaller mesh")
        span = {"tp": tp, "pp": pp * tp, "dp": self.size}
        self.link = {a: cluster.link(span[a]) for a in span}
        self.overhead = cluster.collective_overhead_s
        self.wake = getattr(cluster, "wake_latency_s", 0.0)
        self.cores = getattr(cluster, "cores", 0)

    def rank(self, d: int, s: int, t: int) -> int:
        return (d * self.pp + s) * self.tp + t

    def tp_group(self, d, s) -> tuple:
        return tuple(self.rank(d, s, t) for t in range(self.tp))

    def dp_group(self, s, t) -> tuple:
        return tuple(self.rank(d, s, t) for d in range(self.dp))


class Stage:
    """The layers one rank runs (a pipeline stage, sliced over tp), and their transfers."""

    def __init__(self, net: Network, costs, layers: range, mesh: Mesh, scheme: str):
        self.net, self.costs, self.layers, self.mesh, self.scheme = net, costs, layers, mesh, scheme

    def _sliced(self, i: int) -> int:
        """tp degree layer i is sliced by: an unpaired last layer stays whole (column_row)."""
        tp = self.mesh.tp
        if tp == 1 or self.scheme == "naive" or self.net.layers[i].tp_all_reduces:
            return tp
        k = i - self.layers.start
        return tp if (k % 2 == 1 or k + 1 < len(self.layers)) else 1

    def _tp(self, group, nbytes, seconds, name) -> Collective:
        return Collective(group, nbytes, seconds, name, "tp")

    def forward(self, name: str, batch: float, group: tuple) -> list:
        ops, m, ab = [], self.mesh, self.net.act_bytes
        for k, i in enumerate(self.layers):
            out = self.net.layers[i].out_elems * batch * ab
            blocks = self.net.layers[i].tp_all_reduces
            if m.tp > 1 and blocks:         # a Megatron block: compute, all-reduce, twice
                ops += self._block(name, self.costs.forward_s(i, batch, m.tp), out, blocks, group)
                continue
            ops.append(Compute(name, self.costs.forward_s(i, batch, self._sliced(i))))
            if m.tp == 1:
                continue
            if self.scheme == "naive":      # every layer's slices gathered whole
                ops.append(self._tp(group, out / m.tp, all_gather_s(out, m.tp, m.link["tp"],
                                                                     m.overhead), "all-gather"))
            elif k % 2 == 1:                 # a row-parallel layer: add the partial outputs
                ops.append(self._tp(group, out, all_reduce_seconds(out, m.tp, m.link["tp"], m.overhead),
                                    "all-reduce"))
        return ops

    def backward(self, name: str, batch: float, group: tuple) -> list:
        ops, m, ab = [], self.mesh, self.net.act_bytes
        for k in reversed(range(len(self.layers))):
            i = self.layers[k]
            grad_in = (self.net.in_elems if i == 0 else self.net.layers[i - 1].out_elems) * batch * ab
            blocks = self.net.layers[i].tp_all_reduces
            if m.tp > 1 and blocks:          # (the input data needs no gradient)
                ops += self._block(name, self.costs.backward_s(i, batch, m.tp), grad_in,
                                   blocks if i > 0 else 0, group)
                continue
            ops.append(Compute(name, self.costs.backward_s(i, batch, self._sliced(i))))
            # dL/dx of a column-parallel layer is a sum over the ranks; the input data
            # needs none (the first layer of the network)
            column = self.scheme == "naive" or (k % 2 == 0 and self._sliced(i) > 1)
            if m.tp > 1 and column and i > 0:
                ops.append(self._tp(group, grad_in,
                                    all_reduce_seconds(grad_in, m.tp, m.link["tp"], m.overhead),
                                    "all-reduce"))
        return ops

    def _block(self, name, seconds, nbytes, all_reduces, group) -> list:
        """A block's pass cut in ``all_reduces`` equal parts, each ending in one."""
        m, ops = self.mesh, []
        if all_reduces == 0:
            return [Compute(name, seconds)]
        for _ in range(all_reduces):
            ops.append(Compute(name, seconds / all_reduces))
            ops.append(self._tp(group, nbytes, all_reduce_seconds(nbytes, m.tp, m.link["tp"], m.overhead),
                                "all-reduce"))
        return ops

    def params(self) -> float:
        return sum(self.net.layers[i].params / self._sliced(i) for i in self.layers)


def gradient_buckets(net: Network, layers: range, shard_params, buckets) -> list[tuple[int, float]]:
    """(layer after whose backward the bucket is ready, its bytes), in backward order.

    buckets: a number (layers grouped, last first, into about equal bytes, as DDP's
    ``bucket_cap_mb`` does) or "per_tensor" (weight and bias of each layer apart, as
    lab 05's ``average_gradients`` sends them).
    """
    order = list(reversed(layers))
    wire = net.grad_wire_bytes
    if buckets == "per_tensor":
        out = []
        for i in order:
            bias = net.layers[i].out_elems if net.layers[i].params > net.layers[i].out_elems else 0
            out += [(i, (shard_params(i) - bias) * wire), (i, bias * wire)]
        return [b for b in out if b[1] > 0]
    n = counted(buckets, "buckets")
    if n > len(order):
        raise ValueError(f"buckets={n}: at most one bucket per layer ({len(order)} here)")
    sizes = [shard_params(i) * wire for i in order]
    total, out, closed, cum = sum(sizes), [], 0.0, 0.0
    for j, (i, size) in enumerate(zip(order, sizes)):
        cum += size
        need, rest = n - len(out), len(order) - j - 1
        if rest == 0 or (need > 1 and (cum >= total * (len(out) + 1) / n or rest == need - 1)):
            out.append((i, cum - closed))          # ready once layer i's backward is done
            closed = cum
    return out


def programs(net, cluster, costs, batch, *, dp=1, tp=1, pp=1, micro_batches=1,
              schedule="gpipe", scheme="column_row", bounds=None, buckets=1, overlap=True,
              chunks=1, steps=1, blocking=False, phase_names=None):
    """Every rank's program for ``steps`` steps of a dp × pp × tp mesh, and the mesh.

    Each rank runs its stage's schedule (one F and one B when there is no pipeline),
    its layers sliced over tp, then averages its gradients over dp and updates the
    parameters it holds. Every strategy but the parameter server is a case of this.
    """
    mesh = Mesh(cluster, dp, pp, tp)
    replica = divides(batch, dp, "data-parallel replicas")
    mb = divides(replica, micro_batches, "micro-batches")
    stages = pp * chunks
    cuts = stage_layers(net, costs, stages, bounds, mb)
    progs = [[] for _ in range(mesh.size)]
    ops_of = stage_orders(schedule, pp, micro_batches, chunks)
    named = phase_names or (("forward", "backward") if micro_batches == 1 else None)
    for _ in range(steps):
        for d in range(dp):
            for s in range(pp):
                for t in range(tp):
                    r = mesh.rank(d, s, t)
                    parts = [Stage(net, costs, cuts[c * pp + s], mesh, scheme) for c in range(chunks)]
                    for kind, i, c in ops_of[s]:
                        progs[r] += pipeline_op(kind, i, c, s, parts[c], mesh, d, t, pp, chunks,
                                                 mb, named, blocking)
                    progs[r] += data_parallel_ops(net, parts, mesh, s, t, buckets, overlap,
                                                   progs[r])
                    params = sum(p.params() for p in parts)
                    progs[r].append(Compute("update", costs.update_s(params)))
    return progs, mesh


def pipeline_op(kind, i, c, s, stage: Stage, mesh: Mesh, d, t, pp, chunks, mb, named,
                 blocking) -> list:
    """One F or B of micro-batch i on chunk c of stage s, with its receive and send."""
    v = c * pp + s                               # the virtual stage (interleaved)
    last_v = pp * chunks - 1
    name = named[0 if kind == "F" else 1] if named else f"{kind}{i}"
    prev_rank = mesh.rank(d, (s - 1) % pp, t)
    next_rank = mesh.rank(d, (s + 1) % pp, t)
    group = mesh.tp_group(d, s)
    link = mesh.link["pp"]
    ops = []
    if kind == "F":
        if v > 0:
            nbytes = boundary_bytes(stage.net, stage.layers.start, mb)
            ops.append(Recv(prev_rank, nbytes, "recv", "pp"))
        ops += stage.forward(name, mb, group)
        if v < last_v:
            nbytes = boundary_bytes(stage.net, stage.layers.stop, mb)
            ops.append(Send(next_rank, nbytes, send_s(nbytes, link), "send", "pp", blocking))
    else:
        if v < last_v:
            nbytes = boundary_bytes(stage.net, stage.layers.stop, mb)
            ops.append(Recv(next_rank, nbytes, "recv", "pp"))
        ops += stage.backward(name, mb, group)
        if v > 0:
            nbytes = boundary_bytes(stage.net, stage.layers.start, mb)
            ops.append(Send(prev_rank, nbytes, send_s(nbytes, link), "send", "pp", blocking))
    return ops


def boundary_bytes(net: Network, at: int, batch: float) -> float:
    """What crosses the cut before layer ``at``: the activation handed on and every skip
    tensor jumping over it (``Network.cut_bytes``; its gradient is as large)."""
    return net.cut_bytes(at, batch)


def data_parallel_ops(net, parts, mesh: Mesh, s, t, buckets, overlap, prog) -> list:
    """Average the replica's gradients over dp: after the backward, or overlapped with it.

    overlap: each bucket's all-reduce is posted, in the background, right after the
    backward of its first layer (in backward order) and runs while the backward goes
    on (DDP's hooks); the update waits for all of them (``Join``). Otherwise they run
    one after another once the backward is done.
    """
    if mesh.dp == 1:
        return []
    group = mesh.dp_group(s, t)
    link = mesh.link["dp"]
    shard = {i: net.layers[i].params / p._sliced(i) for p in parts for i in p.layers}
    layers = [i for p in parts for i in p.layers]
    plan = gradient_buckets(net, range(min(layers), max(layers) + 1), shard.get, buckets)
    ops = [Collective(group, nbytes, all_reduce_seconds(nbytes, mesh.dp, link, mesh.overhead),
                      "all-reduce", "dp", background=overlap) for _, nbytes in plan]
    if not overlap:
        return ops
    weave_after_backward(prog, plan, ops, parts)
    return [Join()]


def weave_after_backward(prog: list, plan, ops, parts) -> None:
    """Insert each bucket's all-reduce right after the backward pass that completes it.

    Walking back from the end of this step's ops, the backward computes met first are
    those of the last micro-batch, first layer first: the k-th is layer ``layers[k]``.
    """
    layers = [i for p in parts for i in p.layers]
    where: dict[int, int] = {}
    for pos in range(len(prog) - 1, -1, -1):
        op = prog[pos]
        if isinstance(op, Compute) and op.name == "update" or len(where) == len(layers):
            break
        if isinstance(op, Compute) and (op.name == "backward" or op.name.startswith("B")):
            where[layers[len(where)]] = pos
    for (layer, _), op in sorted(zip(plan, ops), key=lambda x: -where[x[0][0]]):
        prog.insert(where[layer] + 1, op)


def stage_orders(name: str, pp: int, m: int, chunks: int) -> list[list[tuple]]:
    """Per stage: ("F" | "B", micro-batch, chunk) in the order the stage runs them."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {name!r}")
    if name == "interleaved":
        return interleaved_orders(pp, m, chunks)
    if chunks != 1:
        raise ValueError(f"chunks={chunks} needs schedule='interleaved'")
    ops = (gpipe if name == "gpipe" else one_f_one_b)(pp, m)
    check_schedule(ops, pp, m)
    return [[(k, i, 0) for k, i in stage] for stage in ops]


def interleaved_orders(p: int, m: int, v: int) -> list[list[tuple]]:
    """Interleaved 1F1B (Narayanan et al., 2021, section 2.2): v chunks per device.

    Device d holds virtual stages d, d + p, ...; micro-batches go through in groups of
    p. Warm-up: (p - d - 1) * 2 + (v - 1) * p forwards, then one forward and one
    backward in turn (Megatron-LM's ``forward_backward_pipelining_with_interleaving``).
    """
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
    return out


def stage_layers(net: Network, costs, stages: int, bounds, batch: float) -> list[range]:
    n = len(net)
    if stages > n:
        raise ValueError(f"{stages} stages need at least {stages} layers; {net.name} has {n}: "
                         "use fewer stages (or chunks)")
    if bounds is None:
        work = [costs.forward_s(i, batch) + costs.backward_s(i, batch) for i in range(n)]
        bounds = balance(work, stages) if stages > 1 else []
    else:
        bounds = check_bounds(bounds, n, stages)
    edges = [0, *bounds, n]
    return [range(a, b) for a, b in zip(edges, edges[1:])]


def lane_labels(mesh: Mesh, background: bool) -> dict:
    labels = {r: f"rank {r} (predicted)" for r in range(mesh.size)}
    if background:
        labels.update({mesh.size + r: f"rank {r} buckets (predicted)" for r in range(mesh.size)})
    return labels


def run_programs(progs, mesh, steps, notes, background=False) -> PredictedTimeline:
    return run(progs, lane_labels(mesh, background), steps=steps, notes=notes, wake_s=mesh.wake,
               cores=mesh.cores)


def costs_for(net, cluster, costs):
    return costs if costs is not None else Roofline(net, cluster)


def notes_for(strategy, net, cluster, costs, **extra) -> dict:
    return {"strategy": strategy, "network": net.name, "cluster": cluster.name,
            "costs": getattr(costs, "source", type(costs).__name__), **extra}
