"""Matrix products priced by their shape (parlab.sim.gemm): by hand, and against the
products we measured on an H100 (data/gemm_h100_bf16.csv)."""
import csv
import math
import statistics
from pathlib import Path

import pytest

from parlab import sim
from parlab.sim.gemm import K_OVERHEAD, MatrixUnit, pass_s

DATA = Path(__file__).resolve().parents[1] / "data"


def test_one_wave_of_full_tiles_runs_at_k_over_k_plus_k0():
    """2 SMs at 1 TFLOP/s each; 256 x 256 x 1024 is two 128 x 256 tiles, one wave: each
    tile takes (K + K0) 2 tm tn / (rate per SM), so the efficiency is K / (K + K0)."""
    unit = MatrixUnit(sms=2, rate=2e12, memory_bandwidth_Bps=1e15)
    t = unit.seconds(256, 256, 1024)
    assert t == pytest.approx((1024 + K_OVERHEAD) * 2 * 128 * 256 / 1e12)
    assert unit.efficiency(256, 256, 1024) == pytest.approx(1024 / (1024 + K_OVERHEAD))


def test_a_product_sliced_thin_by_tensor_parallelism_loses_efficiency():
    """Row-parallel over 8 ranks: K = 4096 -> 512 per rank; each tile still pays K0."""
    unit = MatrixUnit(sms=4, rate=4e12, memory_bandwidth_Bps=1e15)
    whole = unit.efficiency(512, 256, 4096)
    sliced = unit.efficiency(512, 256, 512)
    assert whole == pytest.approx(4096 / (4096 + K_OVERHEAD))
    assert sliced == pytest.approx(512 / (512 + K_OVERHEAD))
    # too few tiles for the SMs: one 128 x 256 tile on 4 SMs runs at most a quarter
    # rate, unless K is split (here: 4 tiles of 1024, and their partial sums)
    assert unit.efficiency(128, 256, 4096) < whole


def test_a_small_product_is_limited_by_its_bytes():
    unit = MatrixUnit(sms=132, rate=794.5e12, memory_bandwidth_Bps=1e12)
    # 8192 x 8 x 8192 in 2-byte elements: 2 (8192 * 8192 + ...) bytes at 1 TB/s
    nbytes = 2 * (8192 * 8192 + 8192 * 8 + 8192 * 8)
    assert unit.seconds(8192, 8, 8192) == pytest.approx(nbytes / 1e12)


def test_backward_is_two_products_of_the_transposed_shapes():
    """dA = dC B^T (m x k x n) and dB = A^T dC (k x n x m); the batch's rows stack."""
    unit = MatrixUnit(sms=8, rate=8e12, memory_bandwidth_Bps=1e15)
    g = sim.Gemm(m=1, n=1024, k=512)                 # a Linear 512 -> 1024
    fwd = pass_s(unit, (g,), 2048, 1, 2)
    bwd = pass_s(unit, (g,), 2048, 1, 2, backward=True)
    assert fwd == pytest.approx(unit.seconds(2048, 1024, 512))
    assert bwd == pytest.approx(unit.seconds(2048, 512, 1024) + unit.seconds(512, 1024, 2048))
    # column-parallel over 2: n halves
    assert pass_s(unit, (g,), 2048, 2, 2) == pytest.approx(unit.seconds(2048, 512, 512))


def _rows(name):
    with open(DATA / name) as f:
        return list(csv.DictReader(f))


def test_the_model_reproduces_the_h100_products_we_measured():
    """Of the products that took 0.1 ms or more (smaller ones measure the launch), the
    model is within 15 % for at least 90 %, the median error under 5 %."""
    unit = sim.h100_nvlink().matrix
    unit = MatrixUnit(unit.sms, unit.rate, 3.0e12)           # the copy we measured there
    errors = []
    for r in _rows("gemm_h100_bf16.csv"):
        if float(r["seconds"]) >= 1e-4:
            m, n, k = (int(r[x]) for x in "mnk")
            errors.append(abs(math.log(unit.seconds(m, n, k) / float(r["seconds"]))))
    assert len(errors) > 500
    within = sum(e <= math.log(1.15) for e in errors) / len(errors)
    assert within >= 0.9 and statistics.median(errors) < math.log(1.05), (within,)
    # attention's batched products: median within 15 %
    batched = [abs(math.log(unit.seconds(int(r["m"]), int(r["n"]), int(r["k"]),
                                         batch=int(r["g"])) / float(r["seconds"])))
               for r in _rows("bmm_h100_bf16.csv") if float(r["seconds"]) >= 6e-5]
    assert statistics.median(batched) < math.log(1.15)


def test_thin_slices_make_tensor_parallel_blocks_slower_than_work_over_degree():
    """A GPT block on an H100: 8-way tensor parallel takes more than an eighth of one
    GPU's matrix time (Megatron's strong scaling is below linear)."""
    net = sim.Network.transformer("gpt", 1, 4096, 32, 2048)
    r = sim.Roofline(net, sim.h100_nvlink())
    one = r._matmul_s(0, 4, 1, 1.0)
    eight = r._matmul_s(0, 4, 8, 1.0)
    assert one / 8 < eight < one / 4
