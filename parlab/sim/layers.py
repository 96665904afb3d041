"""One layer of a network as the cost model sees it, and builders for the common kinds.

A :class:`Layer` holds, per *sample* (a row of the batch, an image, a sequence), the few
numbers the timelines and the memory model need: parameters, forward FLOPs of its matrix
products, the activation it hands on, what it keeps for the backward pass, and the bytes
its element-wise work moves. ``gemms`` says which matrix products make up its FLOPs
(:class:`Gemm`), so that a device model can price each by its shape
(``sim.gemm.MatrixUnit``); ``sum(g.flops for g in gemms) == flops`` when given.

Builders (FLOPs count a multiply-add as 2; "same" padding; per sample):

* ``linear(a, b)``: a b + b parameters, 2 a b FLOPs; with its ReLU it keeps its input
  and output (a + b elements).
* ``conv2d(h, w, c_in, c_out, k, stride)``: k^2 c_in c_out + c_out parameters and
  2 k^2 c_in c_out h' w' FLOPs for an output of h' x w' = h/stride x w/stride pixels
  (e.g. Molchanov et al., 2017, "Pruning convolutional neural networks", eq. 6, without
  the bias term); as an implicit matrix product M = h' w' pixels, N = c_out,
  K = k^2 c_in that reads the c_in h w input once (cuDNN's implicit GEMM, Chetlur et al.,
  2014, "cuDNN", section 3). Keeps its input (for the weights' gradient) and, with its
  ReLU, its output.
* ``max_pool(h, w, c, size)``: no parameters, no matrix work; keeps its input (to send the
  gradient to the maximum); reads the input and writes a size^2 smaller output.
* ``up_conv(h, w, c_in, c_out)``: U-Net's "up-convolution", a 2 x 2 transposed
  convolution of stride 2 (Ronneberger, Fischer & Brox, 2015, section 2): 4 c_in c_out +
  c_out parameters, 2 x 4 c_in c_out h w FLOPs (each input pixel fills a 2 x 2 patch),
  output c_out x 2h x 2w; keeps its input.
* ``concat(a, b)``: joins two activations (a skip connection and the layer before):
  copies both, keeps nothing (its gradient is a split).
* ``separable_conv(h, w, c_in, c_out, k, stride)``: depthwise k x k then pointwise 1 x 1
  (Chollet, 2017): k^2 c_in + c_in c_out parameters; the depthwise part (2 k^2 c_in h' w'
  FLOPs) is element-wise work on the memory bus, the pointwise part a matrix product.
"""
from __future__ import annotations

from dataclasses import dataclass

from .checks import amount, count

SPLITS = ("n", "k", "count", None)


