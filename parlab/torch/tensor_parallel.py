"""Lab 03: vertical slicing (tensor parallelism): each layer's units split across ranks.

A linear layer y = x W^T + b with W of shape (out, in) can be cut two ways:

* **column-parallel** (by output units): rank k holds rows k of W, i.e. out/n units, and
  computes its slice of y from the whole x. For the seeds' 10-unit layer on 2 devices:
  5 + 5 units.
* **row-parallel** (by input units): rank k holds columns k of W and the matching slice
  of x; each rank's product is a *partial sum* of y, and an all-reduce adds them.

Naive slicing makes every layer column-parallel and gathers the full activation after
each one (every next layer needs all of its inputs). Megatron-LM (Shoeybi et al., 2019,
section 3) pairs a column-parallel layer with a row-parallel one: the column layer's
output slice is exactly the row layer's input slice, so the pair needs a single
all-reduce in the forward pass (operator g) and one in the backward pass (operator f).

All communication goes through ``parlab.torch.comm``, in the backward pass too, so the
timeline shows every exchange.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..trace import span
from . import comm, models


def _split_size(n: int, world_size: int, what: str) -> int:
    if n % world_size:
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        raise ValueError(f"{what} has {n} units, which do not split evenly over {world_size} "
                         f"devices: use a device count in {divisors} or a width divisible by "
                         f"{world_size}")
    return n // world_size


# ------------------------------------------------------------------ autograd operators
class _CopyToParallel(torch.autograd.Function):
    """f: identity forward; all-reduce of the input's gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad.contiguous())


class _ReduceFromParallel(torch.autograd.Function):
    """g: all-reduce forward (add the partial sums); identity backward."""

    @staticmethod
    def forward(ctx, x):
        return comm.all_reduce(x.contiguous())

    @staticmethod
    def backward(ctx, grad):
        return grad


