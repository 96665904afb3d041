"""Lab 15: the U-Net of lab 01 on several devices, built from the course's strategies.

* **one device** (``train_single``): the reference every strategy is compared with.
* **data parallel** (``train_data_parallel``): every rank a whole U-Net on its rows of
  each global batch, the gradients averaged in one bucket (lab 05, as DDP does).
* **a pipeline** (``train_pipeline``): the U-Net cut between blocks, encoder | decoder by
  default. Unlike a layer stack, the cut is crossed by the skip connections as well as
  by the bottleneck's activation (``parlab.split.crossing``): every one of them is a
  traced message forward, and its gradient one back. Lab 04's executor runs the stage
  (``pipeline.run_stage``), one message per tensor.
* **dp × pp** (``train_dp_pp``): pipelines on the pp lines of a mesh, the stages'
  gradients averaged over the dp lines (lab 07's hooks).

The loss is a weighted cross-entropy (``WeightedPixelLoss``): a mean over pixels, so a
replica's or a micro-batch's share of it adds up to the whole batch's, as every
strategy here needs to equal one device.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from .. import data as datasets
from .. import pipeline as schedules
from ..split import UNetConfig, crossing
from ..trace import span
from . import comm, hybrid, pipeline, runtime, training
from .groups import as_group, name_group
from .mesh import init_mesh
from .models import UNet, run_blocks

BLOCKS = UNet.BLOCKS


# ------------------------------------------------------------------ model, data, loss
class WeightedPixelLoss(nn.Module):
    """Cross-entropy of every pixel times its class's weight, averaged over the pixels.

    ``nn.CrossEntropyLoss(weight=...)`` divides by the weights of the batch's pixels
    instead, so a replica's loss would not average to the whole batch's; a plain mean
    over pixels does.
    """

    def __init__(self, weights):
        super().__init__()
        self.register_buffer("weights", torch.as_tensor(weights, dtype=torch.float32))

    def forward(self, logits, masks):
        per_pixel = nn.functional.cross_entropy(logits, masks, reduction="none")
        return (self.weights.to(logits.device)[masks] * per_pixel).mean()


def training_data(cfg: UNetConfig):
    """The training images and masks (``parlab.data.shapes``, seed 0)."""
    return datasets.shapes(cfg.images, cfg.size, seed=0)


def loss_fn(cfg: UNetConfig) -> WeightedPixelLoss:
    """The weighted loss, weights from the training masks (``data.class_weights``)."""
    return WeightedPixelLoss(datasets.class_weights(training_data(cfg)[1]))


def build(cfg: UNetConfig) -> UNet:
    """The U-Net with the same initial weights on every rank."""
    torch.manual_seed(cfg.seed)
    return UNet(cfg.base)


def batches_of(cfg: UNetConfig, rows: slice = slice(None)):
    """Endless fixed-order global batches of the training shapes, ``rows`` of each (a
    replica's share): every rank and the reference see the same sequence."""
    for xb, yb in datasets.endless_batches(*training_data(cfg), cfg.global_batch):
        yield xb[rows], yb[rows]


def exact_float32() -> None:
    """Keep convolutions in float32 on a GPU (cuDNN may use TF32 by default), so the
    strategies can be compared with one device weight by weight."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def train_single(cfg: UNetConfig, device="cpu") -> dict:
    """The reference: one device, the whole global batch, ``cfg.steps`` steps."""
    exact_float32()
    model = build(cfg).to(device)
    opt = training.make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    loss = loss_fn(cfg)
    out = {"losses": []}
    for step, (xb, yb) in zip(range(cfg.steps), batches_of(cfg)):
        x, y = training.on_device(xb, yb, device)
        opt.zero_grad()
        value = loss(model(x), y)
        value.backward()
        if step == 0:
            out["first_grads"] = training.grads_numpy(model)
        opt.step()
        out["losses"].append(value.item())
    out["state"] = training.state_numpy(model)
    return out


# ------------------------------------------------------------------ stages
class UNetStage(nn.Module):
    """Blocks ``first:last`` of a U-Net, holding only the submodules they use (named as
    in the whole U-Net, so the stages' state dicts together are the U-Net's)."""

    def __init__(self, unet: UNet, first: int, last: int):
        super().__init__()
        self.first, self.last = first, last
        for _, _, modules in BLOCKS[first:last]:
            for name in modules:
                self.add_module(name, getattr(unet, name))
        self.receives = ("x",) if first == 0 else tuple(crossing(BLOCKS, first))
        self.sends = ("logits",) if last == len(BLOCKS) else tuple(crossing(BLOCKS, last))

    def forward(self, *inputs):
        tensors = run_blocks(self, self.first, self.last, dict(zip(self.receives, inputs)))
        out = tuple(tensors[name] for name in self.sends)
        return out[0] if self.last == len(BLOCKS) else out


def tensor_shapes(cfg: UNetConfig, batch: int) -> dict[str, tuple]:
    """Shape of every named tensor of the U-Net for ``batch`` images (a dry run)."""
    with torch.no_grad():
        tensors = run_blocks(UNet(cfg.base), 0, len(BLOCKS),
                             {"x": torch.zeros(batch, 1, cfg.size, cfg.size)})
    return {name: tuple(t.shape) for name, t in tensors.items()}


def stage(cfg: UNetConfig, index: int, micro_batch: int) -> pipeline.Stage:
    """Pipeline stage ``index`` of ``cfg.cuts``: its blocks, and the shapes of the tensors
    it receives for one micro-batch of ``micro_batch`` images."""
    edges = [0, *cfg.cuts, len(BLOCKS)]
    part = UNetStage(build(cfg), edges[index], edges[index + 1])
    shapes = tensor_shapes(cfg, micro_batch)
    receives = () if index == 0 else tuple((n, shapes[n]) for n in part.receives)
    sends = () if part.last == len(BLOCKS) else part.sends
    return pipeline.Stage(part, receives, sends)


def schedule(cfg: UNetConfig, micro_batches: int | None = None):
    """The stages' lists of F/B operations (``cfg.schedule``), checked."""
    m = micro_batches or cfg.micro_batches
    ops = schedules.make(cfg.schedule, cfg.stages, m)
    schedules.check(ops, cfg.stages, m)
    return ops


# ------------------------------------------------------------------ rank functions
def train_data_parallel(rank: int, world_size: int, cfg: UNetConfig, *, group=None) -> dict:
    """Rank function: a whole U-Net on this replica's rows of every global batch; the
    gradients averaged over the group in one all-reduce (one bucket) before the update.
    Its losses are its rows' (the loss is a mean over pixels): the replicas' mean is the
    whole batch's."""
    exact_float32()
    g, device = as_group(group), runtime.rank_device()
    model = build(cfg).to(device)
    opt = training.make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    loss = loss_fn(cfg)
    out = {"losses": [], "step_s": []}
    for step, (xb, yb) in zip(range(cfg.steps), batches_of(cfg, g.rows(cfg.global_batch))):
        x, y = training.on_device(xb, yb, device)
        runtime.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        with span("forward"):
            value = loss(model(x), y)
        with span("backward"):
            value.backward()
        if g.size > 1:
            hybrid.average_replicas(model, g)
        if step == 0:
            out["first_grads"] = training.grads_numpy(model)
        with span("update"):
            opt.step()
        runtime.synchronize()
        out["step_s"].append(time.perf_counter() - t0)
        out["losses"].append(value.item())
    out["state"] = training.state_numpy(model)
    return out


def train_pipeline(rank: int, world_size: int, cfg: UNetConfig, *, group=None,
                   batches=None, before_update=None, batch: int | None = None) -> dict:
    """Rank function: stage i of the U-Net cut at ``cfg.cuts`` on the group's i-th rank.

    batches, before_update: lab 07's hooks (a replica's rows; averaging over dp before
    the update); batch: the rows each step of this pipeline gets (default the global
    batch).
    """
    exact_float32()
    g = as_group(group)
    if g.size != cfg.stages:
        raise ValueError(f"cuts {list(cfg.cuts)} make {cfg.stages} stages but the group has "
                         f"{g.size} ranks")
    batch = batch or cfg.global_batch
    micro = batch // cfg.micro_batches
    return pipeline.run_stage(stage(cfg, g.index, micro), cfg.micro_batches, schedule(cfg),
                              batches or batches_of(cfg), steps=cfg.steps,
                              optimizer=cfg.optimizer, lr=cfg.lr, loss_fn=loss_fn(cfg),
                              group=g, before_update=before_update)


def train_dp_pp(rank: int, world_size: int, cfg: UNetConfig, dp: int = 2, *,
                mesh=None) -> dict:
    """Rank function: data parallel across U-Net pipelines on a dp × pp mesh.

    Each pp line is a pipeline (``cfg.cuts``) fed its replica's rows of every global
    batch; before the update each stage averages its gradients with the same stage of
    the other replicas (its dp line).
    """
    mesh = mesh or init_mesh(dp=dp, pp=cfg.stages)
    dp_line = mesh.line("dp")
    rows = dp_line.rows(cfg.global_batch, "global batch")

    def average_over_replicas(part):
        if dp > 1:
            hybrid.average_replicas(part, dp_line)

    out = train_pipeline(rank, world_size, cfg, group=mesh.line("pp"),
                         batches=batches_of(cfg, rows), before_update=average_over_replicas,
                         batch=rows.stop - rows.start)
    out["coords"] = {a: mesh.coord(a) for a in mesh.axes}
    out["labels"] = mesh.labels()
    return out


PLANS = ("dp", "pp", "dp_pp")


def run_plan(rank: int, world_size: int, cfg: UNetConfig, plan: str, dp: int = 1) -> dict:
    """Rank function: one of ``PLANS`` on the launched ranks, each axis a named line of a
    mesh (so the timeline tells its bytes apart): "dp" on every rank, "dp_pp" on a
    ``dp`` × ``cfg.stages`` mesh, "pp" on the first ``cfg.stages`` ranks (the others
    wait for it)."""
    if plan == "dp":
        return train_data_parallel(rank, world_size, cfg, group=init_mesh(dp=world_size).line("dp"))
    if plan == "dp_pp":
        return train_dp_pp(rank, world_size, cfg, dp)
    if plan == "pp":
        if world_size == cfg.stages:
            return train_pipeline(rank, world_size, cfg, group=init_mesh(pp=world_size).line("pp"))
        import torch.distributed as dist
        pg = dist.new_group(list(range(cfg.stages)))     # collective: every rank makes it
        name_group(pg, "pp")
        out = train_pipeline(rank, world_size, cfg, group=pg) if rank < cfg.stages else {}
        comm.barrier(name="pipeline done")
        return out
    raise ValueError(f"plan must be one of {PLANS}, got {plan!r}")


def measure_plans(rank: int, world_size: int, cfg: UNetConfig, plans) -> list[dict]:
    """Rank function: each (plan, dp) of ``plans`` in turn, in one launch, with the time
    window of its steps (the ranks wait for each other between plans, so one plan's
    start-up never overlaps another's steps), and its result."""
    out = []
    for plan, dp in plans:
        runtime.synchronize()
        comm.barrier(name="between plans")
        t0 = time.perf_counter()
        result = run_plan(rank, world_size, cfg, plan, dp)
        runtime.synchronize()
        comm.barrier(name="between plans")
        out.append({"plan": plan, "dp": dp, "window": (t0, time.perf_counter()),
                    "result": result})
    return out


def pipeline_at_cuts(rank: int, world_size: int, cfg: UNetConfig, cuts) -> list[dict]:
    """Rank function: for each block index in ``cuts``, a 2-stage pipeline of the U-Net
    cut there (``cfg.steps`` steps), one after the other on the same 2 ranks; the time
    window of each (to count the bytes its cut sent) and its result."""
    from dataclasses import replace
    out = []
    for cut in cuts:
        comm.barrier(name="between cuts")
        t0 = time.perf_counter()
        result = train_pipeline(rank, world_size, replace(cfg, cuts=(cut,)))
        comm.barrier(name="between cuts")
        out.append({"cut": cut, "window": (t0, time.perf_counter()), "result": result})
    return out
