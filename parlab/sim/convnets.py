"""Convolutional networks as the cost model sees them: a U-Net and an AmoebaNet-like network.

Both are built from ``sim.layers``' convolution, pooling, up-convolution and concat
layers, with their skip connections recorded on the ``Network`` so that a pipeline cut
counts every tensor that crosses it (``Network.cut_bytes``).
"""
from __future__ import annotations

from ..errors import counted
from .layers import (Layer, concat, conv2d, linear, max_pool, optimizer_state, separable_conv,
                     up_conv)


def unet(cls, image: int = 128, in_channels: int = 3, classes: int = 3, base: int = 16,
         depth: int = 4, *, name=None, act_bytes: int = 4, optimizer: str = "adam"):
    """A U-Net (Ronneberger, Fischer & Brox, 2015, figure 1) with "same" padding.

    Level d = 0 .. depth - 1 of the encoder: two 3 x 3 convolutions (each with its ReLU)
    to base 2^d channels at image / 2^d pixels a side, then 2 x 2 max pooling; the
    bottleneck: two 3 x 3 convolutions to base 2^depth channels. The decoder climbs back:
    a 2 x 2 up-convolution halving the channels, a concat with the encoder's level-d
    output (the skip connection), two 3 x 3 convolutions; a final 1 x 1 convolution to
    ``classes`` (no ReLU). 7 depth + 3 layers; the skips run from each level's second
    encoder convolution to its decoder concat. (The paper's unpadded convolutions crop
    the skip; padded ones, common in Keras and PyTorch versions, keep sizes aligned.)
    """
    image, depth = counted(image, "image"), counted(depth, "depth", 0)
    base, in_channels = counted(base, "base"), counted(in_channels, "in_channels")
    classes = counted(classes, "classes")
    if image % 2 ** depth:
        raise ValueError(f"a U-Net of depth {depth} halves the image {depth} times: image="
                         f"{image} must be a multiple of {2 ** depth}")
    ab = act_bytes
    layers, skips, skip_from = [], [], {}

    def add(layer: Layer) -> int:
        layers.append(layer)
        return len(layers) - 1

    c_prev = in_channels
    for d in range(depth):
        s, c = image >> d, base << d
        add(conv2d(f"enc{d}.conv0", s, s, c_prev, c, act_bytes=ab))
        skip_from[d] = add(conv2d(f"enc{d}.conv1", s, s, c, c, act_bytes=ab))
        add(max_pool(f"enc{d}.pool", s, s, c, act_bytes=ab))
        c_prev = c
    s, c = image >> depth, base << depth
    add(conv2d("bottleneck.conv0", s, s, c_prev, c, act_bytes=ab))
    add(conv2d("bottleneck.conv1", s, s, c, c, act_bytes=ab))
    for d in reversed(range(depth)):
        s_low, c_low, s, c = image >> (d + 1), base << (d + 1), image >> d, base << d
        add(up_conv(f"dec{d}.up", s_low, s_low, c_low, c, act_bytes=ab))
        joined = add(concat(f"dec{d}.concat", c * s * s, c * s * s, act_bytes=ab))
        skips.append((skip_from[d], joined))
        add(conv2d(f"dec{d}.conv0", s, s, 2 * c, c, act_bytes=ab))
        add(conv2d(f"dec{d}.conv1", s, s, c, c, act_bytes=ab))
    add(conv2d("head", image, image, base, classes, k=1, relu=False, act_bytes=ab))
    return _network(cls, name or f"U-Net {image}px base {base} depth {depth}", layers,
                    in_channels * image * image, ab, optimizer, skips)


