"""Lab 02: consecutive layers on different devices (a manual model split).

Stage k holds modules ``bounds[k-1]:bounds[k]`` of an ``nn.Sequential``. On real GPUs one
process can place each segment with ``.to("cuda:k")`` (``PlacedSequential``). On simulated
devices each segment lives on its own rank, and activations (forward) and their gradients
(backward) travel between neighbouring ranks with traced send/recv (``train_split``).
Either way only one device works at a time: stage k needs stage k-1's output.

``train_split`` runs on the ranks of ``group`` (default: all), stage i on the group's
i-th rank, so the same split can be one line of a larger mesh.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
from torch import nn

from ..split import SplitConfig, balance, check_bounds
from ..trace import span
from . import comm, memory, runtime, training
from .groups import as_group
from .single import train_reference  # noqa: F401 - lab 02 compares every split with it


def input_shape(cfg: SplitConfig) -> tuple:
    """Shape of one batch of ``cfg``'s data."""
    return training.input_shape(cfg.model, cfg.batch_size, cfg.sizes)


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
            if out.is_cuda:
                torch.cuda.synchronize(out.device)   # time the kernels, not their launch
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
    """The whole model of ``cfg``: every rank builds the same one, then keeps its part."""
    return training.model_from_config(cfg)


def train_split(rank: int, world_size: int, cfg: SplitConfig, *, group=None) -> dict:
    """Rank function: one stage of the split model, trained for ``cfg.steps`` steps.

    Stage i of the group's n ranks holds segment i. Forward: receive the activation from
    the previous stage, run the segment, send to the next. The last stage computes the
    loss; backward runs in reverse, each stage sending the gradient of its input back.
    Each stage updates only its own parameters.
    """
    g = as_group(group)
    model = build(cfg)
    bounds = check_bounds(cfg.bounds, len(model), g.size)
    edges = [0, *bounds, len(model)]
    stage = g.index
    device = runtime.rank_device()
    shapes = training.boundary_shapes(model, input_shape(cfg))
    part = model[edges[stage]:edges[stage + 1]].to(device)
    del model
    params = list(part.parameters())
    opt = training.make_optimizer(cfg.optimizer, params, cfg.lr) if params else None  # a stage may hold only a ReLU
    loss_fn = nn.CrossEntropyLoss()
    saved = memory.saved_tensor_counter(part)

    out = {"rank": rank, "stage": stage, "losses": [], "layers": (edges[stage], edges[stage + 1])}
    for step, (xb, yb) in zip(range(cfg.steps), training.digit_batches(cfg.model, cfg.batch_size)):
        if g.first:
            with span("data"):
                x_in = torch.as_tensor(xb).to(device)
        else:
            x_in = comm.recv(torch.empty(shapes[edges[stage]], device=device), src=g.prev,
                             group=g)
            x_in.requires_grad_(True)
        with span("forward"):
            if opt:
                opt.zero_grad()
            with saved if step == 0 else contextlib.nullcontext():
                y_out = part(x_in)
                if g.last:
                    loss = loss_fn(y_out, torch.as_tensor(yb).to(device))
        if not g.last:
            comm.send(y_out.detach(), dst=g.next, group=g)
            grad_out = comm.recv(torch.empty_like(y_out), src=g.next, group=g)
        with span("backward"):
            if g.last:
                loss.backward()
            else:
                y_out.backward(grad_out)
        if not g.first:
            comm.send(x_in.grad, dst=g.prev, group=g)
        if step == 0:
            if g.last:
                out["first_logits"] = training.to_numpy(y_out)
            # a slice of nn.Sequential keeps the whole model's keys ("4.weight")
            out["first_grads"] = training.grads_numpy(part)
            out["memory"] = {
                "parameters": training.tensor_bytes(part.parameters()),
                "gradients": training.tensor_bytes(p.grad for p in part.parameters()),
                "activations": saved.bytes}
        if opt:
            with span("update"):
                opt.step()
        if g.last:
            out["losses"].append(loss.item())
    out["state"] = training.state_numpy(part)
    out["memory"]["optimizer state"] = training.optimizer_state_bytes(opt)
    return out


def merge(cfg: SplitConfig, results) -> nn.Sequential:
    """Put the trained segments back together into one model on the CPU."""
    model = build(cfg)
    state = {}
    for r in results:
        state.update({k: torch.as_tensor(v) for k, v in r["state"].items()})
    model.load_state_dict(state)
    return model
