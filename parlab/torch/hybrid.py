"""Lab 07: hybrid parallelism. Strategies composed on the lines of a device mesh.

Four ranks arranged as a 2 × 2 mesh can run two strategies at once, each on its own
axis: along one axis the ranks share a model (tensor parallel, or pipeline stages),
along the other they are replicas that average their gradients (data parallel). Nothing
here re-implements a strategy: each is the course's own, given the group of its axis.

* **dp × tp**: ``tensor_parallel.slice_mlp`` on the tp line (Megatron-LM's
  column-then-row pairs), each replica on its rows of the global batch
  (``mesh.line("dp").rows``), then the gradients averaged over the dp line
  (``average_replicas``: lab 05's averaging, in one bucket as DDP does, or with
  ``data_parallel.average_gradients`` one tensor at a time).
* **dp × pp**: ``pipeline.train_pipeline`` on ``mesh.group("pp")``, fed the replica's
  rows and told to average over ``mesh.group("dp")`` before its update (its
  ``batches=`` and ``before_update=`` hooks).
* **the library**: DTensor tensor parallel (``parallelize_module``) on the ``tp``
  dimension of the 2-D ``DeviceMesh``, and DDP or FSDP2's ``fully_shard`` on its ``dp``
  dimension.

The byte formulas below give, per rank and per training step, what each axis hands to
its collectives (counted as ``parlab.torch.comm`` counts them: the buffer each rank
gives the operation), so a timeline's ``bytes_by_axis`` can be checked against them.
What crosses the links is that times the algorithm's factor (``metrics.bus_factor``:
2(n - 1)/n for a ring all-reduce, exactly 1 in a group of two).
"""
from __future__ import annotations

import gc
import time
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from ..split import SplitConfig, share
from ..trace import span
from . import comm, data_parallel, pipeline, runtime, tensor_parallel, training
from .mesh import init_mesh

F32 = 4                                   # bytes of a float32
SIZES = (64, 256, 256, 128, 10)           # the course's MLP; every hidden width splits over 4


# ------------------------------------------------------------------ the formulas
def tp_bytes(sizes, batch: int, tp: int) -> int:
    """Tensor-parallel bytes per rank per step, column-then-row pairs of an MLP.

    Megatron-LM (Shoeybi et al., 2019, section 3): each pair of layers all-reduces its
    output in the forward pass (operator g) and the gradient of its input in the
    backward pass (operator f): batch × width floats each, whatever ``tp``; the first
    pair's input gradient is never needed. Nothing moves when tp = 1.
    """
    if tp == 1:
        return 0
    return tensor_parallel.expected_comm_bytes(sizes, batch, tp, "column_row")["total"]


