"""What the strategy functions of ``timelines`` and ``servers`` share: gradient buckets,
schedules, and the step program of every rank (the mesh and one stage's passes:
``sim.stage``).

A program is the list of what one rank does in a step (``engine``'s Compute, Send,
Recv, Collective, Join); ``programs`` writes them for a dp × tp × pp mesh and
``run_programs`` runs them on paper.
"""
from __future__ import annotations

from .. import pipeline_orders
from ..errors import counted
from ..pipeline import Schedule, check as check_schedule, device_of, gpipe, one_f_one_b
from ..pipeline import op_parts, pass_kind, virtual_stage
from ..split import balance, check_bounds
from . import limits
from .costs import Network, Roofline
from .engine import Collective, Compute, Join, PredictedTimeline, Recv, Send, run
from .model import send_s
from .sharding import Sharder, check_zero
from .stage import Mesh, Stage, all_gather_s  # noqa: F401 (program.Mesh, as before)

SCHEDULES = ("gpipe", "1f1b", "interleaved", "pipedream", "zb-h1", "dualpipev")
# schedules with several chunks per device, and the count they take where none is given
CHUNKED = {"interleaved": 2, "dualpipev": 2}
SPLIT = ("zb-h1", "dualpipev")       # schedules that split backwards into B and W
# point-to-point tags: one device may send another both activations and gradients
# (DualPipeV's V; interleaved 1F1B on 2 devices), each kind received in its own order
ACTIVATIONS, GRADIENTS = 0, 1


def divides(batch: int, parts: int, what: str) -> int:
    if batch % parts:
        raise ValueError(f"a batch of {batch} does not split into {parts} {what}: use a "
                         f"multiple of {parts} (e.g. {parts * max(batch // parts, 1)})")
    return batch // parts