@dataclass(frozen=True)
class Gemm:
    """One matrix product of a layer's forward pass, per sample: C (m x n) = A (m x k) B (k x n),
    ``count`` times (attention heads).

    weights: B is the layer's parameters, shared by the batch (the batch stacks its rows
    into one product of m x batch rows); otherwise B is an activation too (attention's
    keys and values) and each sample has products of its own. a_elems: the elements of A
    actually read (0: m k; a convolution reads its input once, not k^2 times). split:
    what tensor parallelism slices: "n" (column-parallel, output features), "k"
    (row-parallel, input features), "count" (attention heads), None (repeated whole).
    winograd: a 3 x 3 convolution of stride 1, which a library may run with Winograd's
    minimal filtering (fewer multiplications: ``gemm.MatrixUnit.winograd``).
    """

    m: float
    n: float
    k: float
    count: float = 1
    weights: bool = True
    a_elems: float = 0.0
    split: str | None = "n"
    winograd: bool = False

    def __post_init__(self):
        for name in ("m", "n", "k", "count"):
            amount("Gemm", name, getattr(self, name), positive=True)
        amount("Gemm", "a_elems", self.a_elems)
        if self.split not in SPLITS:
            raise ValueError(f"Gemm: split must be one of {SPLITS}, got {self.split!r}")

    @property
    def flops(self) -> float:
        """Forward FLOPs per sample: 2 m n k per product."""
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class Layer:
    """One layer (or block), per sample. ``flops``: its forward matrix products.

    saved_elems: kept for the backward pass and sliced by tensor parallelism;
    saved_replicated_elems: kept whole by every tensor-parallel rank (layer norms'
    inputs, dropout masks: what sequence parallelism divides); attention_elems: the part
    of ``saved_elems`` that selective recomputation drops (attention's scores, softmax
    and dropout, Korthikanti et al., 2022, section 5); attention_bytes: the part of
    ``elementwise_bytes`` it recomputes.
    """

    name: str
    params: int
    flops: float
    out_elems: float                 # the activation handed on (what a stage sends)
    saved_elems: float               # kept for the backward pass (split by tp)
    elementwise_bytes: float = 0.0   # read + written by element-wise work, split by tp
    replicated_bytes: float = 0.0    # read + written by work every tp rank repeats
    tp_all_reduces: int = 0          # a Megatron block: all-reduces of its output per pass
                                     # (0: a plain linear layer, paired column-then-row)
    gemms: tuple = ()                # its matrix products (Gemm), when known
    saved_replicated_elems: float = 0.0
    attention_elems: float = 0.0
    attention_bytes: float = 0.0
    backward_gemms: tuple = ()       # products the backward runs besides the two of each
                                     # forward one (flash attention's recomputed scores)
    replicated_params: int = 0       # held whole by every tp rank (norms, row layers'
                                     # biases): sequence parallelism all-reduces their
                                     # gradients over tp (``sim.context``)
    expert_params: int = 0           # of ``params``, the experts' (a mixture-of-experts
                                     # block): expert parallelism spreads them over ep ranks
    routed_elems: float = 0.0        # the activations an expert-parallel block sends to
                                     # its experts per pass (tokens x top_k x h), per sample
    experts: int = 1                 # how many experts share ``expert_params`` (1: dense)

    def __post_init__(self):
        owner = f"Layer {self.name!r}"
        count(owner, "params", self.params, minimum=0)
        count(owner, "tp_all_reduces", self.tp_all_reduces, minimum=0)
        count(owner, "replicated_params", self.replicated_params, minimum=0)
        count(owner, "expert_params", self.expert_params, minimum=0)
        count(owner, "experts", self.experts, minimum=1)
        if self.expert_params > self.params:
            raise ValueError(f"{owner}: expert_params={self.expert_params} is more than its "
                             f"params={self.params}")
        for name in ("flops", "out_elems", "saved_elems", "elementwise_bytes",
                     "replicated_bytes", "saved_replicated_elems", "attention_elems",
                     "attention_bytes", "routed_elems"):
            amount(owner, name, getattr(self, name))
        if not all(isinstance(g, Gemm) for g in self.gemms + self.backward_gemms):
            raise ValueError(f"{owner}: gemms must be Gemm, got {self.gemms!r}")


# ------------------------------------------------------------------ builders
def linear(name: str, a: int, b: int, *, act_bytes: int = 4, relu: bool = True) -> Layer:
    """A Linear a -> b (and its ReLU): see the module doc."""
    return Layer(name, a * b + b, 2.0 * a * b, out_elems=b, saved_elems=a + b * relu,
                 elementwise_bytes=act_bytes * 2.0 * b * relu, gemms=(Gemm(1, b, a),))


def conv2d(name: str, h: int, w: int, c_in: int, c_out: int, k: int = 3, *, stride: int = 1,
           relu: bool = True, act_bytes: int = 4) -> Layer:
    """A k x k convolution with "same" padding (and its ReLU): see the module doc."""
    ho, wo = _strided(h, stride), _strided(w, stride)
    out = c_out * ho * wo
    gemm = Gemm(ho * wo, c_out, k * k * c_in, a_elems=c_in * h * w,
                winograd=k == 3 and stride == 1)
    return Layer(name, k * k * c_in * c_out + c_out, gemm.flops, out_elems=out,
                 saved_elems=c_in * h * w + out * relu,
                 elementwise_bytes=act_bytes * 2.0 * out * relu, gemms=(gemm,))


def max_pool(name: str, h: int, w: int, c: int, size: int = 2, *, act_bytes: int = 4) -> Layer:
    """Max pooling, size x size windows of stride size: see the module doc."""
    out = c * _strided(h, size) * _strided(w, size)
    return Layer(name, 0, 0.0, out_elems=out, saved_elems=c * h * w,
                 elementwise_bytes=act_bytes * (c * h * w + out))


def up_conv(name: str, h: int, w: int, c_in: int, c_out: int, *, act_bytes: int = 4) -> Layer:
    """A 2 x 2 transposed convolution of stride 2: see the module doc."""
    gemm = Gemm(h * w, 4 * c_out, c_in)
    return Layer(name, 4 * c_in * c_out + c_out, gemm.flops, out_elems=c_out * 4 * h * w,
                 saved_elems=c_in * h * w, gemms=(gemm,))


def concat(name: str, a: float, b: float, *, act_bytes: int = 4) -> Layer:
    """Two activations of a and b elements joined: see the module doc."""
    return Layer(name, 0, 0.0, out_elems=a + b, saved_elems=0.0,
                 elementwise_bytes=act_bytes * 2.0 * (a + b))


