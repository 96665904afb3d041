"""The GPU test run (``make test-gpu``): what only a CUDA GPU can check.

Every test here is marked ``gpu`` and skipped, with its reason, where torch sees no CUDA
GPU (``pytest -rs`` shows it). Multi-GPU NCCL needs at least 4 GPUs for the all-strategies
test; on one GPU the same strategies run in shared-GPU mode (ranks on cuda:0, messages
through host memory), and NCCL is exercised by one rank alone.

Nothing here imports TensorFlow: the GPU machine this was written for has none.
"""
import time

import gpu_workers
import pytest

import parlab

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not CUDA, reason="no CUDA GPU: torch.cuda.is_available() is "
                                                  "False (the GPU run is make test-gpu)")]
# float32 on a GPU differs from the CPU reference in the last bits (other kernels, other
# summation orders); three steps of training stay well within this
GPU_TOL = 1e-4


def test_one_rank_uses_nccl_and_cuda_event_timing():
    devs = parlab.devices(1, mode="gpu")
    assert devs.kind == "cuda" and devs.backend == "nccl" and devs.describe().startswith("1 real GPU")
    out = parlab.launch(gpu_workers.nccl_on_one_rank, 1, devices=devs, timeout=120)
    r = out.results[0]
    assert "nccl" in r["backend"] and r["device"] == "cuda:0" and r["uses_gpus"]
    assert r["sum"] == 3000.0 and r["timer"] == "CudaEventTimer"


def test_cuda_event_spans_agree_with_a_synchronised_wall_clock():
    from parlab import trace
    from parlab.torch.runtime import CudaEventTimer
    device = torch.device("cuda", 0)
    a = torch.randn(4096, 4096, device=device)
    a @ a
    torch.cuda.synchronize(device)
    with trace.recording(timer=CudaEventTimer(device)) as rec:
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with trace.span("matmuls"):
            for _ in range(50):
                a = (a @ a) / 64    # keeps the entries near 1: sqrt(4096) = 64
        launched = time.perf_counter() - t0      # the host returns once the kernels are queued
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
    span = rec.spans()[0]
    assert span.duration <= wall * 1.02 + 1e-4
    assert span.duration >= 0.8 * wall, (span.duration, wall)
    assert span.start >= t0 - 1e-3 and span.end <= t0 + wall + 1e-3, "events map onto the host clock"
    print(f"span {span.duration * 1e3:.2f} ms, synchronised wall {wall * 1e3:.2f} ms, "
          f"host clock around the launches only {launched * 1e3:.2f} ms")


@pytest.mark.parametrize("n", [2, 4])
def test_shared_gpu_mode_runs_every_traced_operation_through_host_memory(n):
    devs = parlab.devices(n, mode="shared-gpu")
    assert devs.describe().startswith(f"{n} ranks sharing") and "host memory" in devs.describe()
    out = parlab.launch(gpu_workers.staged_ops, n, kwargs=dict(force=False), devices=devs, timeout=180)
    gpu_workers.check_staged_ops(out, expect_staging="cuda", expect_device="cuda")
    assert any(s.name.endswith("· to GPU") for s in out.timeline)


def _strategies(devs):
    out = parlab.launch(gpu_workers.strategies_with_placement, 4, args=(gpu_workers.PAIR_NAMES,),
                        devices=devs, timeout=300)
    library = {"dtensor"} if devs.shared else set()   # DTensor runs on the CPU when ranks share a GPU
    for r in out.results:
        assert r["device"].startswith("cuda:"), r["device"]
        for name, peak in r["cuda_peak"].items():
            run = r["runs"][name]
            if name in library or (isinstance(run, dict) and run.get("role") == "server"):
                continue          # a parameter server keeps its shard in host memory
            assert peak > 0, f"{name} allocated nothing on {r['device']}: it ran on the CPU"
    return gpu_workers.by_pair(out, gpu_workers.PAIR_NAMES)


def test_every_strategy_on_ranks_sharing_one_gpu_equals_one_device():
    pairs = _strategies(parlab.devices(4, mode="shared-gpu"))
    gpu_workers.check_pairs_equal_references(pairs, tol=GPU_TOL)


@pytest.mark.skipif(GPUS < 4, reason=f"multi-GPU NCCL needs 4 GPUs, {GPUS} visible")
def test_every_strategy_on_four_gpus_over_nccl_equals_one_device():
    devs = parlab.devices(4, mode="gpu")
    assert devs.backend == "nccl"
    gpu_workers.check_pairs_equal_references(_strategies(devs), tol=GPU_TOL)


def test_gpu_memory_measured_against_computed():
    from torch import nn

    from parlab.torch import memory
    device = torch.device("cuda", 0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 10)).to(device)
    x = torch.randn(512, 1024, device=device)
    y = torch.randint(0, 10, (512,), device=device)
    want = memory.estimate(model, x, optimizer_slots=2)
    got = memory.measure(model, torch.optim.Adam(model.parameters()), nn.CrossEntropyLoss(), x, y)
    for key in ("parameters", "gradients", "optimizer state"):
        assert got[key] == want[key], key
    peak = got["GPU allocator peak above the step's start"]
    # the first step creates the gradients and Adam's two moments; the allocator's peak
    # holds at least those, and not much more than everything the step computed
    assert peak >= want["gradients"] + want["optimizer state"]
    assert peak <= 2 * sum(want.values()) + 64 * 2**20, (peak, want)


def test_bench_gpu_lines_run():
    from parlab.bench import labs as bench
    lines = bench.gpu_lines(steps=20)
    assert lines and not any("no GPU" in line for line in lines), lines


def test_zero_stages_and_fsdp2_on_ranks_sharing_one_gpu_equal_one_device():
    from parlab.experiments import run_zero
    from parlab.metrics import max_difference
    from parlab.torch import zero
    run = run_zero(devices=parlab.devices(4, mode="shared-gpu"), steps=3)
    reference = zero.train_reference(steps=3)
    for v in zero.VARIANTS:      # FSDP2 runs on the CPU there (runtime.library_device)
        assert max(max_difference(r[v]["state"], reference["state"]) for r in run.results) < GPU_TOL, v