def gradient_buckets(net: Network, layers, shard_params, buckets) -> list[tuple[int, float]]:
    """(layer after whose backward the bucket is ready, its bytes), in backward order.
    layers: the rank's, ascending (with several chunks, not one run of the network's).

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
              chunks=1, steps=1, blocking=False, phase_names=None, zero=0, cp=1, ep=1):
    """Every rank's program for ``steps`` steps of a dp × pp × cp × tp mesh, and the mesh.

    Each rank runs its stage's schedule (without a pipeline: its micro-batches one after
    the other, forward then backward, accumulating gradients), its layers sliced over tp
    (and each sequence over cp: the rank computes 1/cp of every micro-batch's tokens),
    then averages its gradients over dp × cp (ZeRO ``zero`` 1-3: ``sim.sharding``; a
    mixture's experts over the dp × cp / ep ranks that hold them) and updates the
    parameters it holds. Every strategy but the parameter server is a case of this.
    """
    mesh = Mesh(cluster, dp, pp, tp, cp, ep)
    # every micro-batch runs a forward and a backward of each layer on each replica and
    # tp slice (and a W where the schedule splits it), and each rank updates once a step:
    # refused before anything is built
    passes = 3 if schedule in SPLIT and pp > 1 else 2
    limits.operations("timeline", steps * dp * cp * tp * (passes * micro_batches * len(net) + pp),
                      f"steps={steps} × micro_batches={micro_batches} × {len(net)} layers "
                      f"× {dp * cp * tp} replica(s), context parts and tp slice(s)")
    zero = check_zero(zero) if dp * cp > 1 else 0
    replica = divides(batch, dp, "data-parallel replicas")
    mb = divides(replica, micro_batches, "micro-batches") / cp   # a rank's 1/cp of each
    named = phase_names or (("forward", "backward") if micro_batches == 1 else None)
    # PipeDream (Narayanan et al., 2019) never flushes: the micro-batches of every step
    # stream through one 1F1B schedule, each stage updating after each m backward passes
    # (with weights stashed, ``sim.memory``); the fill and drain are paid once, not per step
    stream = schedule == "pipedream" and pp > 1
    if stream and chunks > 1:
        raise ValueError("pipedream streams one chunk per device: chunks=1")
    ops_of = stage_orders(schedule if pp > 1 else "1f1b", pp, micro_batches * (steps if stream else 1),
                          chunks)
    placement = ops_of.placement
    cuts = stage_layers(net, costs, pp * chunks, bounds, mb)     # one per virtual stage
    progs = [[] for _ in range(mesh.size)]
    for _ in range(1 if stream else steps):
        for d, s, q, t in ((d, s, q, t) for d in range(dp) for s in range(pp)
                           for q in range(cp) for t in range(tp)):
            r = mesh.rank(d, s, t, q)
            parts = [Stage(net, costs, cuts[virtual_stage(s, c, pp, placement)], mesh,
                           scheme, where=(d, s, t, q)) for c in range(chunks)]
            split = {(i, c) for kind, i, c in ops_of[s] if kind == "W"}
            if zero == 3:
                for part in parts:
                    part.sharder = Sharder(net, mesh, mesh.dp_group(s, t), part.layers,
                                           _shard_params(part), overlap)
            backs, begun = 0, len(progs[r])
            for kind, i, c in ops_of[s]:
                progs[r] += pipeline_op(kind, i, c, s, parts[c], mesh, d, t, pp, chunks,
                                         mb, named, blocking, schedule, placement,
                                         (i, c) in split)
                backs += kind == "B"
                if stream and kind == "B" and backs % micro_batches == 0:
                    progs[r] += _exchange_and_update(net, parts, mesh, s, t, buckets,
                                                     overlap, progs[r], zero, costs, dp)
            if not stream:
                progs[r] += _exchange_and_update(net, parts, mesh, s, t, buckets,
                                                 overlap, progs[r], zero, costs, dp)
                if dp * cp > 1 and overlap and zero != 3:
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
    ops.append(Compute("update", costs.update_s(params / (dp * mesh.cp if zero else 1))))
    if zero in (1, 2):      # every rank updated its 1/N: gather the others'
        nbytes = params * net.state["params"]
        ops.append(Collective(mesh.dp_group(s, t), nbytes, mesh.half_ring_s("dp", nbytes),
                              "all-gather params", "dp"))
    return ops


def _shard_params(stage: Stage):
    return lambda i: stage.net.layers[i].params / stage._sliced(i)


def pipeline_op(kind, i, c, s, stage: Stage, mesh: Mesh, d, t, pp, chunks, mb, named,
                 blocking, schedule="1f1b", placement="loop", split=False) -> list:
    """One F, B or W of micro-batch i on chunk c of stage s, with its receive and send.

    The chunk is virtual stage ``pipeline.virtual_stage(s, c, pp, placement)``; its
    neighbours may sit on the same device (the bottom of DualPipeV's V), where nothing
    is sent. split: this B computes the input's gradient only, and W the weights'
    (Qi et al., 2024), which nobody waits for: it sends nothing.

    With tensor parallelism each rank sends 1/tp of the boundary and the receivers
    all-gather it over tp (Narayanan et al., 2021, section 4.1: the scatter/gather
    optimisation). Recomputation runs before the backward pass: in GPipe before the
    gradient arrives ("re-computation during the backward pass can be scheduled earlier,
    without waiting for the gradients from earlier layers", Huang et al., 2019, section
    2.3), filling the wait; in 1F1B once it has (Megatron-LM's backward step).
    """
    v = virtual_stage(s, c, pp, placement)
    last_v = pp * chunks - 1
    name = named[0 if kind == "F" else 1] if named and kind != "W" else f"{kind}{i}"
    prev_device = device_of(v - 1, pp, placement)[0] if v > 0 else s
    next_device = device_of(v + 1, pp, placement)[0] if v < last_v else s
    q = stage.where[3]
    prev_rank, next_rank = mesh.rank(d, prev_device, t, q), mesh.rank(d, next_device, t, q)
    group = mesh.tp_group(d, s, q)
    link = mesh.link["pp"]
    ops = []

    def receive(peer, at, tag):
        nbytes = boundary_bytes(stage.net, at, mb)
        out = [Recv(peer, nbytes / mesh.tp, "recv", "pp", tag)]
        if mesh.tp > 1:
            out += stage.tp_collective(group, nbytes / mesh.tp, mesh.half_ring_s("tp", nbytes),
                                       "all-gather", name)
        return out

    def send(peer, at, tag):
        nbytes = boundary_bytes(stage.net, at, mb) / mesh.tp
        return [Send(peer, nbytes, send_s(nbytes, link), "send", "pp", blocking, tag)]

    if kind == "W":
        return stage.weight_grads(name, mb)
    if kind == "F":
        if prev_device != s:
            ops += receive(prev_rank, stage.layers.start, ACTIVATIONS)
        ops += stage.forward(name, mb, group)
        if next_device != s:
            ops += send(next_rank, stage.layers.stop, ACTIVATIONS)
    else:
        early = stage.recompute("recompute", mb, group) if schedule == "gpipe" else []
        ops += early
        if next_device != s:
            ops += receive(next_rank, stage.layers.stop, GRADIENTS)
        if not early:
            ops += stage.recompute("recompute", mb, group)
        ops += stage.backward(name, mb, group, split)
        if prev_device != s:
            ops += send(prev_rank, stage.layers.start, GRADIENTS)
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
    if mesh.dp * mesh.cp == 1:
        return []
    if zero == 3:
        return [Join()] if overlap else []
    group, ep, layers = mesh.dp_group(s, t), mesh.ep, net.layers
    shard = {i: (layers[i].params - layers[i].expert_params) / p._sliced(i)
             for p in parts for i in p.layers}
    # a device's chunks are not one run of layers (interleaved, DualPipeV): only its own
    plan = gradient_buckets(net, sorted(shard), shard.get, buckets)
    how = ("reduce-scatter", mesh.half_ring_s) if zero else ("all-reduce", mesh.all_reduce_s)
    ops = [Collective(group, nbytes, how[1]("dp", nbytes), how[0], "dp", background=overlap)
           for _, nbytes in plan]
    experts = {i: layers[i].expert_params / ep / p._sliced(i) for p in parts for i in p.layers
               if layers[i].expert_params}
    if experts and mesh.dp * mesh.cp > ep:         # each expert's replicas: dp × cp / ep
        mine = mesh.expert_dp_group(*parts[0].where)
        more = gradient_buckets(net, sorted(experts), experts.get,
                                buckets if buckets == "per_tensor" else min(buckets, len(experts)))
        plan += more
        ops += [Collective(mine, nbytes, how[1]("edp", nbytes), f"{how[0]} experts", "edp",
                           background=overlap) for _, nbytes in more]
    if not overlap:
        return ops
    weave_after_backward(prog, plan, ops)
    return [Join()]


def weave_after_backward(prog: list, plan, ops) -> None:
    """Insert each bucket's all-reduce right after the backward pass that completes it:
    the last backward compute of its layer in this step (the last micro-batch's), or
    of a split backward's W, which computes the weights' gradient after its B."""
    where: dict[int, int] = {}
    for pos in range(len(prog) - 1, -1, -1):
        op = prog[pos]
        if isinstance(op, Compute) and op.name == "update":
            break
        if (isinstance(op, Compute) and op.layer is not None and op.layer not in where
                and (op.name == "backward" or op.name.startswith(("B", "W")))):
            where[op.layer] = pos
    for (layer, _), op in sorted(zip(plan, ops), key=lambda x: -where[x[0][0]]):
        prog.insert(where[layer] + 1, op)


def stage_orders(name: str, pp: int, m: int, chunks: int) -> Schedule:
    """Per stage: ("F" | "B" | "W", micro-batch, chunk) in the order the stage runs them,
    as a ``pipeline.Schedule`` (its ``chunks`` and ``placement``); the orders are the
    core's (``pipeline``, ``pipeline_orders``)."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {name!r}")
    if name == "interleaved":
        ops = pipeline_orders.interleaved_1f1b(pp, m, chunks)
    elif name == "dualpipev":
        if chunks != 2:
            raise ValueError(f"dualpipev holds exactly 2 chunks per device, in a V (stages d "
                             f"and 2p-1-d): use chunks=2, got chunks={chunks}")
        if m < 2 * pp:
            raise ValueError(f"dualpipev needs micro_batches >= 2 x stages = {2 * pp} (its V "
                             f"has {2 * pp} virtual stages), got {m}: use at least {2 * pp} "
                             "micro-batches, or fewer stages")
        ops = pipeline_orders.dualpipev(pp, m)
    elif chunks != 1:
        raise ValueError(f"chunks={chunks} needs schedule='interleaved' (or 'dualpipev', "
                         f"2 chunks); {name!r} runs one chunk per device: use chunks=1")
    elif name == "zb-h1":
        ops = pipeline_orders.zb_h1(pp, m)
    else:                                       # pipedream: 1F1B's order
        ops = Schedule((gpipe if name == "gpipe" else one_f_one_b)(pp, m))
    check_schedule(ops, pp, m)
    return Schedule([[op_parts(op) for op in stage] for stage in ops], ops.chunks,
                    ops.placement)


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
    what = " and ".join(w for w, on in (("K/V passes", mesh.cp > 1), ("buckets", background))
                        if on)
    if what:
        labels.update({mesh.size + r: f"rank {r} {what} (predicted)" for r in range(mesh.size)})
    return labels


def run_programs(progs, mesh, steps, notes, background=False) -> PredictedTimeline:
    return run(progs, lane_labels(mesh, background), steps=steps, notes=notes,
               **mesh.engine_settings())


def costs_for(net, cluster, costs):
    return costs if costs is not None else Roofline(net, cluster)


def notes_for(strategy, net, cluster, costs, **extra) -> dict:
    return {"strategy": strategy, "network": net.name, "cluster": cluster.name,
            "costs": getattr(costs, "source", type(costs).__name__), **extra}
