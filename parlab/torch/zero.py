"""Lab 08: sharded data parallel. ZeRO stages 1, 2 and 3 by hand, FSDP2, and offload.

Plain data parallel (lab 05) keeps N identical copies of everything: parameters,
gradients and optimizer state. ZeRO (Rajbhandari et al., 2020) keeps the data-parallel
computation and removes the copies: each of the N ranks of the group *owns* 1/N of every
layer's parameters (its shard) and keeps only what it needs for that shard.

* stage 1: each rank keeps the optimizer state (Adam's two moments) of its shard only.
  After the backward pass the gradients are reduce-scattered (each rank receives the
  average of its shard), each rank updates its shard, and an all-gather brings every rank
  the updated parameters. A reduce-scatter plus an all-gather is exactly what a ring
  all-reduce does (lab 05): the same bytes as plain data parallel.
* stage 2: as stage 1, and each layer's gradient is reduce-scattered as soon as the
  backward pass has produced it, then dropped: a rank keeps only its shard's gradient.
* stage 3: the parameters too: a rank keeps its shard of each layer and nothing else.
  A layer's full weights are all-gathered just before the forward pass uses them and
  freed after; gathered again for the backward pass, whose weight gradient is
  reduce-scattered at once. One more all-gather per step: 1.5 times the bytes.

Each layer ("unit": a module with parameters of its own, here the Linear layers) is
flattened into one vector padded to a multiple of N, and rank i owns elements
[i·s, (i+1)·s) of it (s = padded length / N), as FSDP and DeepSpeed do.

``train_zero`` runs plain data parallel (stage 0), the three stages, stage 2 with its
optimizer offloaded to the host, and PyTorch's FSDP2 (``fully_shard``) one after the other
in one launch, and returns for each the parameters after k steps and the bytes of the
tensors it keeps, as measured on those tensors. The formulas are ``parlab.zero``.
"""
from __future__ import annotations

import gc
import time

import torch
from torch import nn

from .. import zero as zero_plan
from ..trace import COMPUTE, recorder, span
from . import comm, data_parallel, runtime, training
from .groups import as_group

SIZES = (64, 256, 256, 128, 10)
VARIANTS = ("ddp", "zero1", "zero2", "zero3", "zero2_offload", "fsdp2")


def units_of(model: nn.Module) -> list[nn.Module]:
    """The modules that hold parameters of their own, in order: the units ZeRO shards."""
    return [m for m in model.modules() if list(m.parameters(recurse=False))]


