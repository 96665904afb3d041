"""The course's data: small, shipped or generated, never downloaded. Plain numpy.

* ``digits``: 1,797 handwritten digits, 8x8 pixels (UCI, shipped in ``data/``).
* ``waves``: noisy sine waves whose frequency class a recurrent network must tell apart.
* ``shapes``: images of discs and squares with per-pixel labels, for segmentation.

Every function is deterministic for a given seed, so every rank and every run sees the
same data.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np

DATA_DIR = Path(os.environ.get("PARLAB_DATA", Path(__file__).resolve().parent.parent / "data"))


@lru_cache(maxsize=1)
def _digits_raw():
    path = DATA_DIR / "digits.npz"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: parlab's data/ folder travels with the "
                                "repository (set PARLAB_DATA to point elsewhere).")
    with np.load(path) as f:
        return f["images"], f["labels"]


def digits(split: str = "train", *, flat: bool = True, test_fraction: float = 0.2):
    """Handwritten digits as float32 in [0, 1] and int64 labels 0-9.

    A fixed shuffle puts 80 % in ``train`` and 20 % in ``test``. ``flat`` gives 64
    features per image; otherwise images are (1, 8, 8), channels first.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    images, labels = _digits_raw()
    order = np.random.default_rng(1998).permutation(len(labels))
    cut = int(len(labels) * (1 - test_fraction))
    idx = order[:cut] if split == "train" else order[cut:]
    x = images[idx].astype(np.float32) / 16.0
    x = x.reshape(len(idx), 64) if flat else x.reshape(len(idx), 1, 8, 8)
    return x, labels[idx].astype(np.int64)


def waves(n: int = 1024, length: int = 32, classes: int = 4, *, seed: int = 0):
    """Sequences (n, length, 1) of noisy sines; the label is the frequency's class.

    The phase is random, so the class can only be told by following the sequence over
    time, which is what a recurrent network is for.
    """
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    freq = 0.05 + 0.05 * y                         # cycles per step, one per class
    phase = rng.uniform(0, 2 * np.pi, n)
    t = np.arange(length)
    x = np.sin(2 * np.pi * freq[:, None] * t[None, :] + phase[:, None])
    x += rng.normal(0, 0.3, x.shape)
    return x[..., None].astype(np.float32), y.astype(np.int64)


def shapes(n: int = 256, size: int = 32, *, seed: int = 0):
    """Images (n, 1, size, size) with a disc and a square on noise; masks (n, size, size).

    Mask classes: 0 background, 1 disc, 2 square. A small stand-in for an
    image-segmentation example.
    """
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    images = rng.normal(0, 0.2, (n, size, size)).astype(np.float32)
    masks = np.zeros((n, size, size), dtype=np.int64)
    for i in range(n):
        r = rng.integers(size // 8, size // 4)
        cy, cx = rng.integers(r, size - r, 2)
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
        s = rng.integers(size // 6, size // 3)
        sy, sx = rng.integers(0, size - s, 2)
        square = (yy >= sy) & (yy < sy + s) & (xx >= sx) & (xx < sx + s)
        masks[i][square] = 2
        masks[i][disc] = 1
        images[i][square] += 1.0
        images[i][disc] += 1.0
    return images[:, None], masks


def class_weights(masks, classes: int = 3) -> np.ndarray:
    """One weight per class, 1 / (classes x its share of the pixels): every class then
    weighs as much in a weighted loss as any other, and the weights of all pixels add up
    to their number. Without them, painting every pixel background (86 % of them in
    ``shapes``) is an easy, poor answer to learn first."""
    share = np.bincount(np.asarray(masks).ravel(), minlength=classes) / np.asarray(masks).size
    if (share == 0).any():
        raise ValueError(f"class {int(np.argmin(share))} has no pixel in these masks")
    return (1.0 / (classes * share)).astype(np.float32)


def batches(x, y, batch_size: int, *, seed: int = 0, shuffle: bool = True, drop_last: bool = True):
    """Yield (x, y) mini-batches as numpy arrays, in a seeded order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = np.random.default_rng(seed).permutation(len(y)) if shuffle else np.arange(len(y))
    stop = len(y) - batch_size + 1 if drop_last else len(y)
    for start in range(0, max(stop, 0), batch_size):
        idx = order[start:start + batch_size]
        yield x[idx], y[idx]


def endless_batches(x, y, batch_size: int):
    """Fixed-order mini-batches, epoch after epoch: every rank and every reference run
    sees the same sequence, for as many steps as asked."""
    while True:
        yield from batches(x, y, batch_size, shuffle=False)
