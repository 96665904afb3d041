"""Serving the trained U-Net: save it to a file, load it in another process, segment.

A server loads the weights once, when it starts, then answers each request with a
forward pass: no optimizer, no gradients, one image or a few at a time. The file holds
the U-Net's settings beside its weights, so the process that loads it needs nothing
else (``torch.load(..., weights_only=True)``: plain tensors and numbers, no pickled code).

Run as a program it is that other process::

    python -m parlab.torch.serve MODEL.pt IMAGES.npy MASKS.npy

reads images (n, 1, size, size), writes their masks (n, size, size) and prints how long
loading and segmenting took.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

from .models import UNet


def save(model: UNet, path, *, base: int, size: int) -> str:
    """Write the U-Net's weights and settings to ``path``; return the path."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save({"base": base, "size": size, "state": state}, path)
    return str(path)


def load(path, device="cpu") -> UNet:
    """The U-Net saved at ``path``, ready to segment (evaluation mode)."""
    saved = torch.load(path, map_location=device, weights_only=True)
    model = UNet(saved["base"])
    model.load_state_dict(saved["state"])
    return model.to(device).eval()


def segment(model: UNet, images: np.ndarray, device="cpu") -> np.ndarray:
    """The class of every pixel (0 background, 1 disc, 2 square) for (n, 1, h, w) images."""
    with torch.no_grad():
        logits = model(torch.as_tensor(np.asarray(images, dtype=np.float32), device=device))
    return logits.argmax(1).cpu().numpy()


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m parlab.torch.serve MODEL.pt IMAGES.npy MASKS.npy", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model = load(args[0])
    t1 = time.perf_counter()
    masks = segment(model, np.load(args[1]))
    t2 = time.perf_counter()
    np.save(args[2], masks)
    print(f"process {os.getpid()}: loaded {args[0]} in {(t1 - t0) * 1e3:.0f} ms, "
          f"segmented {len(masks)} image{'s' * (len(masks) != 1)} in {(t2 - t1) * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
