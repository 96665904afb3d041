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


# ------------------------------------------------------------------ models with skip connections
def crossing(blocks, cut: int) -> list[str]:
    """The tensors that cross a cut before block ``cut`` of a chain of blocks.

    blocks: (output, inputs, ...) per block, in the order they run (``UNet.BLOCKS``);
    the first block's inputs are the model's input. A tensor crosses when it is made
    before the cut and read at or after it: in a layer stack only the last activation,
    in a U-Net also every skip connection whose decoder block lies beyond the cut.
    In the order they were made.
    """
    if not 0 < cut < len(blocks):
        raise ValueError(f"a cut lies between two blocks: 1 .. {len(blocks) - 1} for "
                         f"{len(blocks)} blocks, got {cut}")
    made = [*blocks[0][1], *(b[0] for b in blocks[:cut])]
    read = {name for b in blocks[cut:] for name in b[1]}
    return [name for name in made if name in read]


@dataclass(frozen=True)
class UNetConfig:
    """One U-Net training run on the course's shapes (lab 10): the model, its data, its
    step, and where a pipeline cuts it (the same settings on one device and on many)."""

    base: int = 8                    # channels at the top level (see models.unet)
    size: int = 32                   # image side in pixels (a multiple of 4: two poolings)
    images: int = 192                # training images (parlab.data.shapes, seed 0)
    global_batch: int = 16
    steps: int = 8
    lr: float = 3e-3
    optimizer: str = "adam"          # "adam" or "sgd"
    seed: int = 0
    micro_batches: int = 4           # per replica, in a pipeline
    cuts: tuple = (3,)               # block indices where pipeline stages meet (3: encoder | decoder)
    schedule: str = "1f1b"

    def __post_init__(self):
        for name in ("base", "size", "images", "global_batch", "steps", "micro_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"UNetConfig: {name} must be a whole number >= 1, got {value!r}")
        if self.size % 4:
            raise ValueError(f"UNetConfig: the U-Net pools twice, so size must be a multiple "
                             f"of 4, got {self.size}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"UNetConfig: optimizer must be 'adam' or 'sgd', got "
                             f"{self.optimizer!r}")
        if list(self.cuts) != sorted(set(self.cuts)) or not all(0 < c < 6 for c in self.cuts):
            raise ValueError(f"UNetConfig: cuts must rise strictly inside 1 .. 5 (the U-Net "
                             f"has 6 blocks), got {self.cuts!r}")

    @property
    def stages(self) -> int:
        return len(self.cuts) + 1