def separable_conv(name: str, h: int, w: int, c_in: int, c_out: int, k: int = 3, *,
                   stride: int = 1, act_bytes: int = 4) -> Layer:
    """Depthwise k x k then pointwise 1 x 1 (with a ReLU before it): see the module doc."""
    ho, wo = _strided(h, stride), _strided(w, stride)
    mid, out = c_in * ho * wo, c_out * ho * wo
    gemm = Gemm(ho * wo, c_out, c_in)
    return Layer(name, k * k * c_in + c_in * c_out, gemm.flops, out_elems=out,
                 saved_elems=c_in * h * w + mid + out,
                 # the depthwise pass (k^2 FLOPs per element: bandwidth-bound) reads its
                 # input and writes its output; the ReLU reads and writes the result
                 elementwise_bytes=act_bytes * (c_in * h * w + mid + 2.0 * out),
                 gemms=(gemm,))


def optimizer_state(optimizer: str, act_bytes: int) -> tuple[dict, float]:
    """(bytes per parameter {"params", "grads", "optimizer"}, update bytes per parameter).

    float32 (act_bytes 4): SGD 4 + 4 + 0, Adam 4 + 4 + 8 (two moments). Mixed precision
    (act_bytes 2): Adam 2 + 2 + 12 (fp32 master weights and moments, Rajbhandari et al.,
    2020, section 3.1), SGD 2 + 2 + 4 (fp32 master weights)."""
    adam = {"sgd": False, "adam": True}.get(optimizer)
    if adam is None:
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    if act_bytes == 4:
        return {"params": 4, "grads": 4, "optimizer": 8 if adam else 0}, 28.0 if adam else 12.0
    return ({"params": act_bytes, "grads": act_bytes, "optimizer": 12 if adam else 4},
            32.0 if adam else 16.0)


def _strided(size: int, stride: int) -> int:
    size, stride = count("layer", "size", size), count("layer", "stride", stride)
    if size % stride:
        raise ValueError(f"a size of {size} does not divide by the stride {stride}")
    return size // stride


class Parts:
    """A layer built from its parts (a residual block, an Inception module, an AmoebaNet
    cell, or one module of a sequential model): each call adds one operation's numbers,
    per sample, and ``layer`` sums them. Convolutions are implicit matrix products that
    read their input once (as ``conv2d``); a normalisation (batch or instance) reads its
    input twice (statistics, then normalising) and writes once, and keeps its input; a
    ReLU reads and writes once (what it keeps is the next operation's input, counted
    there); pooling reads its input and writes its output, and keeps its input; an add
    reads two and writes one; a concat copies."""

    def __init__(self, act_bytes: int = 4):
        self.ab, self.gemms, self.params, self.saved, self.bytes = act_bytes, [], 0, 0.0, 0.0

    def conv(self, h: int, w: int, c_in: int, c_out: int, kh: int, kw: int | None = None, *,
             stride=1, pad=None, bias: bool = False) -> tuple[int, int]:
        """A kh x kw convolution (stride an int or (rows, columns); pad default "same"):
        returns the output's (height, width)."""
        kw = kh if kw is None else kw
        sh, sw = (stride, stride) if isinstance(stride, int) else stride
        ph, pw = ((kh - 1) // 2, (kw - 1) // 2) if pad is None else (pad, pad)
        ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        self.gemms.append(Gemm(ho * wo, c_out, kh * kw * c_in, a_elems=c_in * h * w,
                               winograd=kh == kw == 3 and sh == sw == 1))
        self.params += kh * kw * c_in * c_out + (c_out if bias else 0)
        self.saved += c_in * h * w
        return ho, wo

    def norm(self, elems: float, channels: int, *, affine: bool = True) -> None:
        self.params += 2 * channels if affine else 0
        self.bytes += 3.0 * self.ab * elems
        self.saved += elems

    def relu(self, elems: float) -> None:
        self.bytes += 2.0 * self.ab * elems

    def pool(self, in_elems: float, out_elems: float) -> None:
        self.bytes += self.ab * (in_elems + out_elems)
        self.saved += in_elems

    def add(self, elems: float) -> None:
        self.bytes += 3.0 * self.ab * elems

    def copy(self, elems: float) -> None:
        self.bytes += 2.0 * self.ab * elems

    def linear(self, a: int, b: int) -> None:
        self.gemms.append(Gemm(1, b, a))
        self.params += a * b + b
        self.saved += a

    def layer(self, name: str, out_elems: float) -> Layer:
        gemms = tuple(self.gemms)
        return Layer(name, self.params, sum(g.flops for g in gemms), out_elems=out_elems,
                     saved_elems=self.saved, elementwise_bytes=self.bytes, gemms=gemms)
