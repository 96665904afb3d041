"""The course's PyTorch models, each with laptop-sized defaults and a size knob.

Models that labs split by layers are ``nn.Sequential``, so that ``model[i:j]`` is a
segment and the split points are plain indices.
"""
from __future__ import annotations

import torch
from torch import nn


def mlp(sizes=(64, 256, 256, 128, 10)) -> nn.Sequential:
    """Linear layers of the given widths with ReLU between; ``sizes[0]`` inputs."""
    if len(sizes) < 2:
        raise ValueError("an MLP needs at least an input and an output size")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def cnn(width: int = 16, classes: int = 10) -> nn.Sequential:
    """A small CNN for 1x8x8 digits; ``width`` scales every layer's channels."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * width * 2 * 2, classes),
    )


def conv_stack(width: int = 32, depth: int = 4, classes: int = 10) -> nn.Sequential:
    """Full-resolution convolutions, then one linear classifier: a model with uneven layers.

    A 3x3 convolution on 8x8 images does 64 multiply-adds per weight and per sample, the
    classifier only one, yet the classifier holds the most weights. Splitting this model
    by parameter count puts nearly all the work on one device (lab 02).
    """
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Conv2d(1 if i == 0 else width, width, 3, padding=1), nn.ReLU()]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(width * 64, classes))


class LastStep(nn.Module):
    """Keep the last time step of an LSTM's output: (batch, time, h) -> (batch, h)."""

    def forward(self, x):
        return x[:, -1]


class LSTMLayer(nn.Module):
    """One LSTM layer that returns only its output sequence, so layers chain."""

    def __init__(self, inputs: int, hidden: int):
        super().__init__()
        self.lstm = nn.LSTM(inputs, hidden, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


def deep_lstm(layers: int = 4, hidden: int = 64, inputs: int = 1, classes: int = 4) -> nn.Sequential:
    """A stack of ``layers`` single-layer LSTMs and a linear head (separate layers, so
    each can live on its own device)."""
    stack = [LSTMLayer(inputs if i == 0 else hidden, hidden) for i in range(layers)]
    return nn.Sequential(*stack, LastStep(), nn.Linear(hidden, classes))


def _block(a: int, b: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(b, b, 3, padding=1), nn.ReLU())


class UNet(nn.Module):
    """A two-level U-Net (Ronneberger et al., 2015): encoder, bottleneck, decoder with
    skip connections; ``base`` channels at the top level.

    The forward pass is a chain of blocks, each making one named tensor from earlier
    ones (``BLOCKS``: output, inputs, the submodules it uses). The decoder's blocks read
    the encoder's outputs again (the skip connections e1 and e2), so a cut between two
    blocks is crossed by every tensor made before it and read after it
    (``parlab.split.crossing``), not by one activation as in a layer stack.
    """

    BLOCKS = (("e1", ("x",), ("enc1",)),
              ("e2", ("e1",), ("enc2",)),
              ("b", ("e2",), ("bottom",)),
              ("d2", ("b", "e2"), ("up2", "dec2")),
              ("d1", ("d2", "e1"), ("up1", "dec1")),
              ("logits", ("d1",), ("head",)))

    def __init__(self, base: int = 8, inputs: int = 1, classes: int = 3):
        super().__init__()
        self.enc1, self.enc2 = _block(inputs, base), _block(base, 2 * base)
        self.bottom = _block(2 * base, 4 * base)
        self.up2 = nn.ConvTranspose2d(4 * base, 2 * base, 2, stride=2)
        self.dec2 = _block(4 * base, 2 * base)
        self.up1 = nn.ConvTranspose2d(2 * base, base, 2, stride=2)
        self.dec1 = _block(2 * base, base)
        self.head = nn.Conv2d(base, classes, 1)

    def forward(self, x):
        return run_blocks(self, 0, len(self.BLOCKS), {"x": x})["logits"]


def run_blocks(owner: nn.Module, first: int, last: int, tensors: dict) -> dict:
    """Run ``UNet.BLOCKS[first:last]`` with the submodules of ``owner`` (the whole U-Net,
    or a pipeline stage holding only its blocks' submodules) on the named ``tensors``;
    return them with every block's output added."""
    pool = nn.functional.max_pool2d
    for out, ins, _ in UNet.BLOCKS[first:last]:
        a = [tensors[name] for name in ins]
        if out == "e1":
            y = owner.enc1(a[0])
        elif out == "e2":
            y = owner.enc2(pool(a[0], 2))
        elif out == "b":
            y = owner.bottom(pool(a[0], 2))
        elif out == "d2":                  # upsample, then the skip e2 joins as channels
            y = owner.dec2(torch.cat([owner.up2(a[0]), a[1]], dim=1))
        elif out == "d1":
            y = owner.dec1(torch.cat([owner.up1(a[0]), a[1]], dim=1))
        else:
            y = owner.head(a[0])
        tensors[out] = y
    return tensors


def unet(base: int = 8) -> UNet:
    return UNet(base)
