"""Lab 02: consecutive layers on different devices (a manual model split).

Stage k holds modules ``bounds[k-1]:bounds[k]`` of an ``nn.Sequential``. On real GPUs one
process can place each segment with ``.to("cuda:k")`` (``PlacedSequential``). On simulated
devices each segment lives on its own rank, and activations (forward) and their gradients
(backward) travel between neighbouring ranks with traced send/recv (``train_split``).
Either way only one device works at a time: stage k needs stage k-1's output.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
from torch import nn

from .. import data as datasets
from ..splitting import SplitConfig, balance, check_bounds
from ..trace import span
from . import comm, memory, models, runtime

def param_costs(model: nn.Sequential) -> list[int]:
    return [sum(p.numel() for p in m.parameters()) for m in model]


def split_by_params(model: nn.Sequential, n_devices: int) -> list[int]:
    """The naive rule: give each device about the same number of parameters."""
    return balance(param_costs(model), n_devices)


def layer_times(model: nn.Sequential, x: torch.Tensor, repeats: int = 7) -> list[float]:
    """Measured forward + backward seconds of each layer on its real input (median)."""
    times = []
    with torch.no_grad():
        inputs = [x]
        for m in model:
            inputs.append(m(inputs[-1]))
    for m, a in zip(model, inputs):
        a = a.detach().requires_grad_(a.is_floating_point())
        samples = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            out = m(a)
            if out.requires_grad:
                out.backward(torch.ones_like(out))
            samples.append(time.perf_counter() - t0)
        times.append(float(np.median(samples[1:])))
    return times


def segments(model: nn.Sequential, bounds) -> list[nn.Sequential]:
    edges = [0, *check_bounds(bounds, len(model), len(bounds) + 1), len(model)]
    return [model[a:b] for a, b in zip(edges, edges[1:])]


class PlacedSequential(nn.Module):
    """Segments placed on devices in one process: the way to split on real GPUs.

    ``PlacedSequential(segments(model, [4]), ["cuda:0", "cuda:1"])``: each forward moves
    the activation to the next segment's device; autograd moves gradients back.
    """

    def __init__(self, parts, devices):
        super().__init__()
        if len(parts) != len(devices):
            raise ValueError(f"{len(parts)} segments but {len(devices)} devices")
        self.parts = nn.ModuleList(p.to(d) for p, d in zip(parts, devices))
        self.devices = [torch.device(d) for d in devices]

    def forward(self, x):
        for part, device in zip(self.parts, self.devices):
            x = part(x.to(device))
        return x


# ----------------------------------------------------------------------------- training
def build(cfg: SplitConfig) -> nn.Sequential:
    torch.manual_seed(cfg.seed)  # every rank builds the same model, then keeps its part
    if cfg.model == "mlp":
        return models.mlp(cfg.sizes)
    return models.cnn(cfg.width) if cfg.model == "cnn" else models.conv_stack(cfg.width)


def input_shape(cfg: SplitConfig) -> tuple:
    return (cfg.batch_size, cfg.sizes[0]) if cfg.model == "mlp" else (cfg.batch_size, 1, 8, 8)


def _optimizer(cfg, params):
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr)
    raise ValueError(f"optimizer must be 'sgd' or 'adam', got {cfg.optimizer!r}")


def _batches(cfg):
    x, y = datasets.digits("train", flat=cfg.model == "mlp")
    return datasets.endless_batches(x, y, cfg.batch_size)


def _state(module) -> dict:
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def train_reference(cfg: SplitConfig) -> dict:
    """The single-device run every split is compared with."""
    model = build(cfg)
    opt = _optimizer(cfg, model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    out = {"losses": []}
    for step, (xb, yb) in zip(range(cfg.steps), _batches(cfg)):
        opt.zero_grad()
        logits = model(torch.as_tensor(xb))
        loss = loss_fn(logits, torch.as_tensor(yb))
        loss.backward()
        if step == 0:
            out["first_logits"] = logits.detach().numpy().copy()
            out["first_grads"] = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        opt.step()
        out["losses"].append(loss.item())
    out["state"] = _state(model)
    return out


def train_split(rank: int, world_size: int, cfg: SplitConfig) -> dict:
    """Worker: stage ``rank`` of the split model, trained for ``cfg.steps`` steps.

    Forward: receive the activation from rank-1, run the segment, send to rank+1. The
    last rank computes the loss; backward runs in reverse, each rank sending the gradient
    of its input to rank-1. Each rank updates only its own parameters.
    """
    model = build(cfg)
    bounds = check_bounds(cfg.bounds, len(model), world_size)
    edges = [0, *bounds, len(model)]
    first, last = rank == 0, rank == world_size - 1
    device = runtime.rank_device()
    # Shapes at every boundary, from a dry run of the whole model (cheap, and every rank
    # can allocate its receive buffers without asking).
    with torch.no_grad():
        shapes, a = [], torch.zeros(input_shape(cfg))
        for m in model:
            shapes.append(tuple(a.shape))
            a = m(a)
    part = model[edges[rank]:edges[rank + 1]].to(device)
    del model
    params = list(part.parameters())
    opt = _optimizer(cfg, params) if params else None  # a stage may hold only a ReLU
    loss_fn = nn.CrossEntropyLoss()
    saved = memory.saved_tensor_counter(part)

    out = {"rank": rank, "losses": [], "layers": (edges[rank], edges[rank + 1])}
    for step, (xb, yb) in zip(range(cfg.steps), _batches(cfg)):
        if first:
            with span("data"):
                x_in = torch.as_tensor(xb, device=device)
        if not first:
            x_in = comm.recv(torch.empty(shapes[edges[rank]], device=device), src=rank - 1)
            x_in.requires_grad_(True)
        with span("forward"):
            if opt:
                opt.zero_grad()
            with saved if step == 0 else contextlib.nullcontext():
                y_out = part(x_in)
                if last:
                    loss = loss_fn(y_out, torch.as_tensor(yb, device=device))
        if not last:
            comm.send(y_out.detach(), dst=rank + 1)
            grad_out = comm.recv(torch.empty_like(y_out), src=rank + 1)
        with span("backward"):
            if last:
                loss.backward()
            else:
                y_out.backward(grad_out)
        if not first:
            comm.send(x_in.grad, dst=rank - 1)
        if step == 0:
            if last:
                out["first_logits"] = y_out.detach().cpu().numpy().copy()
            # a slice of nn.Sequential keeps the whole model's keys ("4.weight")
            out["first_grads"] = {n: p.grad.cpu().numpy().copy()
                                  for n, p in part.named_parameters()}
            out["memory"] = {
                "parameters": sum(p.numel() * p.element_size() for p in part.parameters()),
                "gradients": sum(p.grad.numel() * p.grad.element_size() for p in part.parameters()),
                "activations": saved.bytes}
        if opt:
            with span("update"):
                opt.step()
        if last:
            out["losses"].append(loss.item())
    out["state"] = _state(part)
    opt_state = [v for s in (opt.state.values() if opt else ()) for v in s.values()
                 if isinstance(v, torch.Tensor) and v.numel() > 1]
    out["memory"]["optimizer state"] = sum(t.numel() * t.element_size() for t in opt_state)
    return out


def merge(cfg: SplitConfig, results) -> nn.Sequential:
    """Put the trained segments back together into one model on the CPU."""
    model = build(cfg)
    state = {}
    for r in results:
        state.update({k: torch.as_tensor(v) for k, v in r["state"].items()})
    model.load_state_dict(state)
    return model
