"""What the strategy functions of ``timelines`` and ``servers`` share: gradient buckets,
schedules, and the step program of every rank (the mesh and one stage's passes:
``sim.stage``).

A program is the list of what one rank does in a step (``engine``'s Compute, Send,
Recv, Collective, Join); ``programs`` writes them for a dp × tp × pp mesh and
``run_programs`` runs them on paper.
"""
from __future__ import annotations

from ..errors import counted
from ..pipeline import check as check_schedule, pass_kind
from ..pipeline import gpipe, one_f_one_b
from ..split import balance, check_bounds
from . import limits
from .costs import Network, Roofline
from .engine import Collective, Compute, Join, PredictedTimeline, Recv, Send, run
from .model import send_s
from .sharding import Sharder, check_zero
from .stage import Mesh, Stage, all_gather_s  # noqa: F401 (program.Mesh, as before)

SCHEDULES = ("gpipe", "1f1b", "interleaved", "pipedream")


def divides(batch: int, parts: int, what: str) -> int:
    if batch % parts:
        raise ValueError(f"a batch of {batch} does not split into {parts} {what}: use a "
                         f"multiple of {parts} (e.g. {parts * max(batch // parts, 1)})")
    return batch // parts


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
              chunks=1, steps=1, blocking=False, phase_names=None, zero=0):
    """Every rank's program for ``steps`` steps of a dp × pp × tp mesh, and the mesh.

    Each rank runs its stage's schedule (without a pipeline: its micro-batches one after
    the other, forward then backward, accumulating gradients), its layers sliced over tp,
    then averages its gradients over dp (ZeRO ``zero`` 1-3: ``sim.sharding``) and
    updates the parameters it holds. Every strategy but the parameter server is a case of
    this.
    """
    mesh = Mesh(cluster, dp, pp, tp)
    # every micro-batch runs a forward and a backward of each layer on each replica and
    # tp slice, and each rank updates once a step: refused before anything is built
    limits.operations("timeline", steps * dp * tp * (2 * micro_batches * len(net) + pp),
                      f"steps={steps} × micro_batches={micro_batches} × {len(net)} layers "
                      f"× {dp * tp} replica(s) and tp slice(s)")
    zero = check_zero(zero) if dp > 1 else 0
    replica = divides(batch, dp, "data-parallel replicas")
    mb = divides(replica, micro_batches, "micro-batches")
    stages = pp * chunks
    cuts = stage_layers(net, costs, stages, bounds, mb)
    progs = [[] for _ in range(mesh.size)]
    named = phase_names or (("forward", "backward") if micro_batches == 1 else None)
    # PipeDream (Narayanan et al., 2019) never flushes: the micro-batches of every step
    # stream through one 1F1B schedule, each stage updating after each m backward passes
    # (with weights stashed, ``sim.memory``); the fill and drain are paid once, not per step
    stream = schedule == "pipedream" and pp > 1
    if stream and chunks > 1:
        raise ValueError("pipedream streams one chunk per device: chunks=1")
    ops_of = stage_orders(schedule if pp > 1 else "1f1b", pp, micro_batches * (steps if stream else 1),
                          chunks)
    for _ in range(1 if stream else steps):
        for d in range(dp):
            for s in range(pp):
                for t in range(tp):
                    r = mesh.rank(d, s, t)
                    parts = [Stage(net, costs, cuts[c * pp + s], mesh, scheme) for c in range(chunks)]
                    if zero == 3:
                        for part in parts:
                            part.sharder = Sharder(net, mesh, mesh.dp_group(s, t), part.layers,
                                                   _shard_params(part), overlap)
                    backs, begun = 0, len(progs[r])
                    for kind, i, c in ops_of[s]:
                        progs[r] += pipeline_op(kind, i, c, s, parts[c], mesh, d, t, pp, chunks,
                                                 mb, named, blocking, schedule)
                        backs += kind == "B"
                        if stream and kind == "B" and backs % micro_batches == 0:
                            progs[r] += _exchange_and_update(net, parts, mesh, s, t, buckets,
                                                             overlap, progs[r], zero, costs, dp)
                    if not stream:
                        progs[r] += _exchange_and_update(net, parts, mesh, s, t, buckets,
                                                         overlap, progs[r], zero, costs, dp)
                        if dp > 1 and overlap and zero != 3:
                            add_ddp_wrapper(progs[r], begun, cluster)
    return progs, mesh


def add_ddp_wrapper(prog: list, begun: int, cluster) -> None:
    """What DDP's wrapper adds to a step (``Cluster.ddp_wrapper_s``, measured): its
    forward hooks before the step's first forward pass, its gradient hooks with the first
    backward pass (one compute of the pass's name just before it: the span of that pass
    encloses it, as the measured one does). ``begun``: where the step starts in ``prog``."""
    for kind, seconds in zip("FB", cluster.ddp_wrapper_s):
        full = "forward" if kind == "F" else "backward"
        at = next((k for k in range(begun, len(prog)) if isinstance(prog[k], Compute)
                   and (prog[k].name == full or pass_kind(prog[k].name) == kind)), None)
        if at is not None and seconds > 0:
            prog.insert(at, Compute(prog[at].name, seconds))


def _exchange_and_update(net, parts, mesh, s, t, buckets, overlap, prog, zero, costs, dp) -> list:
    """After a step's last backward pass: average (or shard) the gradients over dp, update."""
    ops = data_parallel_ops(net, parts, mesh, s, t, buckets, overlap, prog, zero)
    params = sum(p.params() for p in parts)
    ops.append(Compute("update", costs.update_s(params / (dp if zero else 1))))
    if zero in (1, 2):      # every rank updated its 1/N: gather the others'
        nbytes = params * net.state["params"]
        ops.append(Collective(mesh.dp_group(s, t), nbytes, mesh.half_ring_s("dp", nbytes),
                              "all-gather params", "dp"))
    return ops


