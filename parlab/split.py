"""Choosing where to cut a model into stages: framework-free (no torch, no tensorflow).
The ranks' side of the same cuts: ``parlab.torch.split`` and ``parlab.tf.split`` (lab 02).

A split of L layers over n devices is a list of n-1 rising split points; stage k holds
layers ``bounds[k-1]:bounds[k]``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def share(total: int, parts: int, over: str, what: str = "global batch") -> int:
    """``total // parts``: each part's equal share, or a ValueError that says the ``what``
    does not split ``over`` its parts (e.g. "dp=3 replicas") and what to use instead."""
    if total % parts:
        raise ValueError(f"a {what} of {total} does not split over {over}: use a multiple "
                         f"of {parts} (e.g. {parts * max(total // parts, 1)})")
    return total // parts


def check_bounds(bounds, n_layers: int, n_devices: int) -> list[int]:
    """Validate split points; every stage must get at least one layer."""
    bounds = [int(b) for b in bounds]
    if len(bounds) != n_devices - 1:
        raise ValueError(f"{n_devices} devices need {n_devices - 1} split points, got "
                         f"{len(bounds)}: {bounds}")
    edges = [0, *bounds, n_layers]
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"split points {bounds} must rise strictly inside 1..{n_layers - 1} "
                         f"so that each of the {n_devices} stages gets a layer; this model has "
                         f"{n_layers} layers")
    return bounds


def stage_costs(costs, bounds) -> list[float]:
    edges = [0, *bounds, len(costs)]
    return [float(sum(costs[a:b])) for a, b in zip(edges, edges[1:])]


def imbalance(costs, bounds) -> float:
    """Busiest stage over the mean stage: 1.0 is perfectly balanced."""
    stages = stage_costs(costs, bounds)
    return max(stages) / (sum(stages) / len(stages))


def balance(costs, n_devices: int) -> list[int]:
    """Split points that minimise the busiest stage's cost (contiguous stages).

    The classic linear-partition dynamic programme: best[k][i] is the smallest possible
    maximum stage cost when the first i layers form k stages.
    """
    costs = [float(c) for c in costs]
    n = len(costs)
    if not 1 <= n_devices <= n:
        raise ValueError(f"cannot split {n} layers over {n_devices} devices: use between "
                         f"1 and {n} devices")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(n_devices + 1)]
    cut = [[0] * (n + 1) for _ in range(n_devices + 1)]
    best[0][0] = 0.0
    for k in range(1, n_devices + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                c = max(best[k - 1][j], prefix[i] - prefix[j])
                if c < best[k][i]:
                    best[k][i], cut[k][i] = c, j
    bounds, i = [], n
    for k in range(n_devices, 1, -1):
        i = cut[k][i]
        bounds.append(i)
    return sorted(bounds)


@dataclass
class SplitConfig:
    """One manual-split training run (the same settings for PyTorch and TensorFlow)."""

    model: str = "mlp"                       # "mlp" (`sizes`), "cnn" or "conv_stack" (`width`)
    sizes: tuple = (64, 256, 256, 128, 10)  # MLP widths (see models.mlp)
    width: int = 16                          # channels of the convolutional models
    bounds: list = field(default_factory=list)  # split points into the layers; [] = one device
    batch_size: int = 64
    steps: int = 20
    lr: float = 0.05
    optimizer: str = "sgd"                   # "sgd" or "adam"
    seed: int = 0

    def __post_init__(self):
        if self.model not in ("mlp", "cnn", "conv_stack"):
            raise ValueError(f"model must be 'mlp', 'cnn' or 'conv_stack', got {self.model!r}")
        if self.batch_size < 1 or self.steps < 1:
            raise ValueError("batch_size and steps must be at least 1")
