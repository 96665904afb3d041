import numpy as np
import pytest

from parlab import metrics


def test_bus_factors_follow_nccl_tests_conventions():
    assert metrics.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert metrics.bus_factor("all_reduce", 1) == 0
    assert metrics.bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert metrics.bus_factor("send_recv", 2) == 1
    with pytest.raises(ValueError, match="known"):
        metrics.bus_factor("gossip", 2)
    assert metrics.ring_allreduce_bytes_per_rank(1000, 2) == 1000


def test_link_fit_recovers_latency_and_bandwidth():
    sizes = np.array([4, 64, 1024, 2**16, 2**20, 2**24], dtype=float)
    secs = 20e-6 + sizes / 3e9
    fit = metrics.fit_link(sizes, secs)
    assert fit.latency_s == pytest.approx(20e-6, rel=1e-3)
    assert fit.bandwidth_Bps == pytest.approx(3e9, rel=1e-3)
    assert "GB/s" in str(fit)
    with pytest.raises(ValueError):
        metrics.fit_link([4], [1e-5])


def test_speedup_efficiency_bubble():
    assert metrics.speedup(2.0, 1.0) == 2.0
    assert metrics.efficiency(2.0, 1.0, 4) == 0.5
    assert metrics.pipeline_bubble(4, 8) == pytest.approx(3 / 11)
    with pytest.raises(ValueError):
        metrics.pipeline_bubble(0, 1)


def test_the_largest_difference_over_pairs_is_what_max_difference_reads_by_name():
    from parlab.metrics import largest_difference, max_difference
    a, b = {"w": [1.0, 2.0], "b": [0.0]}, {"w": [1.0, 2.5], "b": [-0.25]}
    assert largest_difference([(a["w"], b["w"]), (a["b"], b["b"])]) == 0.5
    assert max_difference(a, b) == 0.5 and max_difference(a, b, keys=["b"]) == 0.25
    assert largest_difference([]) == 0.0
