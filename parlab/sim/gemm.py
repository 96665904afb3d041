"""How fast a GPU multiplies matrices of a given shape: a model of cuBLAS's tiles and waves.

A matrix product C (M x N) = A (M x K) B (K x N) runs as output tiles of tm x tn, each on
one streaming multiprocessor (SM) that steps through K; the SMs take the tiles in waves
(NVIDIA, "Matrix Multiplication Background User's Guide", DU-09799-001, 2023, sections
2.1 and 3: tile and wave quantization). So a tile costs (K + K0) x 2 tm tn / (rate per
SM), K0 standing for what a tile pays besides its K loop (filling the pipeline, writing
C), and a product takes as many tile-times as it has waves. When the tiles cannot fill
the SMs, the library splits K among several tiles (split-K, whose partial results are
added through memory) or picks smaller tiles (less efficient per SM); we take the
quickest of those choices, as cuBLAS's heuristics try to. A product can also be limited
by the bytes it reads and writes (the roofline): the slower of the two counts.

The rate per SM is the device's MAXIMUM ACHIEVABLE matrix rate over its SMs, a
measurement, not the datasheet peak: 794.5 TFLOP/s of the H100 SXM's 989 bf16 and 271.2
of the A100 SXM's 312 (S. Bekman, "Machine Learning Engineering", compute/accelerator,
"Maximum Achievable Matmul FLOPS comparison table": the best of a sweep of shapes).

The tile choices and K0 were fitted to our own measurement, on an H100 SXM 80 GB (132
SMs, PyTorch 2.11 with CUDA 13.0's cuBLAS, bf16, 2026-11-25): every M, N, K of 128 ..
16384 (``data/gemm_h100_bf16.csv``, made by ``scripts/measure_gemm.py``). Of the 586
products that took 0.1 ms or more, the model's time is within 15 % for 95 % (median
error 3 %); attention's batched products (``data/bmm_h100_bf16.csv``) within 12 %
(median); 3 x 3 convolutions (cuDNN, ``data/conv_h100_bf16.csv``) of 0.1 ms or more
within 15 % from 32 channels up, with one more tile for them (CONV_TILES), and up to
several times fast at 16 channels, where cuDNN has kernels of its own. Smaller products
are dominated by the launch (about 5-30 us a call here), which the cost model counts as
its fixed cost per layer pass. The same tiles and K0 serve the other
GPUs, with their own SMs and rate: an assumption (the libraries share their design).

Winograd: on GPUs without tensor cores (float32 on Pascal), cuDNN runs 3 x 3 convolutions
of stride 1 by Winograd's minimal filtering F(2 x 2, 3 x 3) (Lavin & Gray, 2016, "Fast
algorithms for convolutional neural networks", section 4: 16 multiplications for a 2 x 2
output tile instead of 36, 2.25x fewer; cuDNN 5 and later; frameworks that autotune pick
it), its transforms fused on chip as in Lavin & Gray's kernels: such a product's
multiplications divide by ``MatrixUnit.winograd`` (2.25 there, 1 on tensor-core GPUs,
whose convolutions run as implicit matrix products).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from .checks import amount, count

# (tm, tn, efficiency per SM): the large tiles run at the full rate, the small ones do not
TILES = ((128, 256, 1.0), (128, 128, 1.0), (64, 128, 0.5), (256, 64, 0.8), (256, 32, 0.4))
# cuDNN's implicit-GEMM convolutions also have narrow tiles at the full rate: with a
# 128 x 64 tile the model's 3 x 3 convolutions of 32 and 64 channels in
# data/conv_h100_bf16.csv go from 1.16-1.21x too slow to 0.92-0.96 (fitted there)
CONV_TILES = TILES + ((128, 64, 1.0),)
K_OVERHEAD = 320              # K0: a tile's cost beyond its K loop, in K steps (fitted)
WINOGRAD_F2X2_3X3 = 36 / 16   # multiplications of a 2 x 2 output tile, direct over Winograd
SPLITS = (1, 2, 4, 8, 16)     # split-K: K divided among this many tiles
MIN_SPLIT_K = 256             # no split leaves fewer K steps to a tile


@dataclass(frozen=True)
class MatrixUnit:
    """A GPU's matrix engine as the cost model prices it: ``sms`` multiprocessors sharing
    ``rate`` FLOP/s (the maximum achievable on large products), and its memory bandwidth."""

    sms: int
    rate: float
    memory_bandwidth_Bps: float
    winograd: float = 1.0      # how many times fewer multiplications a 3 x 3 convolution needs

    def __post_init__(self):
        count("MatrixUnit", "sms", self.sms)
        amount("MatrixUnit", "rate", self.rate, unit="FLOP/s", positive=True)
        amount("MatrixUnit", "memory_bandwidth_Bps", self.memory_bandwidth_Bps,
               unit="bytes per second", positive=True)

    def compute_s(self, m: float, n: float, k: float, batch: float = 1, *,
                  tiles=TILES) -> float:
        """Seconds of ``batch`` independent m x n x k products, from tiles and waves
        (remembered: a timeline prices the same shapes once per micro-batch)."""
        return _compute_s(self, m, n, k, batch, tiles)

    def _compute_s(self, m: float, n: float, k: float, batch: float, tiles) -> float:
        per_sm = self.rate / self.sms
        best = math.inf
        for tm, tn, eff in tiles:
            tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
            for split in SPLITS:
                if split > 1 and (k / split < MIN_SPLIT_K or batch > 1):
                    break
                waves = math.ceil(tiles * split / self.sms)
                t = waves * (math.ceil(k / split) + K_OVERHEAD) * 2.0 * tm * tn / (per_sm * eff)
                if split > 1:       # the partial sums, float32, written and read back
                    t += batch * m * n * 4.0 * split / self.memory_bandwidth_Bps
                best = min(best, t)
        return best

    def seconds(self, m: float, n: float, k: float, *, batch: float = 1,
                nbytes: float | None = None, elem_bytes: int = 2, conv: bool = False,
                winograd: bool = False) -> float:
        """A product's seconds: the slower of its tiles' compute (a convolution's with
        CONV_TILES, over ``self.winograd`` for a 3 x 3 one of stride 1) and its bytes over
        the memory bandwidth (default bytes: A, B and C once each, ``elem_bytes`` each)."""
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        if nbytes is None:
            nbytes = batch * elem_bytes * (m * k + k * n + m * n)
        fewer = self.winograd if winograd else 1.0
        compute = self.compute_s(m, n, k, batch, tiles=CONV_TILES if conv else TILES)
        return max(compute / fewer, nbytes / self.memory_bandwidth_Bps)

    def efficiency(self, m: float, n: float, k: float, batch: float = 1) -> float:
        """Achieved over maximum rate for one shape (0 .. 1)."""
        t = self.seconds(m, n, k, batch=batch)
        return 2.0 * m * n * k * batch / t / self.rate if t else 0.0


@functools.lru_cache(maxsize=1 << 16)
def _compute_s(unit: MatrixUnit, m, n, k, batch, tiles) -> float:
    return unit._compute_s(m, n, k, batch, tiles)


def layer_products(gemm, batch: float, shard: int) -> list[tuple]:
    """The forward product of one ``layers.Gemm`` for ``batch`` samples on a tensor-parallel
    rank of ``shard`` as (m, n, k, independent products, A elements read)."""
    m, n, k, cnt = gemm.m, gemm.n, gemm.k, gemm.count
    if shard > 1:
        if gemm.split == "n":
            n /= shard
        elif gemm.split == "k":
            k /= shard
        elif gemm.split == "count":
            cnt /= shard
    a = (gemm.a_elems or gemm.m * gemm.k) * (k / gemm.k)
    if gemm.weights:                 # the batch's rows stack into one product per head
        return [(m * batch, n, k, cnt, a * batch * cnt)]
    return [(m, n, k, cnt * batch, a * batch * cnt)]


def pass_s(unit: MatrixUnit, gemms, batch: float, shard: int, elem_bytes: int,
           backward: bool = False, weights_only: bool = False) -> float:
    """Seconds of a layer's matrix products, forward or backward, on one rank.

    Backward, each forward product C = A B becomes two: dA = dC B^T (m x k x n) and
    dB = A^T dC (k x n x m) (for weights, m spans the whole batch: the weights' gradient
    sums over it). Bytes: each product's activations (and weights) read or written once.
    A convolution's two backward products are convolutions too (Winograd applies).
    weights_only: the backward's dB of the products with weights alone, the weights'
    gradient (a split backward's W, Qi et al., 2024); every other product feeds the
    input's gradient.
    """
    total = 0.0
    for g in gemms:
        for m, n, k, b, a_elems in layer_products(g, batch, shard):
            c_elems, w_elems = m * n * b, k * n * (1 if g.weights else b)
            nbytes = elem_bytes * (a_elems + c_elems + w_elems)
            how = {"winograd": g.winograd, "conv": g.a_elems > 0}   # a_elems: convolutions
            if not backward:
                total += unit.seconds(m, n, k, batch=b, nbytes=nbytes, **how)
            elif weights_only:
                total += unit.seconds(k, n, m, batch=b, nbytes=nbytes, **how) if g.weights else 0.0
            else:
                total += unit.seconds(m, k, n, batch=b, nbytes=nbytes, **how)
                total += unit.seconds(k, n, m, batch=b, nbytes=nbytes, **how)
    return total