def amoebanet(cls, image: int = 224, cells: int = 18, filters: int = 208,
              classes: int = 1000, *, name=None, act_bytes: int = 4, optimizer: str = "adam"):
    """An AmoebaNet-like image classifier (Real et al., 2019; as GPipe trains it, Huang et
    al., 2019, section 3.1: L normal cells, filters D).

    A stem (3 x 3 convolution of stride 2 to D/4 channels, then two reduction cells), three
    stacks of ``cells`` / 3 normal cells at D, 2D and 4D filters with a reduction cell
    (stride 2) between them, global average pooling and a classifier. Every cell reads the
    outputs of the two cells before it (the skips a pipeline must carry across a cut).
    A cell here: two 1 x 1 convolutions that bring its two inputs to F filters, then five
    pairs of 3 x 3 separable convolutions of F filters (AmoebaNet's cells combine about
    five pairs of such operations), concatenated to 5F channels. The original cells mix
    pooling, 5 x 5 and 7 x 7 separable convolutions; this keeps their cost's shape (most
    work in the pointwise products, two inputs per cell), not their exact count.
    """
    image, cells, filters = counted(image, "image"), counted(cells, "cells"), counted(filters, "filters")
    if cells % 3:
        raise ValueError(f"cells={cells}: three stacks of equal depth need a multiple of 3")
    if image % 32:
        raise ValueError(f"image={image}: five halvings need a multiple of 32")
    ab = act_bytes
    layers, skips = [], []
    s = image // 2
    stem_c = max(filters // 4, 1)
    layers.append(conv2d("stem", image, image, 3, stem_c, stride=2, act_bytes=ab))
    shapes = [(stem_c, s), (stem_c, s)]              # (channels, side) of the last two outputs
    plan = [("reduce", filters // 4), ("reduce", filters // 2)]
    for stack in range(3):
        plan += [("normal", filters << stack)] * (cells // 3)
        if stack < 2:
            plan.append(("reduce", filters << (stack + 1)))
    for k, (kind, f) in enumerate(plan):
        (c2, s2), (c1, s1) = shapes[-2], shapes[-1]
        stride = 2 if kind == "reduce" else 1
        layers.append(_cell(f"{kind}{k}", c1, s1, c2, s2, f, stride, ab))
        i = len(layers) - 1
        if i >= 2:
            skips.append((i - 2, i))
        shapes.append((5 * f, s1 // stride))
    c, s = shapes[-1]
    layers.append(linear("classifier", c, classes, act_bytes=ab, relu=False))
    return _network(cls, name or f"AmoebaNet-like L={cells} D={filters} {image}px", layers,
                    3 * image * image, ab, optimizer, skips)


def _cell(name, c1, s1, c2, s2, f, stride, ab) -> Layer:
    """One cell from inputs (c1 channels, s1 a side) and (c2, s2): see ``amoebanet``."""
    so = s1 // stride
    parts = [conv2d(f"{name}.in1", s1, s1, c1, f, k=1, act_bytes=ab),
             conv2d(f"{name}.in2", s2, s2, c2, f, k=1, stride=s2 // s1 if s2 > s1 else 1,
                    act_bytes=ab)]
    for p in range(5):
        parts.append(separable_conv(f"{name}.sep{p}a", s1, s1, f, f, stride=stride, act_bytes=ab))
        parts.append(separable_conv(f"{name}.sep{p}b", so, so, f, f, act_bytes=ab))
    out = 5 * f * so * so
    gemms = tuple(g for p in parts for g in p.gemms)
    return Layer(name, sum(p.params for p in parts), sum(p.flops for p in parts),
                 out_elems=out, saved_elems=sum(p.saved_elems for p in parts),
                 elementwise_bytes=sum(p.elementwise_bytes for p in parts) + ab * 2.0 * out,
                 gemms=gemms)


def _network(cls, name, layers, in_elems, act_bytes, optimizer, skips):
    state, update = optimizer_state(optimizer, act_bytes)
    return cls(name, tuple(layers), in_elems, act_bytes, state, grad_wire_bytes=act_bytes,
               update_bytes=update, skips=tuple(skips))


def unet_stacked(cls, image: int = 192, in_channels: int = 3, classes: int = 1,
                 base: int = 64, depth: int = 5, convs: int = 5, *, name=None,
                 act_bytes: int = 4, optimizer: str = "sgd"):
    """The "simplified U-Net" of torchgpipe's benchmarks (kakaobrain/torchgpipe,
    benchmarks/models/unet), one layer per module of its flattened nn.Sequential (241 at
    depth 5 and 5 convolutions a cell), so that its published balances apply as they are.

    A cell is ``convs`` 3 x 3 convolutions (no bias), each followed by 2-d dropout,
    instance normalisation and a leaky ReLU (four modules). Encoder level d: a cell from
    the level's input to base 2^d channels, an identity that stashes the skip, 2 x 2 max
    pooling; the bottleneck: a cell through base 2^depth channels back to base
    2^(depth - 1); decoder level d (deepest first): nearest-neighbour upsampling by 2, the
    concat with level d's skip, a cell from base 2^(d + 1) channels through base 2^(d - 1);
    a final 1 x 1 convolution to ``classes``.
    """
    from .layers import Parts
    ab, layers, skips, stash = act_bytes, [], [], {}

    def add(p: Parts, label: str, out: float) -> int:
        layers.append(p.layer(label, out))
        return len(layers) - 1

    def cell(label: str, s: int, c_in: int, mid: int, c_out: int) -> None:
        widths = [c_in] + [mid] * (convs - 1) + [c_out]
        for k, (a, b) in enumerate(zip(widths, widths[1:])):
            out = b * s * s
            p = Parts(ab)
            p.conv(s, s, a, b, 3)
            add(p, f"{label}.conv{k}", out)
            p = Parts(ab)
            p.copy(out)                                    # dropout: read, write (and a mask)
            p.saved += out / ab                            # its 1-byte mask
            add(p, f"{label}.dropout{k}", out)
            p = Parts(ab)
            p.norm(out, b, affine=False)
            add(p, f"{label}.norm{k}", out)
            p = Parts(ab)
            p.relu(out)
            p.saved += out
            add(p, f"{label}.relu{k}", out)

    c_in = in_channels
    for d in range(depth):
        s, c = image >> d, base << d
        cell(f"enc{d}", s, c_in, c, c)
        stash[d] = add(Parts(ab), f"enc{d}.stash", c * s * s)
        p = Parts(ab)
        p.pool(c * s * s, c * (s // 2) ** 2)
        add(p, f"enc{d}.pool", c * (s // 2) ** 2)
        c_in = c
    s = image >> depth
    cell("bottleneck", s, c_in, base << depth, base << (depth - 1))
    c_low = base << (depth - 1)
    for d in reversed(range(depth)):
        s = image >> d
        p = Parts(ab)
        p.bytes += ab * (c_low * (s // 2) ** 2 + c_low * s * s)     # nearest upsampling
        add(p, f"dec{d}.up", c_low * s * s)
        p = Parts(ab)
        skip = base << d
        p.copy((c_low + skip) * s * s)
        skips.append((stash[d], add(p, f"dec{d}.concat", (c_low + skip) * s * s)))
        c_out = max((base << d) // 2, 1)
        cell(f"dec{d}", s, c_low + skip, c_out, c_out)
        c_low = c_out
    p = Parts(ab)
    p.conv(image, image, c_low, classes, 1)
    add(p, "segment", classes * image * image)
    return _network(cls, name or f"U-Net ({depth}, {convs}) {image}px base {base}", layers,
                    in_channels * image * image, ab, optimizer, skips)
