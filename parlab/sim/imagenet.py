"""ImageNet classifiers as the cost model sees them, layer for layer as their reference code
builds them: VGG-16, ResNet-101, Inception-v3 and AmoebaNet-D.

Each is a ``Network`` of ``Layer`` s made with ``layers.Parts`` (convolutions as implicit
matrix products, batch normalisation, ReLU, pooling, adds and concats, per image), one
layer per block or cell, so that a pipeline's balance counts the same units as the code
it describes:

* ``vgg16``: Simonyan & Zisserman (2015), configuration D: thirteen 3 x 3 convolutions
  (64 to 512 channels) in five groups each closed by 2 x 2 max pooling, then three fully
  connected layers (25088 -> 4096 -> 4096 -> classes): 138 M parameters at 1000 classes.
* ``resnet``: He et al. (2016), ResNet v1 with bottleneck blocks (1 x 1, 3 x 3, 1 x 1 to
  4x the width, batch normalisation after each, the first block of a stage projecting its
  shortcut; stride 2 in its first 1 x 1 as in v1), stages of [3, 4, 23, 3] blocks for
  depth 101: 44.5 M parameters.
* ``inception_v3``: Szegedy et al. (2016), as torchvision and tf_cnn_benchmarks build it:
  the stem to 35 x 35 x 192, three A modules, a B (to 17 x 17), four C modules (7 x 1 and
  1 x 7 factorised, widths 128, 160, 160, 192), a D (to 8 x 8), two E modules, pooling
  and the classifier (no auxiliary head): 23.8 M parameters at 1000 classes, input 299.
* ``amoebanet_d``: AmoebaNet-D (Real et al., 2019) as GPipe trains it (Huang et al., 2019:
  L normal cells in three stacks, D filters) and as torchgpipe's benchmark builds it
  (kakaobrain/torchgpipe, benchmarks/models/amoebanet: genotype, operations and the
  stem): a stem convolution, two reduction cells, the stacks with a reduction cell
  between them, and the classifier: 24 layers at L = 18, as torchgpipe's nn.Sequential,
  so its published balances apply as they are. Every cell reads the outputs of the two
  cells before it (skip connections a pipeline cut carries).
"""
from __future__ import annotations

from .layers import Parts, optimizer_state


def _network(cls, name, layers, in_elems, act_bytes, optimizer, skips=()):
    state, update = optimizer_state(optimizer, act_bytes)
    return cls(name, tuple(layers), in_elems, act_bytes, state, grad_wire_bytes=act_bytes,
               update_bytes=update, skips=tuple(skips))


def _conv_bn_relu(p: Parts, h, w, c_in, c_out, kh, kw=None, *, stride=1, pad=None, relu=True):
    ho, wo = p.conv(h, w, c_in, c_out, kh, kw, stride=stride, pad=pad)
    p.norm(c_out * ho * wo, c_out)
    if relu:
        p.relu(c_out * ho * wo)
    return ho, wo


def _classifier(p: Parts, c: int, side: int, classes: int):
    p.pool(c * side * side, c)
    p.linear(c, classes)
    return p.layer("classifier", classes)


