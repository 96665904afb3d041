"""Lab 01's baseline: one model trained on one device, and what a step costs.

Everything later labs compare with comes from here: the step timeline (data, forward,
backward, update), throughput against batch size, and memory.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .. import data as datasets
from ..trace import Timeline, recording, span
from . import training
from .runtime import synchronize, timed_median


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, device="cpu") -> float:
    with torch.no_grad():
        pred = model(torch.as_tensor(x, device=device)).argmax(1).cpu().numpy()
    return float((pred == y).mean())


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, *, epochs: int = 5,
          batch_size: int = 64, lr: float = 1e-3, device="cpu", progress: bool = True,
          seed: int = 0, x_test=None, y_test=None, loss_fn=None) -> dict:
    """A plain training loop (Adam, cross-entropy or ``loss_fn``) with a progress bar.

    Returns the loss of every step and, if test data is given, the test accuracy after
    every epoch.
    """
    from .. import progress as bars

    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    history = {"loss": [], "test_accuracy": []}
    steps = epochs * (len(y) // batch_size)
    bar = bars.bar(steps, "training", progress)
    for epoch in range(epochs):
        model.train()
        for xb, yb in datasets.batches(x, y, batch_size, seed=seed + epoch):
            xb, yb = torch.as_tensor(xb, device=device), torch.as_tensor(yb, device=device)
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            history["loss"].append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if x_test is not None:
            model.eval()
            history["test_accuracy"].append(accuracy(model, x_test, y_test, device))
    bars.finish(bar, history["loss"][-1] if history["loss"] else None)
    return history


def step_timeline(model: nn.Module, x: np.ndarray, y: np.ndarray, *, batch_size: int = 64,
                  steps: int = 5, device="cpu", label: str = "cpu", loss_fn=None) -> Timeline:
    """Measure ``steps`` training steps, each split into data, forward, backward, update
    (Adam; cross-entropy or ``loss_fn``).

    On a GPU the spans are timed with CUDA events on the stream (``CudaEventTimer``): each
    marks when the GPU reached that point, so a span holds its kernels, not their launch,
    and the host goes on queueing the next phase as in an untimed loop. (A synchronize
    after each phase would time the same kernels, but stall the queue: measured on an
    H100, the loop ran at 0.88x an untimed one.)
    """
    from .runtime import CudaEventTimer
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    batches = datasets.batches(x, y, batch_size, seed=0)
    on_gpu = torch.device(device).type == "cuda"
    timer = CudaEventTimer(torch.device(device)) if on_gpu else None
    with recording(timer=timer) as rec:
        for _ in range(steps + 1):            # the first step warms up and is dropped
            if _ == 1:
                rec.clear()
            with span("data"):
                xb, yb = next(batches)
                xb, yb = torch.as_tensor(xb, device=device), torch.as_tensor(yb, device=device)
            with span("forward"):
                opt.zero_grad()
                loss = loss_fn(model(xb), yb)
            with span("backward"):
                loss.backward()
            with span("update"):
                opt.step()
        synchronize(device)
    return rec.timeline({0: f"rank 0 · {label}"})


def throughput(make_model, x: np.ndarray, y: np.ndarray, batch_sizes, *, steps: int = 10,
               device="cpu") -> list[dict]:
    """Training samples per second for each batch size (median of ``steps`` timed steps)."""
    loss_fn = nn.CrossEntropyLoss()
    out = []
    for bs in batch_sizes:
        if bs > len(y):
            raise ValueError(f"batch size {bs} is larger than the data ({len(y)} samples)")
        torch.manual_seed(0)
        model = make_model().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        xb = torch.as_tensor(x[:bs], device=device)
        yb = torch.as_tensor(y[:bs], device=device)

        def one_step():
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
        step = timed_median(one_step, steps, warmup=2, device=device)
        out.append({"batch_size": bs, "step_s": step, "samples_per_s": bs / step})
    return out


def train_reference(cfg) -> dict:
    """The single-device run that splits, pipelines and slices are compared with.

    cfg: a ``parlab.split.SplitConfig`` (model, batch size, steps, optimizer, seed).
    """
    model = training.model_from_config(cfg)
    opt = training.make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    loss_fn = nn.CrossEntropyLoss()
    out = {"losses": []}
    for step, (xb, yb) in zip(range(cfg.steps), training.digit_batches(cfg.model, cfg.batch_size)):
        opt.zero_grad()
        logits = model(torch.as_tensor(xb))
        loss = loss_fn(logits, torch.as_tensor(yb))
        loss.backward()
        if step == 0:
            out["first_logits"] = training.to_numpy(logits)
            out["first_grads"] = training.grads_numpy(model)
        opt.step()
        out["losses"].append(loss.item())
    out["state"] = training.state_numpy(model)
    return out
