"""Choosing where to cut a model into stages: framework-free (no torch, no tensorflow).
The ranks' side of the same cuts: ``parlab.torch.split`` and ``parlab.tf.split`` (lab 02).

A split of L layers over n devices is a list of n-1 rising split points; stage k holds
layers ``bounds[k-1]:bounds[k]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import whole_number


def share(total: int, parts: int, over: str, what: str = "global batch") -> int:
    """``total // parts``: each part's equal share, or a ValueError that says the ``what``
    does not split ``over`` its parts (e.g. "dp=3 replicas") and what to use instead."""
    if total % parts:
        raise ValueError(f"a {what} of {total} does not split over {over}: use a multiple "
                         f"of {parts} (e.g. {parts * max(total // parts, 1)})")
    return total // parts


def check_bounds(bounds, n_layers: int, n_devices: int) -> list[int]:
    """Validate split points; every stage must get at least one layer."""
    bounds = list(bounds)
    for b in bounds:      # int() would cut 1.5 to 1 unasked, and fail on NaN with no name
        if whole_number(b) is None and not (isinstance(b, float) and b.is_integer()):
            raise ValueError(f"bounds: split points are layer indices, whole numbers, got "
                             f"{b!r} in {bounds}")
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
    maximum stage cost when the first i layers form k stages, the last of them starting
    at the smallest j that reaches it. best[k - 1][j] rises with j and the last stage's
    cost falls, so that j is found by bisection, for every i at once (numpy): O(stages x
    layers x log layers), well under a second for thousands of layers (trying every j
    took 37-86 s for 8,000 layers in two stages), with the same cuts.
    """
    costs = [float(c) for c in costs]
    n = len(costs)
    if not 1 <= n_devices <= n:
        raise ValueError(f"cannot split {n} layers over {n_devices} devices: use between "
                         f"1 and {n} devices")
    for k, c in enumerate(costs):     # the bisection needs costs that only add up
        if not (math.isfinite(c) and c >= 0):
            raise ValueError(f"costs[{k}] must be a finite number 0 or more (a layer's "
                             f"cost), got {c!r}")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    span = n - n_devices + 1          # where stage k's last layer can end: k .. k + span - 1
    t = np.arange(span)
    prev = prefix[1:span + 1]         # one stage: the layers' sum
    cuts = [np.zeros(span, dtype=np.int64)]
    for k in range(2, n_devices + 1):
        ends = prefix[k + t]          # the layers before i = k + t, for each t
        # first j (from k - 1) where best[k - 1][j] >= the last stage's cost: bisection
        lo, hi = np.zeros(span, dtype=np.int64), t + 1
        while (lo < hi).any():
            mid = np.minimum((lo + hi) // 2, span - 1)
            right = prev[mid] >= ends - prefix[mid + k - 1]
            active = lo < hi
            hi = np.where(active & right, mid, hi)
            lo = np.where(active & ~right, mid + 1, lo)
        r = np.minimum(lo, t)                            # there: best[k - 1][j] decides
        f_right = np.maximum(prev[r], ends - prefix[r + k - 1])
        # just before: the last stage decides; the smallest j with the same cost starts
        # the run of free layers before it
        left = np.maximum(np.searchsorted(prefix, prefix[np.maximum(lo - 1, 0) + k - 1],
                                          side="left") - (k - 1), 0)
        f_left = np.maximum(prev[left], ends - prefix[left + k - 1])
        use_left = (lo >= 1) & ((lo > t) | (f_left <= f_right))
        prev = np.where(use_left, f_left, f_right)
        cuts.append(np.where(use_left, left, r) + k - 1)
    bounds, i = [], n
    for k in range(n_devices, 1, -1):
        i = int(cuts[k - 1][i - k])
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
    """One U-Net training run on the course's shapes (lab 15): the model, its data, its
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