# ------------------------------------------------------------------ VGG-16
def vgg16(cls, image: int = 224, classes: int = 1000, *, act_bytes: int = 4,
          optimizer: str = "sgd"):
    """VGG-16 (see the module doc): one layer per convolution (with its ReLU, and the
    group's max pooling on the last), then the three fully connected layers."""
    layers, c_prev, s = [], 3, image
    for group, (width, convs) in enumerate(((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))):
        for k in range(convs):
            p = Parts(act_bytes)
            p.conv(s, s, c_prev, width, 3, bias=True)
            p.relu(width * s * s)
            if k == convs - 1:
                p.pool(width * s * s, width * (s // 2) ** 2)
            c_prev = width
            layers.append(p.layer(f"conv{group + 1}_{k + 1}",
                                  width * (s // 2 if k == convs - 1 else s) ** 2))
        s //= 2
    for k, (a, b) in enumerate(((c_prev * s * s, 4096), (4096, 4096), (4096, classes))):
        p = Parts(act_bytes)
        p.linear(a, b)
        if k < 2:
            p.relu(b)
        layers.append(p.layer(f"fc{k + 6}", b))
    return _network(cls, f"VGG-16 {image}px", layers, 3 * image * image, act_bytes, optimizer)


# ------------------------------------------------------------------ ResNet
RESNET_STAGES = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def resnet(cls, depth: int = 101, image: int = 224, classes: int = 1000, *,
           act_bytes: int = 4, optimizer: str = "sgd"):
    """ResNet v1 of bottleneck blocks (see the module doc): the stem, one layer per block,
    the classifier."""
    if depth not in RESNET_STAGES:
        raise ValueError(f"depth must be one of {sorted(RESNET_STAGES)}, got {depth!r}")
    p = Parts(act_bytes)
    s, _ = _conv_bn_relu(p, image, image, 3, 64, 7, stride=2)
    p.pool(64 * s * s, 64 * (s // 2) ** 2)
    s //= 2
    layers, c_prev = [p.layer("stem", 64 * s * s)], 64
    for stage, blocks in enumerate(RESNET_STAGES[depth]):
        width = 64 << stage
        for k in range(blocks):
            stride = 2 if (k == 0 and stage > 0) else 1
            p = Parts(act_bytes)
            so, _ = _conv_bn_relu(p, s, s, c_prev, width, 1, stride=stride)
            _conv_bn_relu(p, so, so, width, width, 3)
            _conv_bn_relu(p, so, so, width, 4 * width, 1, relu=False)
            if k == 0:                       # the projection shortcut
                _conv_bn_relu(p, s, s, c_prev, 4 * width, 1, stride=stride, relu=False)
            out = 4 * width * so * so
            p.add(out)
            p.relu(out)
            layers.append(p.layer(f"stage{stage + 1}.block{k}", out))
            s, c_prev = so, 4 * width
    p = Parts(act_bytes)
    layers.append(_classifier(p, c_prev, s, classes))
    return _network(cls, f"ResNet-{depth} {image}px", layers, 3 * image * image, act_bytes,
                    optimizer)


# ------------------------------------------------------------------ Inception-v3
def _branch(p: Parts, s: int, c_in: int, convs) -> tuple[int, int]:
    """A chain of (c_out, kh, kw, stride, pad) convolutions, each with batch norm and ReLU:
    (channels, side) of its output."""
    for c_out, kh, kw, stride, pad in convs:
        s, _ = _conv_bn_relu(p, s, s, c_in, c_out, kh, kw, stride=stride, pad=pad)
        c_in = c_out
    return c_in, s


def _pool_branch(p: Parts, s: int, c: int, stride: int = 1) -> int:
    so = (s - 3) // stride + 1 if stride > 1 else s
    p.pool(c * s * s, c * so * so)
    return so


def _module(p: Parts, name: str, s: int, c: int, branches, pool: int | None,
            stride: int = 1):
    """An Inception module: its branches side by side, a pooling branch (projected to
    ``pool`` channels, or kept whole when None, strided with the module), concatenated."""
    total, side = 0, s
    for convs in branches:
        ch, side = _branch(p, s, c, convs)
        total += ch
    ps = _pool_branch(p, s, c, stride)
    if pool:
        _conv_bn_relu(p, ps, ps, c, pool, 1)
        total += pool
    else:
        total += c
    p.copy(total * side * side)
    return p.layer(name, total * side * side), total, side


def inception_v3(cls, image: int = 299, classes: int = 1000, *, act_bytes: int = 4,
                 optimizer: str = "sgd"):
    """Inception-v3 (see the module doc): the stem, eleven modules, the classifier."""
    v = 0                       # "valid" padding
    p = Parts(act_bytes)
    c, s = _branch(p, image, 3, ((32, 3, 3, 2, v), (32, 3, 3, 1, v), (64, 3, 3, 1, 1)))
    s = _pool_branch(p, s, c, 2)
    c, s = _branch(p, s, c, ((80, 1, 1, 1, 0), (192, 3, 3, 1, v)))
    s = _pool_branch(p, s, c, 2)
    layers = [p.layer("stem", c * s * s)]

    def add(layer_c_s):
        nonlocal c, s
        layer, c, s = layer_c_s
        layers.append(layer)

    for k, pool in enumerate((32, 64, 64)):
        add(_module(Parts(act_bytes), f"mixed_5{'bcd'[k]}", s, c,
                    (((64, 1, 1, 1, 0),), ((48, 1, 1, 1, 0), (64, 5, 5, 1, 2)),
                     ((64, 1, 1, 1, 0), (96, 3, 3, 1, 1), (96, 3, 3, 1, 1))), pool))
    add(_module(Parts(act_bytes), "mixed_6a", s, c,
                (((384, 3, 3, 2, v),), ((64, 1, 1, 1, 0), (96, 3, 3, 1, 1), (96, 3, 3, 2, v))),
                None, stride=2))
    for k, c7 in enumerate((128, 160, 160, 192)):
        add(_module(Parts(act_bytes), f"mixed_6{'bcde'[k]}", s, c,
                    (((192, 1, 1, 1, 0),),
                     ((c7, 1, 1, 1, 0), (c7, 1, 7, 1, None), (192, 7, 1, 1, None)),
                     ((c7, 1, 1, 1, 0), (c7, 7, 1, 1, None), (c7, 1, 7, 1, None),
                      (c7, 7, 1, 1, None), (192, 1, 7, 1, None))), 192))
    add(_module(Parts(act_bytes), "mixed_7a", s, c,
                (((192, 1, 1, 1, 0), (320, 3, 3, 2, v)),
                 ((192, 1, 1, 1, 0), (192, 1, 7, 1, None), (192, 7, 1, 1, None),
                  (192, 3, 3, 2, v))), None, stride=2))
    for k in range(2):
        add(_inception_e(Parts(act_bytes), f"mixed_7{'bc'[k]}", s, c))
    layers.append(_classifier(Parts(act_bytes), c, s, classes))
    return _network(cls, f"Inception-v3 {image}px", layers, 3 * image * image, act_bytes,
                    optimizer)


def _inception_e(p: Parts, name: str, s: int, c: int):
    """Module E: 1 x 1; 1 x 1 then 1 x 3 and 3 x 1 side by side; 1 x 1, 3 x 3, then 1 x 3
    and 3 x 1 side by side; pooling projected to 192: 320 + 768 + 768 + 192 = 2048."""
    _branch(p, s, c, ((320, 1, 1, 1, 0),))
    _branch(p, s, c, ((384, 1, 1, 1, 0),))
    _branch(p, s, 384, ((384, 1, 3, 1, None),))
    _branch(p, s, 384, ((384, 3, 1, 1, None),))
    _branch(p, s, c, ((448, 1, 1, 1, 0), (384, 3, 3, 1, 1)))
    _branch(p, s, 384, ((384, 1, 3, 1, None),))
    _branch(p, s, 384, ((384, 3, 1, 1, None),))
    _pool_branch(p, s, c)
    _conv_bn_relu(p, s, s, c, 192, 1)
    p.copy(2048 * s * s)
    return p.layer(name, 2048 * s * s), 2048, s


# ------------------------------------------------------------------ AmoebaNet-D
# torchgpipe's genotype (benchmarks/models/amoebanet/genotype.py): (input state, operation)
# pairs, summed two by two into new states, and the states concatenated at the end
NORMAL = (("s", 1, "conv_1x1"), ("s", 1, "pool"), ("s", 1, "none"), ("s", 0, "conv_1x7_7x1"),
          ("s", 0, "conv_1x1"), ("s", 0, "conv_1x7_7x1"), ("s", 2, "pool"), ("s", 2, "none"),
          ("s", 1, "pool"), ("s", 5, "conv_1x1"))
NORMAL_CONCAT = (0, 3, 4, 6)
REDUCTION = (("s", 0, "pool"), ("s", 0, "pool"), ("s", 2, "none"), ("s", 1, "conv_3x3"),
             ("s", 2, "conv_1x7_7x1"), ("s", 2, "pool"), ("s", 3, "none"), ("s", 1, "pool"),
             ("s", 2, "pool"), ("s", 3, "conv_1x1"))
REDUCTION_CONCAT = (4, 5, 6)


def _factorized_reduce(p: Parts, s: int, c_in: int, c_out: int) -> int:
    """Two 1 x 1 convolutions of stride 2 side by side (c_out / 2 each), concatenated and
    batch-normalised: half the side."""
    p.relu(c_in * s * s)
    so, _ = p.conv(s, s, c_in, c_out // 2, 1, stride=2)
    p.conv(s, s, c_in, c_out // 2, 1, stride=2)
    p.copy(c_out * so * so)
    p.norm(c_out * so * so, c_out)
    return so


def _operation(p: Parts, kind: str, s: int, c: int, stride: int) -> int:
    """One operation of a cell on a state of c channels, s a side: the output's side."""
    if kind == "none":
        return _factorized_reduce(p, s, c, c) if stride == 2 else s
    so = s // stride
    if kind == "pool":
        p.pool(c * s * s, c * so * so)
        return so
    if kind == "conv_1x1":
        p.relu(c * s * s)
        _conv_bn_relu(p, s, s, c, c, 1, stride=stride, relu=False)
        return so
    q = c // 4                               # conv_3x3 and conv_1x7_7x1: a bottleneck of c/4
    p.relu(c * s * s)
    _conv_bn_relu(p, s, s, c, q, 1)
    if kind == "conv_3x3":
        _conv_bn_relu(p, s, s, q, q, 3, stride=stride)
    else:
        _conv_bn_relu(p, s, s, q, q, 1, 7, stride=(1, stride))
        _conv_bn_relu(p, s, so, q, q, 7, 1, stride=(stride, 1))
    _conv_bn_relu(p, so, so, q, c, 1, relu=False)
    return so


def _amoeba_cell(name, prev, prev_prev, c, reduction, reduction_prev, ab):
    """One cell from the previous output (channels, side) and the one before it: see
    ``amoebanet_d``. Returns the layer and the output's (channels, side)."""
    p = Parts(ab)
    (cp, sp), (cpp, spp) = prev, prev_prev
    p.relu(cp * sp * sp)
    _conv_bn_relu(p, sp, sp, cp, c, 1, relu=False)           # reduce1
    if reduction_prev:
        _factorized_reduce(p, spp, cpp, c)                      # reduce2
    elif cpp != c:
        p.relu(cpp * spp * spp)
        _conv_bn_relu(p, spp, spp, cpp, c, 1, relu=False)
    ops, concat = (REDUCTION, REDUCTION_CONCAT) if reduction else (NORMAL, NORMAL_CONCAT)
    sides = [sp, sp]
    for k in range(0, len(ops), 2):
        out = []
        for _, state, kind in ops[k:k + 2]:
            stride = 2 if reduction and state < 2 else 1
            out.append(_operation(p, kind, sides[state], c, stride))
        p.add(c * out[0] * out[0])
        sides.append(out[0])
    side = sides[-1]
    channels = len(concat) * c
    p.copy(channels * side * side)
    return p.layer(name, channels * side * side), (channels, side)


def amoebanet_d(cls, image: int = 224, layers: int = 18, filters: int = 256,
                classes: int = 1000, *, act_bytes: int = 4, optimizer: str = "sgd"):
    """AmoebaNet-D (L = ``layers``, D = ``filters``) as torchgpipe builds it: see the
    module doc."""
    if layers % 3:
        raise ValueError(f"layers={layers}: three stacks of normal cells need a multiple of 3")
    if image % 32:
        raise ValueError(f"image={image}: five halvings need a multiple of 32")
    ab, c = act_bytes, filters // 4
    p = Parts(ab)
    p.relu(3 * image * image)
    s, _ = _conv_bn_relu(p, image, image, 3, c, 3, stride=2, relu=False)
    out, skips = [p.layer("stem1", c * s * s)], []
    prev = prev_prev = (c, s)
    reduction_prev = False
    plan = [("stem2", True), ("stem3", True)]
    for stack in range(3):
        plan += [(f"cell{2 * stack + 1}_normal{k + 1}", False) for k in range(layers // 3)]
        if stack < 2:
            plan.append((f"cell{2 * stack + 2}_reduction", True))
    for name, reduction in plan:
        c *= 2 if reduction else 1
        layer, shape = _amoeba_cell(name, prev, prev_prev, c, reduction, reduction_prev, ab)
        out.append(layer)
        if len(out) > 2:
            skips.append((len(out) - 3, len(out) - 1))
        prev_prev, prev, reduction_prev = prev, shape, reduction
    out.append(_classifier(Parts(ab), prev[0], prev[1], classes))
    return _network(cls, f"AmoebaNet-D ({layers}, {filters}) {image}px", out,
                    3 * image * image, ab, optimizer, skips)
