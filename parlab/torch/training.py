"""What every strategy needs around its training step, in one place.

Building a model by name with the same initial weights on every rank, its optimizer and
its batches; flat views of parameters and gradients (parameter servers, central storage,
ZeRO); state as numpy (results must outlive a rank, and a CUDA tensor cannot be compared
on the host); the shapes a pipeline stage hands on. Strategies import these instead of
borrowing each other's private helpers.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import data as datasets
from . import models

MODELS = ("mlp", "cnn", "conv_stack")


# ------------------------------------------------------------------ models and data
def build_model(name: str = "mlp", *, sizes=None, width: int | None = None,
                seed: int | None = None) -> nn.Sequential:
    """One of the course's models by name; with ``seed``, the same weights on every rank.

    sizes: the MLP's widths; width: channels of the convolutional models (default: each
    model's own).
    """
    if name not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {name!r}")
    if seed is not None:
        torch.manual_seed(seed)
    if name == "mlp":
        return models.mlp(tuple(sizes)) if sizes is not None else models.mlp()
    make = models.cnn if name == "cnn" else models.conv_stack
    return make(width) if width is not None else make()


def model_from_config(cfg) -> nn.Sequential:
    """The model of a ``parlab.split.SplitConfig`` (labs 02 and 04), seeded."""
    return build_model(cfg.model, sizes=cfg.sizes, width=cfg.width, seed=cfg.seed)


def input_shape(model: str, batch_size: int, sizes=None) -> tuple:
    """Shape of one batch of digits for ``model``: flat for the MLP, 1×8×8 images else."""
    if model == "mlp":
        return (batch_size, (sizes or (64,))[0])
    return (batch_size, 1, 8, 8)


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"optimizer must be 'sgd' or 'adam', got {name!r}")


def digit_batches(model: str, batch_size: int):
    """Endless fixed-order batches of the training digits, shaped for ``model``.

    Every rank and every single-device reference sees the same sequence of batches.
    """
    x, y = datasets.digits("train", flat=model == "mlp")
    return datasets.endless_batches(x, y, batch_size)


def on_device(xb, yb, device, rows: slice = slice(None)):
    """A numpy batch (or this rank's ``rows`` of it) as tensors on ``device``."""
    return (torch.as_tensor(xb[rows]).to(device), torch.as_tensor(yb[rows]).to(device))


# ------------------------------------------------------------------ flat views
def flat_parameters(model: nn.Module) -> torch.Tensor:
    """All parameters as one new 1-D tensor (a copy)."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def _params(model_or_params):
    if isinstance(model_or_params, nn.Module):
        return list(model_or_params.parameters())
    return list(model_or_params)


def flat_gradients(model) -> torch.Tensor:
    """All gradients as one new 1-D tensor, in parameter order (of a module, or of a
    list of parameters)."""
    return torch.cat([p.grad.reshape(-1) for p in _params(model)])


def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat vector into the model's parameters."""
    torch.nn.utils.vector_to_parameters(flat.to(next(model.parameters()).device),
                                        model.parameters())


def set_flat_gradients(model, flat: torch.Tensor) -> None:
    """Copy a flat vector into the gradients of a module (or of a list of parameters),
    after averaging it elsewhere."""
    offset = 0
    for p in _params(model):
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


def all_reduce_gradients(model, group=None, op: str = "sum",
                         name: str = "all_reduce (gradients)") -> None:
    """All-reduce the gradients of a module (or of a list of parameters) over the group's
    ranks, in place: one all-reduce of them all, flattened, as DDP's buckets do. "sum"
    for the weights every rank holds whole while it computes a share of their gradient
    (sequence and context parallelism's, what expert parallelism replicates); "avg" for
    data parallel's replicas. Every rank must pass the same parameters, each with a
    gradient."""
    from . import comm
    params = _params(model)
    missing = [i for i, p in enumerate(params) if p.grad is None]
    if missing:
        raise ValueError(f"all_reduce_gradients: parameters {missing} have no gradient on "
                         "this rank; every rank must add the same ones")
    if not params:
        return
    flat = flat_gradients(params)
    comm.all_reduce(flat, op=op, group=group, name=name)
    set_flat_gradients(params, flat)


# ------------------------------------------------------------------ results as numpy
def to_numpy(t: torch.Tensor):
    """A host copy of a tensor as numpy, whatever device it is on."""
    return t.detach().cpu().numpy().copy()


def state_numpy(module: nn.Module) -> dict:
    """The module's state dict as numpy arrays (comparable across ranks and runs)."""
    return {k: to_numpy(v) for k, v in module.state_dict().items()}


def grads_numpy(module: nn.Module) -> dict:
    """Every parameter's gradient as numpy, by parameter name."""
    return {n: to_numpy(p.grad) for n, p in module.named_parameters() if p.grad is not None}


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_state_bytes(opt: torch.optim.Optimizer | None) -> int:
    """Bytes of the optimizer's per-parameter tensors (Adam's moments; scalars left out)."""
    if opt is None:
        return 0
    return tensor_bytes(v for s in opt.state.values() for v in s.values()
                        if isinstance(v, torch.Tensor) and v.numel() > 1)


# ------------------------------------------------------------------ stages
def boundary_shapes(model: nn.Sequential, shape: tuple) -> list[tuple]:
    """The input shape of every layer for one batch of ``shape``, from a dry run.

    A stage that starts at layer k receives a tensor of ``shapes[k]``: every rank can
    allocate its receive buffers without asking its neighbour.
    """
    shapes, a = [], torch.zeros(shape)
    with torch.no_grad():
        for m in model:
            shapes.append(tuple(a.shape))
            a = m(a)
    return shapes
