import subprocess
import sys

import parlab
from parlab import metrics
from parlab.torch import bandwidth


def test_sweep_measures_every_size_and_op(no_leftover_ranks):
    # The largest message must be big enough that its transfer time is far above the
    # scheduling noise of a shared 2-core machine: a 4-byte median once read 1.1 ms
    # under load, longer than a 1 MiB transfer. 16 MiB takes several milliseconds.
    sizes = [4, 4096, 2**24]
    out = parlab.launch(bandwidth.sweep, 2, args=(sizes, ("send_recv", "all_reduce")))
    records, other = out.results
    assert other == []
    assert [(r["op"], r["bytes"]) for r in records] == [
        (op, s) for op in ("send_recv", "all_reduce") for s in sizes]
    assert all(r["seconds"] > 0 and r["repeats"] >= 3 for r in records)
    # bigger messages take longer: the bandwidth term is real
    for op in ("send_recv", "all_reduce"):
        times = [r["seconds"] for r in records if r["op"] == op]
        assert times[-1] > times[0]
    fit = metrics.fit_link([r["bytes"] for r in records if r["op"] == "send_recv"],
                           [r["seconds"] for r in records if r["op"] == "send_recv"])
    assert fit.bandwidth_Bps > 0
    assert {s.name for s in out.timeline} >= {"send", "recv", "all_reduce", "barrier"}


def test_default_sizes_and_repeats():
    sizes = bandwidth.default_sizes(2**20)
    assert sizes[0] == 4 and sizes[-1] == 2**20 and all(b == 4 * a for a, b in zip(sizes, sizes[1:]))
    assert bandwidth.repeats_for(4) == 40 and bandwidth.repeats_for(2**30) == 3


def test_bench_command_prints_measured_ratios():
    # One benchmark end to end through the command (every benchmark in quick mode takes
    # minutes: `make bench` is for people, not for CI); the others must all be registered.
    out = subprocess.run([sys.executable, "-m", "parlab", "bench", "--quick", "--only",
                          "tracing_overhead"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tracing overhead, wall clock:" in out.stdout
    assert "one span costs" in out.stdout
    from parlab import bench
    assert {"tracing_overhead", "manual_split", "vertical_slicing", "pipeline_bubble",
            "data_parallel", "parameter_server", "hybrid"} <= set(bench.BENCHMARKS)
    wrong = subprocess.run([sys.executable, "-m", "parlab", "bench", "--only", "nope"],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "unknown benchmark 'nope'" in wrong.stdout