class _GatherFromParallel(torch.autograd.Function):
    """All-gather slices along the last dim forward; keep this rank's slice backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.rank, ctx.width = dist.get_rank(), x.shape[-1]
        return torch.cat(comm.all_gather(x.contiguous()), dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width].contiguous()


def copy_to_parallel(x):
    return _CopyToParallel.apply(x)


def reduce_from_parallel(x):
    return _ReduceFromParallel.apply(x)


def gather_from_parallel(x):
    return _GatherFromParallel.apply(x)


# ------------------------------------------------------------------ layers
class ColumnParallelLinear(nn.Module):
    """This rank's out/n output units of ``full``; optionally gather the full output."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int, gather_output: bool = False):
        super().__init__()
        part = _split_size(full.out_features, world_size, "the layer's output")
        rows = slice(rank * part, (rank + 1) * part)
        self.weight = nn.Parameter(full.weight.detach()[rows].clone())
        self.bias = nn.Parameter(full.bias.detach()[rows].clone()) if full.bias is not None else None
        self.gather_output = gather_output

    def forward(self, x):
        y = F.linear(copy_to_parallel(x), self.weight, self.bias)
        return gather_from_parallel(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """This rank's in/n input units of ``full``; the partial outputs are all-reduced.

    The input must already be this rank's slice (the output of a column-parallel layer).
    The bias is added once, after the sum.
    """

    def __init__(self, full: nn.Linear, rank: int, world_size: int):
        super().__init__()
        part = _split_size(full.in_features, world_size, "the layer's input")
        cols = slice(rank * part, (rank + 1) * part)
        self.weight = nn.Parameter(full.weight.detach()[:, cols].clone())
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None

    def forward(self, x_slice):
        y = reduce_from_parallel(F.linear(x_slice, self.weight))
        return y + self.bias if self.bias is not None else y


def row_parallel_forward(x_slice, weight_slice, bias):
    """The row-parallel forward written out (the reference for exercise 3.1)."""
    partial = x_slice @ weight_slice.T       # this rank's share of every output unit
    comm.all_reduce(partial)                 # add the shares of all ranks
    return partial + bias                    # the bias once, not once per rank


# ------------------------------------------------------------------ sliced MLPs
SCHEMES = ("naive", "column_row")


def slice_mlp(model: nn.Sequential, rank: int, world_size: int, scheme: str) -> nn.Sequential:
    """The rank's part of an MLP from ``models.mlp`` (Linear, ReLU, ..., Linear).

    naive: every Linear column-parallel, full activation gathered after each.
    column_row: Linear layers paired column-then-row; an odd last Linear stays whole
    (replicated) on every rank.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    layers = list(model)
    linear_at = [i for i, m in enumerate(layers) if isinstance(m, nn.Linear)]
    out = []
    for i, m in enumerate(layers):
        if not isinstance(m, nn.Linear):
            out.append(m)
        elif scheme == "naive":
            out.append(ColumnParallelLinear(m, rank, world_size, gather_output=True))
        else:
            k = linear_at.index(i)
            if k % 2 == 0 and k + 1 < len(linear_at):
                out.append(ColumnParallelLinear(m, rank, world_size))
            elif k % 2 == 1:
                out.append(RowParallelLinear(m, rank, world_size))
            else:
                out.append(m)  # the unpaired last layer: every rank computes it whole
    return nn.Sequential(*out)


def expected_comm_bytes(sizes, batch_size: int, world_size: int, scheme: str) -> dict:
    """Bytes handed to collectives per rank per training step, from the formula.

    Counted as parlab.torch.comm records them (each rank's buffer). The input data needs
    no gradient, so the first layer's backward exchange never happens.
    """
    f32 = 4
    n_linear = len(sizes) - 1
    fwd = bwd = 0
    if scheme == "naive":
        for k in range(n_linear):
            fwd += batch_size * sizes[k + 1] // world_size * f32   # all-gather of the slice
            if k > 0:
                bwd += batch_size * sizes[k] * f32                 # all-reduce of dL/dx
    else:
        for k in range(0, n_linear - 1, 2):
            fwd += batch_size * sizes[k + 2] * f32                 # g: all-reduce of outputs
            if k > 0:
                bwd += batch_size * sizes[k] * f32                 # f: all-reduce of dL/dx
    return {"forward": fwd, "backward": bwd, "total": fwd + bwd}


# ------------------------------------------------------------------ workers
def train_sliced(rank: int, world_size: int, sizes=(64, 256, 256, 128, 10), scheme="column_row",
                 batch_size: int = 64, steps: int = 5, lr: float = 0.05, seed: int = 0) -> dict:
    """Worker: train the sliced MLP on the full batch (the same on every rank).

    Every rank builds the whole model from the same seed and keeps its slices. Returns the
    first step's logits and sliced gradients, the losses, and the final shards.
    """
    from .. import data as datasets
    torch.manual_seed(seed)
    dense = models.mlp(sizes)
    model = slice_mlp(dense, rank, world_size, scheme)
    del dense
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    x, y = datasets.digits("train")
    batches = datasets.endless_batches(x, y, batch_size)
    out = {"losses": []}
    for step in range(steps):
        xb, yb = next(batches)
        xb, yb = torch.as_tensor(xb), torch.as_tensor(yb)
        with span("forward"):
            opt.zero_grad()
            logits = model(xb)
            loss = loss_fn(logits, yb)
        with span("backward"):
            loss.backward()
        with span("update"):
            opt.step()
        if step == 0:
            out["first_logits"] = logits.detach().numpy().copy()
            out["first_grads"] = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        out["losses"].append(loss.item())
    out["shards"] = {n: p.detach().cpu().numpy().copy() for n, p in model.named_parameters()}
    return out


def dense_reference(sizes=(64, 256, 256, 128, 10), batch_size: int = 64, steps: int = 5,
                    lr: float = 0.05, seed: int = 0) -> dict:
    """The same training on one device, for the equivalence checks (lab 02's reference:
    the same seed, data order and plain SGD)."""
    from ..splitting import SplitConfig
    from .split import train_reference
    return train_reference(SplitConfig(sizes=tuple(sizes), batch_size=batch_size, steps=steps,
                                       lr=lr, optimizer="sgd", seed=seed))


def dense_slice(name: str, value, sliced_layer_kind: str, rank: int, world_size: int):
    """The part of a dense parameter that a rank's sliced layer holds."""
    if sliced_layer_kind == "column":
        n = value.shape[0] // world_size
        return value[rank * n:(rank + 1) * n]
    if sliced_layer_kind == "row" and name.endswith("weight"):
        n = value.shape[1] // world_size
        return value[:, rank * n:(rank + 1) * n]
    return value  # row bias and replicated layers: whole


def layer_kinds(sizes, world_size: int, scheme: str) -> dict[str, str]:
    """For each parameter name of the sliced MLP: 'column', 'row' or 'whole'."""
    model = slice_mlp(models.mlp(sizes), 0, world_size, scheme)
    kinds = {}
    for i, m in enumerate(model):
        kind = ("column" if isinstance(m, ColumnParallelLinear) else
                "row" if isinstance(m, RowParallelLinear) else "whole")
        for n, _ in m.named_parameters():
            kinds[f"{i}.{n}"] = kind
    return kinds


# ------------------------------------------------------------------ the library way
def library_sliced_step(rank: int, world_size: int, sizes=(64, 256, 256, 128, 10),
                        batch_size: int = 64, seed: int = 0) -> dict:
    """Worker: one training step with ``torch.distributed.tensor.parallel``.

    The same column-then-row pairing as ``slice_mlp(..., "column_row")``, declared as a
    plan instead of written by hand. DTensor does its own communication, so the step is
    timed as one span; its results are compared with the hand-written ones.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    from .. import data as datasets
    torch.manual_seed(seed)
    model = models.mlp(sizes)
    linear_at = [i for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    plan = {}
    for k in range(0, len(linear_at) - 1, 2):
        plan[str(linear_at[k])] = ColwiseParallel()
        plan[str(linear_at[k + 1])] = RowwiseParallel()
    mesh = init_device_mesh("cpu", (world_size,))  # the model and data here stay on the CPU
    model = parallelize_module(model, mesh, plan)
    x, y = datasets.digits("train")
    xb, yb = next(datasets.batches(x, y, batch_size, shuffle=False))
    with span("DTensor forward + backward"):
        logits = model(torch.as_tensor(xb))
        loss = nn.functional.cross_entropy(logits, torch.as_tensor(yb))
        loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad
        grads[name] = (g.to_local() if hasattr(g, "to_local") else g).detach().numpy().copy()
    out = {"logits": logits.detach().numpy().copy(), "grads": grads, "plan": sorted(plan)}
    del model, mesh, logits, loss  # let DTensor's objects go before the group is destroyed
    return out


# ------------------------------------------------------------------ grouped layers
class GroupedLinear(nn.Module):
    """A partially connected layer: ``groups`` independent blocks (block-diagonal W).

    Output unit j of group g sees only the inputs of group g, as in grouped
    convolutions (AlexNet's two GPUs, ResNeXt). Split by group, no rank ever needs
    another rank's activations.
    """

    def __init__(self, inputs: int, outputs: int, groups: int):
        super().__init__()
        gi = _split_size(inputs, groups, "the grouped layer's input")
        go = _split_size(outputs, groups, "the grouped layer's output")
        self.blocks = nn.ModuleList(nn.Linear(gi, go) for _ in range(groups))

    def forward(self, x):
        chunks = x.chunk(len(self.blocks), dim=-1)
        return torch.cat([b(c) for b, c in zip(self.blocks, chunks)], dim=-1)


def grouped_mlp(sizes=(64, 256, 256, 10), groups: int = 2) -> nn.Sequential:
    """Grouped hidden layers, then one dense classifier that mixes the groups."""
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-2], sizes[1:-1]):
        layers += [GroupedLinear(a, b, groups), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(sizes[-2], sizes[-1]))


def slice_grouped(model: nn.Sequential, rank: int, world_size: int) -> nn.Sequential:
    """Rank k keeps group k of every grouped layer; the classifier is row-parallel."""
    out: list[nn.Module] = []
    for m in model:
        if isinstance(m, GroupedLinear):
            if len(m.blocks) != world_size:
                raise ValueError(f"the model has {len(m.blocks)} groups: run it on "
                                 f"{len(m.blocks)} devices")
            out.append(m.blocks[rank])
        elif isinstance(m, nn.Linear):
            out.append(RowParallelLinear(m, rank, world_size))
        else:
            out.append(m)
    return nn.Sequential(*out)


def train_grouped(rank: int, world_size: int, sizes=(64, 256, 256, 10), steps: int = 5,
                  lr: float = 0.05, batch_size: int = 64, seed: int = 0) -> dict:
    """Worker (world_size > 0) or reference (rank=None): train the grouped MLP."""
    from .. import data as datasets
    torch.manual_seed(seed)
    dense = grouped_mlp(sizes, world_size)
    model = dense if rank is None else slice_grouped(dense, rank, world_size)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = datasets.digits("train")
    batches = datasets.endless_batches(x, y, batch_size)
    losses = []
    for _ in range(steps):
        xb, yb = next(batches)
        xb = torch.as_tensor(xb)
        if rank is not None:  # this rank's group of input features
            xb = xb.chunk(world_size, dim=-1)[rank]
        with span("forward"):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), torch.as_tensor(yb))
        with span("backward"):
            loss.backward()
        with span("update"):
            opt.step()
        losses.append(loss.item())
    return {"losses": losses}


# ------------------------------------------------------------------ width sweep
def width_sweep(rank: int, world_size: int, widths=(32, 128, 512, 1024), batch_size: int = 64,
                steps: int = 4) -> dict:
    """Worker: for each width, column-then-row training steps, and (rank 0) the dense step.

    Returns, per width, the time window of the sliced steps (to cut the timeline) and
    the dense step time measured on rank 0 alone while the others wait.
    """
    import time
    loss_fn = nn.CrossEntropyLoss()
    xb = torch.randn(batch_size, 64)
    yb = torch.randint(0, 10, (batch_size,))
    out = {}
    for w in widths:
        torch.manual_seed(0)
        dense = models.mlp((64, w, w, w, 10))
        sliced = slice_mlp(dense, rank, world_size, "column_row")
        opt = torch.optim.SGD(sliced.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            with span("forward"):
                loss = loss_fn(sliced(xb), yb)
            with span("backward"):
                loss.backward()
            with span("update"):
                opt.step()

        step()  # warm-up
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        t1 = time.perf_counter()
        comm.barrier()
        dense_step = None
        if rank == 0:  # the single-device reference, measured while the others wait
            dopt = torch.optim.SGD(dense.parameters(), lr=0.01)
            samples = []
            for i in range(steps + 1):
                s0 = time.perf_counter()
                dopt.zero_grad()
                loss_fn(dense(xb), yb).backward()
                dopt.step()
                if i:
                    samples.append(time.perf_counter() - s0)
            dense_step = sorted(samples)[len(samples) // 2]
        comm.barrier()
        out[w] = {"window": (t0, t1), "sliced_step": (t1 - t0) / steps, "dense_step": dense_step}
    return out


# ------------------------------------------------------------------ exercise 3.1
def _row_parallel_exercise(rank: int, world_size: int, fn) -> dict:
    torch.manual_seed(3)
    full = nn.Linear(12, 6)
    x = torch.randn(5, 12)
    part = 12 // world_size
    cols = slice(rank * part, (rank + 1) * part)
    with torch.no_grad():
        got = fn(x[:, cols].clone(), full.weight[:, cols].clone(), full.bias.clone())
        want = full(x)
    return {"got": None if got is None else torch.as_tensor(got).numpy(), "want": want.numpy(),
            "bias": full.bias.detach().numpy()}


def check_row_parallel(fn, world_size: int = 2):
    """Run the learner's row-parallel forward on real ranks and compare with a dense layer.

    Returns the function to use next: the learner's if right, else the reference.
    """
    import numpy as np

    from ..exercises import run_on_ranks
    results = run_on_ranks("row_parallel", _row_parallel_exercise, fn, world_size)
    if results is None:
        return row_parallel_forward
    for r, res in enumerate(results):
        if res["got"] is None or res["got"].shape != res["want"].shape:
            shape = None if res["got"] is None else res["got"].shape
            print(f"[row_parallel] rank {r} returned shape {shape}, expected {res['want'].shape}: "
                  "each rank must return the full output (every unit), not a slice.")
            return row_parallel_forward
        err = float(np.abs(res["got"] - res["want"]).max())
        if err > 1e-5:
            bias_counted_n_times = np.allclose(res["got"] - res["want"],
                                               (world_size - 1) * res["bias"], atol=1e-5)
            hint = (f"It looks like the bias was added on every rank before the all-reduce, so "
                    f"it is counted {world_size} times." if bias_counted_n_times else "")
            print(f"[row_parallel] rank {r} is off by up to {err:.3g} from the dense layer. "
                  "Each rank's product is a partial sum over its inputs: all ranks' partial sums "
                  f"must be added (all-reduce) before the bias is added once. {hint}\n"
                  "The lab goes on with the reference solution.")
            return row_parallel_forward
    print(f"[row_parallel] correct: on {world_size} ranks, every rank's output equals the dense layer's.")
    return fn
