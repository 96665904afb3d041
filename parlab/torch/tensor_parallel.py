"""Lab 03: vertical slicing (tensor parallelism): each layer's units split across ranks.

A linear layer y = x W^T + b with W of shape (out, in) can be cut two ways:

* **column-parallel** (by output units): rank k holds rows k of W, i.e. out/n units, and
  computes its slice of y from the whole x. For lab 03's 10-unit layer on 2 devices:
  5 + 5 units.
* **row-parallel** (by input units): rank k holds columns k of W and the matching slice
  of x; each rank's product is a *partial sum* of y, and an all-reduce adds them.

Naive slicing makes every layer column-parallel and gathers the full activation after
each one (every next layer needs all of its inputs). Megatron-LM (Shoeybi et al., 2019,
section 3) pairs a column-parallel layer with a row-parallel one: the column layer's
output slice is exactly the row layer's input slice, so the pair needs a single
all-reduce in the forward pass (operator g) and one in the backward pass (operator f).

All communication goes through ``parlab.torch.comm``, in the backward pass too, so the
timeline shows every exchange. Every layer and rank function takes ``group=``, the ranks
that share the layer (default: all), so tensor parallelism can run inside each line of a
device mesh while another strategy runs across lines.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..trace import span
from . import comm, models, runtime, training
from .groups import Group, as_group


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
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad.contiguous(), group=ctx.group), None


class _ReduceFromParallel(torch.autograd.Function):
    """g: all-reduce forward (add the partial sums); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return comm.all_reduce(x.contiguous(), group=group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromParallel(torch.autograd.Function):
    """All-gather slices along the last dim forward; keep this rank's slice backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.index, ctx.width = group.index, x.shape[-1]
        return torch.cat(comm.all_gather(x.contiguous(), group=group), dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.index * ctx.width:(ctx.index + 1) * ctx.width].contiguous(), None


def copy_to_parallel(x, group=None):
    return _CopyToParallel.apply(x, as_group(group))


def reduce_from_parallel(x, group=None):
    return _ReduceFromParallel.apply(x, as_group(group))


def gather_from_parallel(x, group=None):
    return _GatherFromParallel.apply(x, as_group(group))


def layout(world_size: int, index: int = 0) -> Group:
    """A group described without any process: position ``index`` of ``world_size``.

    For building sliced layers outside a launch (to list their shapes); running them
    needs a real group.
    """
    return Group(None, tuple(range(world_size)), index)


# ------------------------------------------------------------------ layers
class ColumnParallelLinear(nn.Module):
    """This rank's out/n output units of ``full``; optionally gather the full output.

    group: the ranks sharing the layer (default: all); this rank keeps slice ``index``.
    copy_input: apply f to the input here; False where several column layers read one
    input that already went through f once (a transformer's queries, keys and values:
    one all-reduce of the input's gradient rather than three).
    """

    def __init__(self, full: nn.Linear, group=None, *, gather_output: bool = False,
                 copy_input: bool = True):
        super().__init__()
        self.group = as_group(group)
        part = _split_size(full.out_features, self.group.size, "the layer's output")
        rows = slice(self.group.index * part, (self.group.index + 1) * part)
        self.weight = nn.Parameter(full.weight.detach()[rows].clone())
        self.bias = nn.Parameter(full.bias.detach()[rows].clone()) if full.bias is not None else None
        self.gather_output, self.copy_input = gather_output, copy_input

    def forward(self, x):
        y = F.linear(copy_to_parallel(x, self.group) if self.copy_input else x,
                     self.weight, self.bias)
        return gather_from_parallel(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """This rank's in/n input units of ``full``; the partial outputs are all-reduced.

    The input must already be this rank's slice (the output of a column-parallel layer).
    The bias is added once, after the sum.
    """

    def __init__(self, full: nn.Linear, group=None):
        super().__init__()
        self.group = as_group(group)
        part = _split_size(full.in_features, self.group.size, "the layer's input")
        cols = slice(self.group.index * part, (self.group.index + 1) * part)
        self.weight = nn.Parameter(full.weight.detach()[:, cols].clone())
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None

    def forward(self, x_slice):
        y = reduce_from_parallel(F.linear(x_slice, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


def row_parallel_forward(x_slice, weight_slice, bias, group=None):
    """The row-parallel forward written out (the reference for exercise 3.1)."""
    partial = x_slice @ weight_slice.T       # this rank's share of every output unit
    comm.all_reduce(partial, group=group)    # add the shares of all ranks
    return partial + bias                    # the bias once, not once per rank


# ------------------------------------------------------------------ sliced MLPs
SCHEMES = ("naive", "column_row")


def slice_mlp(model: nn.Sequential, scheme: str = "column_row", group=None) -> nn.Sequential:
    """This rank's part of an MLP from ``models.mlp`` (Linear, ReLU, ..., Linear).

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
            out.append(ColumnParallelLinear(m, group, gather_output=True))
        else:
            k = linear_at.index(i)
            if k % 2 == 0 and k + 1 < len(linear_at):
                out.append(ColumnParallelLinear(m, group))
            elif k % 2 == 1:
                out.append(RowParallelLinear(m, group))
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


# ------------------------------------------------------------------ rank functions
def train_sliced(rank: int, world_size: int, sizes=(64, 256, 256, 128, 10), scheme="column_row",
                 batch_size: int = 64, steps: int = 5, lr: float = 0.05, seed: int = 0,
                 *, group=None) -> dict:
    """Rank function: train the sliced MLP on the full batch (the same on every rank).

    Every rank of the group builds the whole model from the same seed and keeps its
    slices. Returns the first step's logits and sliced gradients, the losses, and the
    final shards.
    """
    g, device = as_group(group), runtime.rank_device()
    dense = training.build_model("mlp", sizes=sizes, seed=seed)
    model = slice_mlp(dense, scheme, g).to(device)
    del dense
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    batches = training.digit_batches("mlp", batch_size)
    out = {"losses": []}
    for step in range(steps):
        xb, yb = training.on_device(*next(batches), device)
        with span("forward"):
            opt.zero_grad()
            logits = model(xb)
            loss = loss_fn(logits, yb)
        with span("backward"):
            loss.backward()
        with span("update"):
            opt.step()
        if step == 0:
            out["first_logits"] = training.to_numpy(logits)
            out["first_grads"] = training.grads_numpy(model)
        out["losses"].append(loss.item())
    out["shards"] = {n: training.to_numpy(p) for n, p in model.named_parameters()}
    return out


def dense_reference(sizes=(64, 256, 256, 128, 10), batch_size: int = 64, steps: int = 5,
                    lr: float = 0.05, seed: int = 0) -> dict:
    """The same training on one device, for the equivalence checks (lab 01's reference
    loop: the same seed, data order and plain SGD)."""
    from ..split import SplitConfig
    from .single import train_reference
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


def dense_parts(state: dict, sizes, world_size: int, scheme: str, index: int) -> dict:
    """The slices of a dense model's parameters that position ``index`` of a sliced run
    holds: what its shards must equal."""
    kinds = layer_kinds(sizes, world_size, scheme)
    return {n: dense_slice(n, state[n], kind, index, world_size) for n, kind in kinds.items()}


def layer_kinds(sizes, world_size: int, scheme: str) -> dict[str, str]:
    """For each parameter name of the sliced MLP: 'column', 'row' or 'whole'."""
    model = slice_mlp(models.mlp(sizes), scheme, layout(world_size))
    kinds = {}
    for i, m in enumerate(model):
        kind = ("column" if isinstance(m, ColumnParallelLinear) else
                "row" if isinstance(m, RowParallelLinear) else "whole")
        for n, _ in m.named_parameters():
            kinds[f"{i}.{n}"] = kind
    return kinds


# ------------------------------------------------------------------ the library way
def tp_plan(model: nn.Sequential) -> dict:
    """DTensor's plan for ``model``: Linear layers paired Colwise-then-Rowwise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    linear_at = [i for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    plan = {}
    for k in range(0, len(linear_at) - 1, 2):
        plan[str(linear_at[k])] = ColwiseParallel()
        plan[str(linear_at[k + 1])] = RowwiseParallel()
    return plan


def device_mesh_of(group=None):
    """A 1-D ``DeviceMesh`` over the group's ranks, built from its process group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    g = as_group(group)
    return DeviceMesh.from_group(g.pg or dist.group.WORLD, runtime.library_device().type)


def library_sliced_step(rank: int, world_size: int, sizes=(64, 256, 256, 128, 10),
                        batch_size: int = 64, seed: int = 0, *, group=None) -> dict:
    """Rank function: one training step with ``torch.distributed.tensor.parallel``.

    The same column-then-row pairing as ``slice_mlp(..., "column_row")``, declared as a
    plan instead of written by hand. DTensor does its own communication, so the step is
    timed as one span; its results are compared with the hand-written ones.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    device = runtime.library_device()   # DTensor talks to the backend itself: see runtime
    model = training.build_model("mlp", sizes=sizes, seed=seed).to(device)
    plan = tp_plan(model)
    mesh = device_mesh_of(group)
    model = parallelize_module(model, mesh, plan)
    xb, yb = training.on_device(*next(training.digit_batches("mlp", batch_size)), device)
    with span("DTensor forward + backward"):
        logits = model(xb)
        loss = nn.functional.cross_entropy(logits, yb)
        loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        grad = p.grad
        grads[name] = training.to_numpy(grad.to_local() if hasattr(grad, "to_local") else grad)
    out = {"logits": training.to_numpy(logits), "grads": grads, "plan": sorted(plan)}
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


def slice_grouped(model: nn.Sequential, group=None) -> nn.Sequential:
    """Position k keeps group k of every grouped layer; the classifier is row-parallel."""
    g = as_group(group)
    out: list[nn.Module] = []
    for m in model:
        if isinstance(m, GroupedLinear):
            if len(m.blocks) != g.size:
                raise ValueError(f"the model has {len(m.blocks)} groups: run it on "
                                 f"{len(m.blocks)} devices")
            out.append(m.blocks[g.index])
        elif isinstance(m, nn.Linear):
            out.append(RowParallelLinear(m, g))
        else:
            out.append(m)
    return nn.Sequential(*out)


def train_grouped(rank: int | None, world_size: int, sizes=(64, 256, 256, 10), steps: int = 5,
                  lr: float = 0.05, batch_size: int = 64, seed: int = 0, *, group=None) -> dict:
    """Rank function, or with ``rank=None`` the one-device reference: train the grouped MLP.

    On ranks, the model has one group per rank of ``group``; the reference has
    ``world_size`` groups.
    """
    g = None if rank is None else as_group(group)
    device = torch.device("cpu") if g is None else runtime.rank_device()
    torch.manual_seed(seed)
    dense = grouped_mlp(sizes, world_size if g is None else g.size)
    model = (dense if g is None else slice_grouped(dense, g)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    batches = training.digit_batches("mlp", batch_size)
    losses = []
    for _ in range(steps):
        xb, yb = training.on_device(*next(batches), device)
        if g is not None:  # this rank's group of input features
            xb = xb.chunk(g.size, dim=-1)[g.index]
        with span("forward"):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
        with span("backward"):
            loss.backward()
        with span("update"):
            opt.step()
        losses.append(loss.item())
    return {"losses": losses}


# ------------------------------------------------------------------ width sweep
def sliced_span(width: int) -> str:
    """The span around ``width_sweep``'s timed sliced steps of one width."""
    return f"sliced steps, width {width}"


def dense_span(width: int) -> str:
    """The span of one of ``width_sweep``'s dense steps (one device) of one width."""
    return f"one device, width {width}"


def width_sweep(rank: int, world_size: int, widths=(32, 128, 512, 1024), batch_size: int = 64,
                steps: int = 4, *, group=None) -> dict:
    """Rank function: for each width, column-then-row training steps, and the dense step.

    Returns, per width, the time window of the sliced steps (to cut the timeline) and
    the dense step time measured on the group's first rank alone while the others wait.
    Both are traced too, so a replay finds them by name: the sliced steps inside a span
    ``sliced_span(w)``, each dense step as a span ``dense_span(w)`` on the first rank.
    """
    import time
    g, device = as_group(group), runtime.rank_device()
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(0)        # the same batch on every rank
    xb = torch.randn(batch_size, 64, generator=gen).to(device)
    yb = torch.randint(0, 10, (batch_size,), generator=gen).to(device)
    out = {}
    for w in widths:
        dense = training.build_model("mlp", sizes=(64, w, w, w, 10), seed=0).to(device)
        sliced = slice_mlp(dense, "column_row", g)
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
        comm.barrier(group=g)
        runtime.synchronize()
        t0 = time.perf_counter()
        with span(sliced_span(w)):
            for _ in range(steps):
                step()
            runtime.synchronize()
        t1 = time.perf_counter()
        comm.barrier(group=g)
        dense_step = None
        if g.first:  # the single-device reference, measured while the others wait
            dopt = torch.optim.SGD(dense.parameters(), lr=0.01)
            samples = []
            for i in range(steps + 1):
                runtime.synchronize()
                s0 = time.perf_counter()
                with span(dense_span(w)):
                    dopt.zero_grad()
                    loss_fn(dense(xb), yb).backward()
                    dopt.step()
                    runtime.synchronize()
                if i:
                    samples.append(time.perf_counter() - s0)
            dense_step = sorted(samples)[len(samples) // 2]
        comm.barrier(group=g)
        out[w] = {"window": (t0, t1), "sliced_step": (t1 - t0) / steps, "dense_step": dense_step}
    return out
