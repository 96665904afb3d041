"""Measure a GPU's achieved matrix-product rate against the product's shape (bf16).

What ``data/gemm_h100_bf16.csv`` holds and how it was made: on one CUDA GPU, for every
M, N, K of a grid, ``A @ B`` with A (M, K) and B (K, N) in bfloat16 (cuBLAS through
PyTorch), three products to warm up, then as many as last at least 2 ms (at least 5),
timed together with CUDA events; the rate is 2 M N K / seconds per product. Also batched
products (attention's scores and their use: G products of (s, d) x (d, s) and (s, s) x
(s, d)), 3x3 convolutions (cuDNN, channels-last, forward), and the memory bandwidth of a
copy. Usage (a GPU machine): ``python scripts/measure_gemm.py OUTDIR``.
"""
import csv
import sys
import time
from pathlib import Path

import torch

SIZES = (128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)


def timed(fn, min_s=2e-3, min_reps=5):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = min_reps
    while True:
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        total = start.elapsed_time(end) / 1e3
        if total >= min_s or reps >= 4096:
            return total / reps
        reps = min(4096, max(reps * 2, int(reps * min_s / max(total, 1e-9)) + 1))


def gemms(out: Path):
    dev, dt = "cuda", torch.bfloat16
    big = max(SIZES)
    a_all = torch.randn(big, big, device=dev, dtype=dt)
    b_all = torch.randn(big, big, device=dev, dtype=dt)
    with open(out / "gemm_h100_bf16.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["m", "n", "k", "seconds", "tflops"])
        for m in SIZES:
            for n in SIZES:
                for k in SIZES:
                    a = a_all[:m, :k].contiguous()
                    b = b_all[:k, :n].contiguous()
                    s = timed(lambda: a @ b)
                    w.writerow([m, n, k, f"{s:.4e}", f"{2 * m * n * k / s / 1e12:.1f}"])
                    del a, b


def batched(out: Path):
    dev, dt = "cuda", torch.bfloat16
    with open(out / "bmm_h100_bf16.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["g", "m", "n", "k", "seconds", "tflops"])
        for g in (16, 64, 256):
            for s in (256, 512, 1024, 2048, 4096, 8192):
                for d in (64, 128):
                    if g * s * s * 2 > 8e9:
                        continue
                    q = torch.randn(g, s, d, device=dev, dtype=dt)
                    kt = torch.randn(g, d, s, device=dev, dtype=dt)
                    p = torch.randn(g, s, s, device=dev, dtype=dt)
                    v = torch.randn(g, s, d, device=dev, dtype=dt)
                    for m, n, k, fn in ((s, s, d, lambda: torch.bmm(q, kt)),
                                        (s, d, s, lambda: torch.bmm(p, v))):
                        t = timed(fn)
                        w.writerow([g, m, n, k, f"{t:.4e}", f"{2 * g * m * n * k / t / 1e12:.1f}"])
                    del q, kt, p, v


def convs(out: Path):
    dev, dt = "cuda", torch.bfloat16
    torch.backends.cudnn.benchmark = True
    with open(out / "conv_h100_bf16.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["batch", "hw", "c_in", "c_out", "k", "seconds", "tflops"])
        for batch in (8, 32):
            for hw in (16, 32, 64, 128, 256):
                for c in (16, 32, 64, 128, 256, 512):
                    if batch * hw * hw * c * 2 > 2e9:
                        continue
                    x = torch.randn(batch, c, hw, hw, device=dev, dtype=dt).to(
                        memory_format=torch.channels_last)
                    conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False).to(
                        dev, dt, memory_format=torch.channels_last)
                    with torch.no_grad():
                        t = timed(lambda: conv(x))
                    flops = 2 * 9 * c * c * hw * hw * batch
                    w.writerow([batch, hw, c, c, 3, f"{t:.4e}", f"{flops / t / 1e12:.1f}"])
                    del x, conv


def bandwidth(out: Path):
    x = torch.empty(2**30 // 2, device="cuda", dtype=torch.bfloat16).normal_()
    y = torch.empty_like(x)
    copy = timed(lambda: y.copy_(x))
    gelu = timed(lambda: torch.nn.functional.gelu(x, approximate="tanh"))
    props = torch.cuda.get_device_properties(0)
    with open(out / "memory_h100.txt", "w") as f:
        f.write(f"device {props.name}, {props.multi_processor_count} SMs, torch "
                f"{torch.__version__}, cuBLAS via torch, {time.strftime('%Y-%m-%d')}\n")
        f.write(f"copy 1 GiB (read + write 2 GiB): {2 * 2**30 / copy / 1e9:.0f} GB/s\n")
        f.write(f"gelu 1 GiB bf16 (read + write 2 GiB): {2 * 2**30 / gelu / 1e9:.0f} GB/s\n")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    bandwidth(out)
    gemms(out)
    print(f"gemms done {time.time() - t0:.0f} s", flush=True)
    batched(out)
    convs(out)
    print(f"all done {time.time() - t0:.0f} s", flush=True)