def shard_size(numel: int, n: int) -> int:
    """Elements of one rank's shard of a flat vector of ``numel``, padded to n shards."""
    return -(-numel // n)


# ------------------------------------------------------------------ the step, on one vector
def zero2_step(flat_params: torch.Tensor, flat_grad: torch.Tensor, lr: float,
               group=None) -> None:
    """ZeRO-2's update of a flat parameter vector with plain SGD, in place.

    Every rank holds the same ``flat_params`` and the gradient of its own rows of the
    batch; the length divides by the group size. Reduce-scatter: position i receives the
    sum of chunk i of every rank's gradient (divide by n: the average). Update: only
    chunk i, the rank's shard. All-gather: every rank receives every updated shard.
    """
    g = as_group(group)
    grad_shard = comm.reduce_scatter(flat_grad, group=g) / g.size
    shard = flat_params.chunk(g.size)[g.index]          # a view: updated in place
    shard -= lr * grad_shard
    flat_params.copy_(torch.cat(comm.all_gather(shard, group=g)))


# ------------------------------------------------------------------ stages 1 and 2
class FlatShards:
    """Every unit's parameters as views into one flat, padded buffer per unit; this rank's
    slice of each buffer is an ``nn.Parameter`` the optimizer updates in place.

    host: keep a float32 copy of the shards (the master weights) and the optimizer on
    the host ("cpu"); the update runs there (ZeRO-Offload, Ren et al., 2021).
    """

    def __init__(self, model: nn.Module, group, lr: float, host: bool = False):
        self.g = as_group(group)
        n, i = self.g.size, self.g.index
        self.units = [list(m.parameters(recurse=False)) for m in units_of(model)]
        self.flats, self.shards = [], []
        for params in self.units:
            numel = sum(p.numel() for p in params)
            s = shard_size(numel, n)
            flat = torch.zeros(s * n, device=params[0].device)
            offset = 0
            for p in params:                      # the model's parameters become views
                flat[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
                p.data = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            self.flats.append(flat)
            self.shards.append(nn.Parameter(flat[i * s:(i + 1) * s]))   # shares the storage
        self.keep_full_grads = True              # until reduce_during_backward (stage 2)
        self.host = [nn.Parameter(s.detach().to("cpu", copy=True)) for s in self.shards] \
            if host else None
        self.opt = torch.optim.Adam(self.host or self.shards, lr=lr)

    def reduce_scatter(self, u: int, free: bool) -> None:
        """Average unit ``u``'s gradient over the group; keep this rank's shard of it.

        free: drop the unit's full gradient afterwards (stage 2); stage 1 keeps it.
        """
        params, flat = self.units[u], self.flats[u]
        full = torch.zeros_like(flat)
        offset = 0
        for p in params:
            full[offset:offset + p.numel()] = p.grad.reshape(-1)
            offset += p.numel()
        self.shards[u].grad = comm.reduce_scatter(full, op="avg", group=self.g,
                                                  name="grad reduce_scatter")
        if free:
            for p in params:
                p.grad = None

    def reduce_during_backward(self) -> None:
        """Stage 2: reduce-scatter each unit the moment the backward pass has produced
        all of its gradients, and drop them (hooks on gradient accumulation)."""
        ready = [0] * len(self.units)
        self.keep_full_grads = False

        def arrived(u):
            ready[u] += 1
            if ready[u] == len(self.units[u]):
                ready[u] = 0
                self.reduce_scatter(u, free=True)

        for u, params in enumerate(self.units):
            for p in params:
                p.register_post_accumulate_grad_hook(lambda _p, u=u: arrived(u))

    def step(self) -> None:
        """Update this rank's shards (on the host if offloaded), then all-gather them."""
        if self.host:
            with span("grads to host"):
                for h, s in zip(self.host, self.shards):
                    h.grad = s.grad.to("cpu", copy=True)
                    s.grad = None                   # the device keeps no gradient shard
        with span("update" if not self.host else "update on host"):
            self.opt.step()
        if self.keep_full_grads:                 # stage 1: the shard's gradient was a
            for s in self.shards:                # slice of the full buffer, not kept twice
                s.grad = None
        if self.host:
            with span("params to device"):
                for h, s in zip(self.host, self.shards):
                    s.data.copy_(h.detach())
        for s, flat in zip(self.shards, self.flats):
            pieces = comm.all_gather(s.detach(), group=self.g, name="param all_gather")
            flat.copy_(torch.cat(pieces))

    def held(self, model: nn.Module) -> dict:
        """Bytes of the tensors this rank keeps, by part, and where (device or host)."""
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        grads += [s.grad for s in self.shards if s.grad is not None]
        state = training.optimizer_state_bytes(self.opt)
        out = {"parameters": training.tensor_bytes(self.flats),
               "gradients": training.tensor_bytes(grads),
               # offloaded, Adam's moments live with the host copies: none on the device
               "optimizer state": 0 if self.host else state}
        if self.host:
            out["on the host"] = state + training.tensor_bytes(self.host) \
                + training.tensor_bytes(h.grad for h in self.host if h.grad is not None)
        return out


# ------------------------------------------------------------------ stage 3
class _GatheredLinear(torch.autograd.Function):
    """y = x Wᵀ + b where W and b exist whole only while this layer computes.

    Forward: all-gather the layer's shards, compute, free. Backward: all-gather again,
    compute the input's gradient and the weight's, reduce-scatter the weight's gradient
    (averaged over the group): the rank's shard receives only its slice.
    """

    @staticmethod
    def forward(ctx, x, shard, layer):
        w, b = layer.gather(shard, "param all_gather (forward)")
        ctx.save_for_backward(x, shard)
        ctx.layer = layer
        return nn.functional.linear(x, w, b)     # w, b go out of scope: freed

    @staticmethod
    def backward(ctx, gy):
        x, shard = ctx.saved_tensors
        layer = ctx.layer
        w, _ = layer.gather(shard, "param all_gather (backward)")
        gx = gy @ w if ctx.needs_input_grad[0] else None
        full = torch.zeros(shard.numel() * layer.g.size, device=gy.device)
        full[:w.numel()] = (gy.t() @ x).reshape(-1)
        full[w.numel():w.numel() + w.shape[0]] = gy.sum(0)
        grad_shard = comm.reduce_scatter(full, op="avg", group=layer.g,
                                         name="grad reduce_scatter")
        return gx, grad_shard, None


class ShardedLinear(nn.Module):
    """A Linear layer of which this rank keeps only its shard (ZeRO stage 3)."""

    def __init__(self, linear: nn.Linear, group):
        super().__init__()
        self.g = as_group(group)
        self.out_features, self.in_features = linear.weight.shape
        flat = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        s = shard_size(flat.numel(), self.g.size)
        padded = torch.zeros(s * self.g.size, device=flat.device)
        padded[:flat.numel()] = flat
        i = self.g.index
        self.shard = nn.Parameter(padded[i * s:(i + 1) * s].clone())
        self.gathered_bytes = 0                  # the largest whole layer held at once

    def gather(self, shard: torch.Tensor, name: str):
        full = torch.cat(comm.all_gather(shard.detach(), group=self.g, name=name))
        self.gathered_bytes = max(self.gathered_bytes, full.numel() * full.element_size())
        nw = self.out_features * self.in_features
        return (full[:nw].view(self.out_features, self.in_features),
                full[nw:nw + self.out_features])

    def forward(self, x):
        return _GatheredLinear.apply(x, self.shard, self)

    def whole(self, name: str) -> dict:
        """The layer's full weight and bias as numpy (gathered), for comparisons."""
        w, b = self.gather(self.shard, "gather for the result")
        return {f"{name}.weight": training.to_numpy(w), f"{name}.bias": training.to_numpy(b)}


def shard_model(model: nn.Sequential, group) -> nn.Sequential:
    """The model with every Linear replaced by its stage-3 shard (other layers kept)."""
    layers = []
    for m in model:
        if isinstance(m, nn.Linear):
            layers.append(ShardedLinear(m, group))
        elif list(m.parameters()):
            raise ValueError(f"stage 3 by hand shards Linear layers only, not {type(m).__name__}")
        else:
            layers.append(m)
    return nn.Sequential(*layers)


# ------------------------------------------------------------------ training
def _fsdp2(model: nn.Module, g) -> nn.Module:
    """PyTorch's FSDP2: ``fully_shard`` each layer, then the root, on a 1-D DeviceMesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    mesh = DeviceMesh.from_group(g.pg or dist.group.WORLD, runtime.library_device().type,
                                 mesh=torch.tensor(g.ranks), mesh_dim_names=("dp",))
    for m in units_of(model):
        fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class _Replicated:
    """Plain data parallel by hand ("ddp"): every rank keeps everything, and averages
    the gradients after the backward pass (lab 05's ``average_gradients``)."""

    def __init__(self, net, g, lr: float):
        self.net, self.g = net, g
        self.opt = torch.optim.Adam(net.parameters(), lr=lr)

    def after_backward(self) -> None:
        data_parallel.average_gradients(self.net, self.g)

    def update(self) -> None:
        with span("update"):
            self.opt.step()
        self.opt.zero_grad(set_to_none=False)     # keep the gradient buffers, as DDP does

    def kept(self) -> tuple[dict, dict]:
        """(bytes this rank keeps after a step, by kind; the whole parameters)."""
        net = self.net
        return ({"parameters": training.tensor_bytes(net.parameters()),
                 "gradients": training.tensor_bytes(p.grad for p in net.parameters()),
                 "optimizer state": training.optimizer_state_bytes(self.opt)},
                training.state_numpy(net))


class _FlatSharded(_Replicated):
    """ZeRO stage 1 ("zero1"), 2 ("zero2") and 2 with the shard's state in host memory
    ("zero2_offload"): each rank updates its flat shard (``FlatShards``)."""

    def __init__(self, net, g, lr: float, stage: int, offload: bool = False):
        self.net, self.g, self.stage = net, g, stage
        self.shards = FlatShards(net, g, lr, host=offload)
        if stage == 2:                            # reduce each layer as it is done
            self.shards.reduce_during_backward()

    def after_backward(self) -> None:
        if self.stage == 1:
            for u in range(len(self.shards.units)):
                self.shards.reduce_scatter(u, free=False)
            for p in self.net.parameters():       # stage 1 keeps the full gradient buffers
                p.grad.zero_()

    def update(self) -> None:
        self.shards.step()

    def kept(self) -> tuple[dict, dict]:
        return self.shards.held(self.net), training.state_numpy(self.net)


class _LayerSharded(_Replicated):
    """ZeRO stage 3 ("zero3"): parameters sharded too, each layer gathered when used."""

    def __init__(self, net, g, lr: float):
        super().__init__(shard_model(net, g), g, lr)

    def after_backward(self) -> None:
        pass                                      # the layers reduce-scatter as they go

    def kept(self) -> tuple[dict, dict]:
        net, state = self.net, {}
        for i, m in enumerate(net):
            if isinstance(m, ShardedLinear):
                state.update(m.whole(str(i)))
        return ({"parameters": training.tensor_bytes(net.parameters()),
                 "gradients": training.tensor_bytes(p.grad for p in net.parameters()),
                 "optimizer state": training.optimizer_state_bytes(self.opt),
                 "one gathered layer": max(m.gathered_bytes for m in net
                                           if isinstance(m, ShardedLinear))}, state)


class _Fsdp2(_Replicated):
    """PyTorch's FSDP2 (``fully_shard``), the library's stage 3."""

    def __init__(self, net, g, lr: float):
        super().__init__(_fsdp2(net, g), g, lr)

    def after_backward(self) -> None:
        pass                                      # the library reduce-scatters itself

    def kept(self) -> tuple[dict, dict]:
        net, opt = self.net, self.opt
        return ({"parameters": training.tensor_bytes(_local(p) for p in net.parameters()),
                 "gradients": training.tensor_bytes(_local(p.grad) for p in net.parameters()
                                                    if p.grad is not None),
                 "optimizer state": training.tensor_bytes(
                     _local(v) for s in opt.state.values() for v in s.values()
                     if isinstance(v, torch.Tensor) and v.numel() > 1)},
                {n: training.to_numpy(p.full_tensor()) for n, p in net.named_parameters()})


def _variant(name: str, net, g, lr: float) -> _Replicated:
    """The object that trains ``net`` as variant ``name`` does."""
    if name == "ddp":
        return _Replicated(net, g, lr)
    if name in ("zero1", "zero2", "zero2_offload"):
        return _FlatSharded(net, g, lr, stage=1 if name == "zero1" else 2,
                            offload=name == "zero2_offload")
    return (_LayerSharded if name == "zero3" else _Fsdp2)(net, g, lr)


def train_zero(rank: int, world_size: int, variants=VARIANTS, sizes=SIZES,
               global_batch: int = 64, steps: int = 5, lr: float = 1e-3, seed: int = 0,
               *, group=None) -> dict:
    """Rank function: train the MLP with Adam once per variant, one after the other.

    variants: "ddp" (plain data parallel by hand: lab 05's ``average_gradients``),
    "zero1", "zero2", "zero3", "zero2_offload", "fsdp2". Every rank takes its rows of
    each global batch. A zero-length span "<variant> begins" marks where each starts on
    the timeline (``variant_windows``). Returns, per variant: the whole parameters after
    ``steps`` steps, the losses, and ``held``: the bytes of the parameters, gradients and
    optimizer state this rank keeps after a step, measured on those tensors; and
    ``seconds``: each variant's wall time on this rank.
    """
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"variants must be among {VARIANTS}, got {unknown}")
    g, device = as_group(group), runtime.rank_device()
    rows = g.rows(global_batch, "global batch")
    out = {"seconds": {}}
    for name in variants:
        comm.barrier(group=g, name="between variants")
        started = time.perf_counter()
        recorder().add(f"{name} begins", COMPUTE, started, started)
        # FSDP2 talks to the backend itself, past the traced layer's host staging: on ranks
        # sharing a GPU it runs on the CPU (see runtime.library_device)
        here = runtime.library_device() if name == "fsdp2" else device
        net = training.build_model("mlp", sizes=sizes, seed=seed).to(here)
        params = sum(p.numel() for p in net.parameters())
        variant = _variant(name, net, g, lr)
        del net                                   # zero3 and fsdp2 keep only their shards
        batches = training.digit_batches("mlp", global_batch)
        losses = []
        for _ in range(steps):
            x, y = training.on_device(*next(batches), here, rows)
            with span("forward"):
                loss = nn.functional.cross_entropy(variant.net(x), y)
            with span("backward"):
                loss.backward()
            variant.after_backward()
            variant.update()
            losses.append(loss.item())
        runtime.synchronize()
        held, state = variant.kept()
        out[name] = {"state": state, "losses": losses, "held": held, "params": params}
        out["seconds"][name] = time.perf_counter() - started
        del variant, loss
        gc.collect()
    comm.barrier(group=g, name="between variants")
    return out


def train_reference(sizes=SIZES, global_batch: int = 64, steps: int = 5, lr: float = 1e-3,
                    seed: int = 0) -> dict:
    """One device, the whole global batch, Adam: what every variant must equal."""
    return data_parallel.train_single("mlp", global_batch, steps, lr, seed, "adam", sizes)


# ------------------------------------------------------------------ reading the timeline
def variant_windows(timeline, variants=VARIANTS, rank: int = 0) -> dict:
    """(start, end) on the timeline of each variant of a ``train_zero`` run."""
    starts = {s.name[:-len(" begins")]: s.start for s in timeline.spans
              if s.rank == rank and s.name.endswith(" begins")}
    order = sorted(starts, key=starts.get)
    ends = [starts[v] for v in order[1:]] + [timeline.end]
    return {v: (starts[v], e) for v, e in zip(order, ends) if v in variants}


def bytes_per_step(timeline, window, rank: int, world_size: int, steps: int) -> dict:
    """Traced bytes per step on ``rank`` inside ``window``, and the bytes it sent (ring).

    Returns {"traced": what ``Timeline.comm_bytes`` counts, "sent": the bytes the ring
    algorithms send for those operations (``parlab.zero.sent_bytes``), "by op": sent, per
    collective}. Barriers and the final gathers for the results are left out.
    """
    part = timeline.window(*window).filter(ranks=[rank])
    by_op, traced = {}, 0
    for s in part.spans:
        op = zero_plan.op_of(s.name)
        if s.kind != "comm" or op is None or s.name == "gather for the result":
            continue
        traced += s.bytes
        by_op[op] = by_op.get(op, 0.0) + zero_plan.sent_bytes(op, s.bytes, world_size)
    return {"traced": traced / steps, "sent": sum(by_op.values()) / steps,
            "by op": {k: v / steps for k, v in by_op.items()}}


# ------------------------------------------------------------------ measured against the formulas
STAGE_OF = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "zero2_offload": 2, "fsdp2": 3}
LABELS = {"ddp": "plain DP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
          "zero2_offload": "ZeRO-2 + offload", "fsdp2": "FSDP2"}


def expected_held(variant: str, params: int, world_size: int) -> dict:
    """What ``parlab.zero`` says a rank of ``variant`` keeps (float32 Adam), by part.

    With offload the device keeps only the parameters; the host keeps the shard's
    gradient, a float32 copy of its parameters and Adam's moments: (4 + 4 + 8)Ψ/N.
    """
    want = zero_plan.per_device_bytes(params, world_size, STAGE_OF[variant])
    want.pop("total")
    if variant == "zero2_offload":
        want["gradients"] = want["optimizer state"] = 0.0
        want["on the host"] = 16 * params / world_size
    return want


def summary(results: list[dict], timeline, steps: int, variants=VARIANTS) -> list[dict]:
    """One row per variant: the bytes rank 0 keeps (measured and formula, by part), the
    bytes it sends per step (measured from the timeline, and formula), and its seconds
    per step in transfers and in waits (the last barrier included: a few ms)."""
    n = len(results)
    windows = variant_windows(timeline, variants)
    rows = []
    for v in variants:
        res = results[0][v]
        held = {k: b for k, b in res["held"].items() if k != "one gathered layer"}
        moved = bytes_per_step(timeline, windows[v], 0, n, steps)
        seconds = timeline.window(*windows[v]).seconds_by_kind(0)
        rows.append({"variant": v, "label": LABELS[v], "stage": STAGE_OF[v], "held": held,
                     "expected": expected_held(v, res["params"], n),
                     "gathered_layer": res["held"].get("one gathered layer", 0),
                     "sent": moved["sent"], "traced": moved["traced"], "by op": moved["by op"],
                     "expected_sent": zero_plan.comm_bytes_per_step(res["params"], n,
                                                                      STAGE_OF[v]),
                     "transfer_s": seconds["comm"] / steps, "wait_s": seconds["wait"] / steps})
    return rows