def params_per_rank(sizes, tp: int) -> int:
    """Parameters a rank holds when the MLP's layers are paired column-then-row over tp.

    Column layer (a -> b): b/tp rows of the weight and of the bias; row layer (b -> c):
    c × b/tp of the weight and the whole bias c (added once, after the sum); an unpaired
    last layer stays whole on every rank.
    """
    n_linear, total = len(sizes) - 1, 0
    for k in range(n_linear):
        a, b = sizes[k], sizes[k + 1]
        if tp == 1 or (k % 2 == 0 and k + 1 == n_linear):
            total += a * b + b                  # whole
        elif k % 2 == 0:
            total += (b // tp) * a + b // tp    # column-parallel
        else:
            total += b * (a // tp) + b          # row-parallel
    return total


def dp_bytes(sizes, tp: int, dp: int) -> int:
    """Data-parallel bytes per rank per step: one all-reduce of the rank's gradients.

    Every gradient of the rank's shard is averaged over its dp line once per step
    (lab 05): 4 bytes per parameter it holds. Nothing moves when dp = 1.
    """
    return 0 if dp == 1 else params_per_rank(sizes, tp) * F32


def expected_dp_tp(sizes, global_batch: int, dp: int, tp: int) -> dict[str, int]:
    """Bytes per rank per step on each axis of a dp × tp mesh: {"tp": ..., "dp": ...}.

    Each replica computes on global_batch / dp rows, so tp's bytes shrink with dp while
    dp's depend only on the parameters.
    """
    return {"tp": tp_bytes(sizes, global_batch // dp, tp), "dp": dp_bytes(sizes, tp, dp)}


def mlp_boundary_width(sizes, layer: int) -> int:
    """Width of the activation entering module ``layer`` of ``models.mlp(sizes)``.

    The modules are Linear, ReLU, Linear, ReLU, ..., Linear: module j reads a tensor of
    sizes[(j + 1) // 2] features.
    """
    return sizes[(layer + 1) // 2]


def stage_params(sizes, first: int, last: int) -> int:
    """Parameters of modules first .. last - 1 of the MLP (only the Linear ones have any)."""
    return sum(sizes[j // 2] * sizes[j // 2 + 1] + sizes[j // 2 + 1]
               for j in range(first, last) if j % 2 == 0)


def expected_dp_pp(cfg: SplitConfig, dp: int) -> list[dict[str, int]]:
    """Bytes per rank per step on each axis of a dp × pp mesh, one dict per stage.

    pp (GPipe, Huang et al., 2019): at each cut, every micro-batch's activation travels
    forward and its gradient backward; b/m rows each, m micro-batches, so per step a
    stage moves 2 × b × width floats per cut it touches (it sends one way and receives
    the other), whatever m. b is the replica's batch (cfg.batch_size).
    dp: each stage all-reduces the gradients of the parameters it holds (lab 05).
    cfg: a prepared replica config (``pipeline.prepare``), whose bounds cut the stages.
    """
    sizes, b = cfg.sizes, cfg.batch_size
    edges = [0, *cfg.bounds, 2 * (len(sizes) - 1) - 1]
    out = []
    for s in range(len(edges) - 1):
        cuts = [e for e in (edges[s], edges[s + 1]) if 0 < e < edges[-1]]
        pp = sum(2 * b * mlp_boundary_width(sizes, e) * F32 for e in cuts)
        dpb = 0 if dp == 1 else stage_params(sizes, edges[s], edges[s + 1]) * F32
        out.append({"pp": pp, "dp": dpb})
    return out


# ------------------------------------------------------------------ dp × tp by hand
def average_replicas(model: nn.Module, group, bucket: bool = True) -> None:
    """Average the gradients of ``model`` over the replicas in ``group`` (its dp line).

    bucket: one all-reduce of all gradients flattened together, as DDP's buckets do
    (one latency per step); False: lab 05's ``average_gradients``, one per tensor.
    The bytes are the same either way.
    """
    if not bucket:
        data_parallel.average_gradients(model, group)
        return
    training.all_reduce_gradients(model, group, op="avg", name="dp all_reduce")


def replica_batches(model: str, global_batch: int, rows: slice):
    """This replica's rows of every global batch (the same batches a single device sees)."""
    for xb, yb in training.digit_batches(model, global_batch):
        yield xb[rows], yb[rows]


def train_dp_tp(rank: int, world_size: int, dp: int = 2, tp: int = 2, sizes=SIZES,
                global_batch: int = 64, steps: int = 5, lr: float = 0.1, seed: int = 0,
                bucket: bool = True, *, mesh=None) -> dict:
    """Rank function: data parallel across tensor-parallel groups, on a dp × tp mesh.

    The rank keeps its tp slice of every layer (``slice_mlp`` on its tp line), computes
    on its dp line's share of the global batch, and averages its slices' gradients with
    the ranks that hold the same slices (its dp line). An axis of size 1 is left out:
    the whole model when tp = 1, no averaging when dp = 1. bucket: see
    ``average_replicas``.
    """
    mesh = mesh or init_mesh(dp=dp, tp=tp)
    device = runtime.rank_device()
    dense = training.build_model("mlp", sizes=sizes, seed=seed)
    model = (tensor_parallel.slice_mlp(dense, "column_row", mesh.line("tp"))
             if tp > 1 else dense).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    rows = mesh.line("dp").rows(global_batch, "global batch")
    batches = replica_batches("mlp", global_batch, rows)
    out = {"coords": {a: mesh.coord(a) for a in mesh.axes}, "labels": mesh.labels(),
           "losses": [], "step_s": []}
    for _ in range(steps):
        x, y = training.on_device(*next(batches), device)
        runtime.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        with span("forward"):
            loss = loss_fn(model(x), y)
        with span("backward"):
            loss.backward()                                      # tp: f and g all-reduce here
        if dp > 1:
            average_replicas(model, mesh.line("dp"), bucket)       # dp: once per step
        with span("update"):
            opt.step()
        runtime.synchronize()
        out["step_s"].append(time.perf_counter() - t0)
        out["losses"].append(loss.item())
    out["shards"] = {n: training.to_numpy(p) for n, p in model.named_parameters()}
    return out


def dense_of_shards(results, sizes, tp: int) -> dict:
    """The whole model's parameters from the shards of one tp line (a result per rank).

    Column layers' slices are stacked by rows, row layers' by columns; whole ones (and a
    row layer's bias) are taken from the first rank.
    """
    kinds = tensor_parallel.layer_kinds(sizes, tp, "column_row") if tp > 1 else {}
    out = {}
    for name in results[0]["shards"]:
        parts = [r["shards"][name] for r in results]
        kind = kinds.get(name, "whole")
        if kind == "column":
            out[name] = np.concatenate(parts, axis=0)
        elif kind == "row" and name.endswith("weight"):
            out[name] = np.concatenate(parts, axis=1)
        else:
            out[name] = parts[0]
    return out


# ------------------------------------------------------------------ dp × pp by hand
def train_dp_pp(rank: int, world_size: int, cfg: SplitConfig, micro_batches: int, ops,
                dp: int = 2, pp: int = 2, bucket: bool = True, *, mesh=None) -> dict:
    """Rank function: data parallel across pipelines, on a dp × pp mesh.

    ``cfg`` is one replica's prepared config (``pipeline.prepare``, batch_size = the
    global batch / dp). The pipeline executor runs the stage on its pp line, fed this
    replica's rows of each global batch; before its update, the stage's gradients are
    averaged over the dp line: the replicas of the same stage.
    """
    mesh = mesh or init_mesh(dp=dp, pp=pp)
    rows = mesh.line("dp").rows(cfg.batch_size * dp, "global batch")
    dp_line = mesh.line("dp")

    def average_over_replicas(stage):
        if dp > 1 and any(True for _ in stage.parameters()):
            average_replicas(stage, dp_line, bucket)

    out = pipeline.train_pipeline(rank, world_size, cfg, micro_batches, ops,
                                  group=mesh.line("pp"),
                                  batches=replica_batches(cfg.model, cfg.batch_size * dp, rows),
                                  before_update=average_over_replicas)
    out["coords"] = {a: mesh.coord(a) for a in mesh.axes}
    out["labels"] = mesh.labels()
    return out


def replica_config(cfg: SplitConfig, dp: int) -> SplitConfig:
    """One replica's config: ``cfg`` describes the global batch, a replica gets 1/dp."""
    return replace(cfg, batch_size=share(cfg.batch_size, dp, f"dp={dp} replicas"))


# ------------------------------------------------------------------ the library way
def library_dp_tp(rank: int, world_size: int, dp: int = 2, tp: int = 2, sizes=SIZES,
                  global_batch: int = 64, steps: int = 5, lr: float = 0.1, seed: int = 0,
                  data=("fsdp", "ddp")) -> dict:
    """Rank function: DTensor tensor parallel on the mesh's tp dimension, and PyTorch's
    data parallel on its dp dimension; one run per entry of ``data``.

    fsdp: ``fully_shard(model, mesh=device_mesh["dp"])`` (FSDP2) after
        ``parallelize_module``: the parameters become DTensors on the 2-D mesh.
    ddp: ``DistributedDataParallel(model, device_mesh=device_mesh["dp"])``, which prepares
        the TP module itself (its private ``_pre_dp_module_transform``: the parameters
        DDP sees are the local shards, swapped back to DTensors around each forward).
    ddp_process_group: ``DistributedDataParallel(model, process_group=mesh.group("dp"))``;
        with torch 2.13 on CPU it fails at once (it broadcasts the parameters and
        ``c10d.broadcast_`` has no DTensor rule): the error is returned, not raised.
    Returns, per entry, the whole parameters after ``steps`` steps (gathered from the
    shards) and this rank's tp slice of each, to compare with the hand-written shards.
    """
    import logging
    import warnings

    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import parallelize_module

    # gathering a 2-D sharded parameter for the comparison warns (two all-gathers)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    mesh = init_mesh(dp=dp, tp=tp)
    dmesh = mesh.device_mesh
    device = runtime.library_device()   # DTensor/FSDP2 talk to the backend itself: see runtime
    rows = mesh.line("dp").rows(global_batch, "global batch")
    out = {}
    for kind in data:
        model = training.build_model("mlp", sizes=sizes, seed=seed).to(device)
        model = parallelize_module(model, dmesh["tp"], tensor_parallel.tp_plan(model))
        if kind == "fsdp":
            from torch.distributed.fsdp import fully_shard
            net = fully_shard(model, mesh=dmesh["dp"])
        elif kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            net = DistributedDataParallel(model, device_mesh=dmesh["dp"])
        elif kind == "ddp_process_group":       # what the DDP tutorial does: does it work?
            from torch.nn.parallel import DistributedDataParallel
            try:
                net = DistributedDataParallel(model, process_group=mesh.group("dp"))
            except Exception as exc:  # noqa: BLE001 - reported, not hidden
                out[kind] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
                del model
                gc.collect()
                continue
        else:
            raise ValueError(f"data must be 'fsdp', 'ddp' or 'ddp_process_group', got {kind!r}")
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        batches = replica_batches("mlp", global_batch, rows)
        losses = []
        for _ in range(steps):
            x, y = training.on_device(*next(batches), device)
            with span(f"DTensor tp + {kind} step"):         # the library communicates itself
                opt.zero_grad()
                loss = nn.functional.cross_entropy(net(x), y)
                loss.backward()
                opt.step()
            losses.append(loss.item())
        whole, tp_slice = {}, {}
        for name, _ in training.build_model("mlp", sizes=sizes).named_parameters():
            index, attr = name.split(".")
            p = getattr(model[int(index)], attr)   # DDP swaps parameters for DTensors: read the module
            p = p.detach()
            if isinstance(p, DTensor):
                # the tp slice: replicate over dp (if sharded there), keep the tp placement
                placements = [Replicate() if d == "dp" else p.placements[i]
                              for i, d in enumerate(p.device_mesh.mesh_dim_names or ())]
                local = (p.redistribute(p.device_mesh, placements).to_local()
                         if p.device_mesh.ndim == 2 else p.to_local())
                tp_slice[name] = training.to_numpy(local)
                whole[name] = training.to_numpy(p.full_tensor())
            else:
                tp_slice[name] = whole[name] = training.to_numpy(p)
        out[kind] = {"state": whole, "tp_slice": tp_slice, "losses": losses}
        del net, model, opt, loss                # let DTensor/DDP objects go before teardown
        gc.collect()
    out["coords"] = {a: mesh.coord(a) for a in mesh.axes}
    out["labels"] = mesh.labels()
    return out


# ------------------------------------------------------------------ measuring the shapes
def measure_shapes(rank: int, world_size: int, prepared, sizes=SIZES, global_batch: int = 64,
                   steps: int = 6, micro_batches: int = 4, lr: float = 0.1) -> list[dict]:
    """Rank function: train every mesh shape of ``prepared`` in turn, in one launch.

    prepared: per shape, ``(HybridShape, cfg, ops)`` as ``course.lab07.check_hybrid``
    made it (checked once, before any rank started; cfg and ops only for dp × pp); each
    shape must cover the world. Returns, per shape, the time window of its steps, so the
    timeline can be cut per shape (and each step timed from it). Ranks wait for each
    other between shapes, so one shape's start-up never overlaps another's steps.
    """
    out = []
    for hs, cfg, ops in prepared:
        runtime.synchronize()   # a GPU's queued kernels belong to the previous shape
        comm.barrier(name="between shapes")
        t0 = time.perf_counter()
        if hs.axis == "tp":
            train_dp_tp(rank, world_size, hs.dp, hs.tp, sizes, global_batch, steps, lr)
        else:
            train_dp_pp(rank, world_size, cfg, hs.micro_batches(micro_batches), ops, hs.dp,
                        hs.pp)
        runtime.synchronize()   # the window ends when the GPU has done this shape's work
        comm.barrier(name="between shapes")
        out.append({"shape": hs.as_dict(), "window": (t0, time.perf_counter())})
    return out


def calibrate(rank: int, world_size: int, sizes=SIZES, batches=(16, 32, 64),
              message_bytes=(4096, 65536, 1 << 20, 4 << 20), repeats: int = 15) -> dict:
    """Rank function: the costs the cost model needs, measured with every rank busy.

    compute: seconds of one dense training step (forward, backward, update) of the MLP
        at each batch size (those a replica of the lab's shapes gets: 64 / dp), run on
        every rank at once (so the ranks share the cores as they will in a hybrid).
    all_reduce: seconds of an all-reduce within pairs of ranks (both pairs at once) and
        over all ranks, per message size.
    send: seconds of one message between pair neighbours, per message size (half a
        ping-pong: a blocking send may return before the data has arrived).
    Medians over ``repeats`` after one warm-up; rank 0's numbers are returned.
    """
    device = runtime.rank_device()
    mesh = init_mesh(pair=world_size // 2, member=2)
    pair = mesh.line("member")
    out = {"compute": {}, "all_reduce": {2: {}, world_size: {}}, "send": {}}

    def median_time(fn):
        return runtime.timed_median(fn, repeats,
                                    before=lambda: comm.barrier(name="calibration"))

    model = training.build_model("mlp", sizes=sizes, seed=0).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for b in batches:
        x = torch.randn(b, sizes[0], device=device)
        y = torch.randint(0, sizes[-1], (b,), device=device)

        def step():
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        out["compute"][b] = median_time(step)
    for nbytes in message_bytes:
        t = torch.zeros(nbytes // F32, device=device)
        out["all_reduce"][2][nbytes] = median_time(lambda: comm.all_reduce(t, group=pair))
        out["all_reduce"][world_size][nbytes] = median_time(lambda: comm.all_reduce(t))

        def ping_pong():            # there and back: half of it is one message
            if pair.first:
                comm.send(t, pair.next, group=pair)
                comm.recv(t, pair.next, group=pair)
            else:
                comm.recv(t, pair.prev, group=pair)
                comm.send(t, pair.prev, group=pair)
        out["send"][nbytes] = median_time(ping_pong) / 2
    return out if rank == 0 else {}


def survey(rank: int, world_size: int, prepared, sizes=SIZES, global_batch: int = 64,
           steps: int = 6, micro_batches: int = 4) -> dict:
    """Rank function: ``calibrate``, then ``measure_shapes``, in one launch."""
    costs = calibrate(rank, world_size, sizes)
    return {"calibration": costs,
            "shapes": measure_shapes(rank, world_size, prepared, sizes, global_batch, steps,
                                     micro_batches)}