def _shard_params(stage: Stage):
    return lambda i: stage.net.layers[i].params / stage._sliced(i)


def pipeline_op(kind, i, c, s, stage: Stage, mesh: Mesh, d, t, pp, chunks, mb, named,
                 blocking, schedule="1f1b") -> list:
    """One F or B of micro-batch i on chunk c of stage s, with its receive and send.

    With tensor parallelism each rank sends 1/tp of the boundary and the receivers
    all-gather it over tp (Narayanan et al., 2021, section 4.1: the scatter/gather
    optimisation). Recomputation runs before the backward pass: in GPipe before the
    gradient arrives ("re-computation during the backward pass can be scheduled earlier,
    without waiting for the gradients from earlier layers", Huang et al., 2019, section
    2.3), filling the wait; in 1F1B once it has (Megatron-LM's backward step).
    """
    v = c * pp + s                               # the virtual stage (interleaved)
    last_v = pp * chunks - 1
    name = named[0 if kind == "F" else 1] if named else f"{kind}{i}"
    prev_rank = mesh.rank(d, (s - 1) % pp, t)
    next_rank = mesh.rank(d, (s + 1) % pp, t)
    group = mesh.tp_group(d, s)
    link = mesh.link["pp"]
    ops = []

    def receive(peer, at):
        nbytes = boundary_bytes(stage.net, at, mb)
        out = [Recv(peer, nbytes / mesh.tp, "recv", "pp")]
        if mesh.tp > 1:
            out += stage.tp_collective(group, nbytes / mesh.tp, mesh.half_ring_s("tp", nbytes),
                                       "all-gather", name)
        return out

    def send(peer, at):
        nbytes = boundary_bytes(stage.net, at, mb) / mesh.tp
        return [Send(peer, nbytes, send_s(nbytes, link), "send", "pp", blocking)]

    if kind == "F":
        if v > 0:
            ops += receive(prev_rank, stage.layers.start)
        ops += stage.forward(name, mb, group)
        if v < last_v:
            ops += send(next_rank, stage.layers.stop)
    else:
        early = stage.recompute("recompute", mb, group) if schedule == "gpipe" else []
        ops += early
        if v < last_v:
            ops += receive(next_rank, stage.layers.stop)
        if not early:
            ops += stage.recompute("recompute", mb, group)
        ops += stage.backward(name, mb, group)
        if v > 0:
            ops += send(prev_rank, stage.layers.start)
    return ops


def boundary_bytes(net: Network, at: int, batch: float) -> float:
    """What crosses the cut before layer ``at``: the activation handed on and every skip
    tensor jumping over it (``Network.cut_bytes``; its gradient is as large)."""
    return net.cut_bytes(at, batch)


def data_parallel_ops(net, parts, mesh: Mesh, s, t, buckets, overlap, prog, zero=0) -> list:
    """Average the replica's gradients over dp: after the backward, or overlapped with it.

    overlap: each bucket's all-reduce is posted, in the background, right after the
    backward of its first layer (in backward order) and runs while the backward goes
    on (DDP's hooks); the update waits for all of them (``Join``). Otherwise they run
    one after another once the backward is done. ZeRO 1 and 2 reduce-scatter the
    buckets instead; ZeRO 3 has reduce-scattered each layer's already (``Sharder``).
    """
    if mesh.dp == 1:
        return []
    if zero == 3:
        return [Join()] if overlap else []
    group = mesh.dp_group(s, t)
    shard = {i: net.layers[i].params / p._sliced(i) for p in parts for i in p.layers}
    layers = [i for p in parts for i in p.layers]
    plan = gradient_buckets(net, range(min(layers), max(layers) + 1), shard.get, buckets)
    if zero:
        ops = [Collective(group, nbytes, mesh.half_ring_s("dp", nbytes), "reduce-scatter",
                          "dp", background=overlap) for _, nbytes in plan]
    else:
        ops = [Collective(group, nbytes, mesh.all_reduce_s("dp", nbytes),
                          "all-reduce", "dp", background=overlap) for _, nbytes in plan]
    if not overlap:
        return ops
    weave_after_backward(prog, plan, ops)
    return [Join()]


def weave_after_backward(prog: list, plan, ops) -> None:
    """Insert each bucket's all-reduce right after the backward pass that completes it:
    the last backward compute of its layer in this step (the last micro-batch's)."""
    where: dict[int, int] = {}
    for pos in range(len(prog) - 1, -1, -1):
        op = prog[pos]
        if isinstance(op, Compute) and op.name == "update":
            break
        if (isinstance(op, Compute) and op.layer is not None and op.layer not in where
                and (op.name == "backward" or op.name.startswith("B"))):
            where[op.layer] = pos
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
    ops = (gpipe if name == "gpipe" else one_f_one_b)(pp, m)    # pipedream: 1F1B's order
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
    return run(progs, lane_labels(mesh, background), steps=steps, notes=notes,
               **mesh.engine_settings())


def costs_for(net, cluster, costs):
    return costs if costs is not None else Roofline(net, cluster)


def notes_for(strategy, net, cluster, costs, **extra) -> dict:
    return {"strategy": strategy, "network": net.name, "cluster": cluster.name,
            "costs": getattr(costs, "source", type(costs).__name__), **extra}
