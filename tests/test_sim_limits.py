"""The cost model refuses sizes past what its timelines draw, at once, naming the limit
and the summary model; the balancer cuts thousands of layers in well under a second.

Before: 10,000 data-parallel ranks took 25-37 s and 3.7 GB (a million exhausted memory),
single_device(steps=10**6) and predict on a million-layer network ran past a minute, and a
pipeline over 8,000 layers spent 86 s in the balancer (it tried every cut).
"""
import math
import time

import numpy as np
import pytest

from parlab import sim
from parlab.sim import limits
from parlab.split import balance, stage_costs

NET = sim.Network.mlp((64, 256, 256, 128, 10))


def _refused_at_once(call, match):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        call()
    assert time.perf_counter() - start < 2.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call,match", [
    (lambda: sim.data_parallel(NET, sim.h100_infiniband(1250), 40_000, devices=10_000),
     r"data_parallel: devices makes 10,000 ranks; a timeline draws at most 64"),
    (lambda: sim.data_parallel(NET, sim.h100_infiniband(9), 260, devices=65),
     r"data_parallel: devices makes 65 ranks"),
    (lambda: sim.hybrid(NET, sim.h100_infiniband(16), 512, dp=32, tp=2, pp=2),
     r"hybrid: dp × tp × pp = 32 × 2 × 2 makes 128 ranks"),
    (lambda: sim.tensor_parallel(NET, sim.h100_infiniband(16), 64, devices=128),
     r"tensor_parallel: devices makes 128"),
    (lambda: sim.parameter_server(NET, sim.h100_infiniband(16), 64 * 64, workers=64),
     r"parameter_server: workers=64 and the server makes 65 ranks"),
])
def test_a_timeline_of_more_ranks_than_it_draws_is_refused_naming_the_summary_model(call, match):
    _refused_at_once(call, match + r".*sim\.predict\(sim\.Workload\.of\(net\)")


def test_the_largest_timeline_still_draws():
    tl = sim.data_parallel(NET, sim.h100_infiniband(8), 256, devices=limits.MAX_RANKS)
    assert len(tl.ranks) >= limits.MAX_RANKS and math.isfinite(tl.step_s)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call,match", [
    (lambda: sim.single_device(NET, sim.h100_nvlink(), 64, steps=10**6),
     r"timeline: steps=1000000 × micro_batches=1 × 4 layers .* 9,000,000 operations"),
    (lambda: sim.pipeline(NET, sim.h100_nvlink(), 2**16, stages=2, micro_batches=2**15),
     r"micro_batches=32768"),
    (lambda: sim.parameter_server(NET, sim.h100_nvlink(), 64, mode="async", steps=10**6),
     r"parameter_server: steps=1000000 × workers=2 make at least 12,000,000 operations"),
])
def test_steps_and_micro_batches_past_the_engines_budget_are_refused_before_running(call, match):
    _refused_at_once(call, match + r".*at most 100,000.*sim\.predict")


@pytest.mark.timeout(60)
def test_a_network_past_the_layer_limit_is_refused_before_it_is_built():
    _refused_at_once(lambda: sim.Network.mlp((8,) * (10**6 + 1)),
                     r"Network\.mlp: sizes gives 1,000,000 layers; .* at most 10,000")
    _refused_at_once(lambda: sim.Network.transformer("deep", 10**6, 64, 4, 16),
                     r"Network 'deep': layers gives 1,000,000 layers")
    many = (NET.layers[0],) * (limits.MAX_LAYERS + 1)
    _refused_at_once(lambda: sim.Network("n", many, 64), r"Network 'n': layers gives 10,001")
    assert len(sim.Network("n", many[:-1], 64)) == limits.MAX_LAYERS


def test_the_summary_model_still_prices_thousands_of_gpus():
    w = sim.Workload.transformer("GPT-3", 96, 12288, 96, 2048)
    c = sim.h100_nodes(1024)
    p = sim.predict(w, c, sim.Plan(dp=64, pp=16, tp=8, micro_batches=24), 1536)
    assert p.plan.devices == 8192 and math.isfinite(p.step_s) and p.step_s > 0


# ------------------------------------------------------------------ the balancer
def _every_cut(costs, n_devices):
    """The dynamic programme as it was (every j tried): the cuts the fast one must match."""
    n = len(costs)
    prefix = np.concatenate([[0.0], np.cumsum([float(c) for c in costs])])
    best = [[math.inf] * (n + 1) for _ in range(n_devices + 1)]
    cut = [[0] * (n + 1) for _ in range(n_devices + 1)]
    best[0][0] = 0.0
    for k in range(1, n_devices + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                c = max(best[k - 1][j], prefix[i] - prefix[j])
                if c < best[k][i]:
                    best[k][i], cut[k][i] = c, j
    bounds, i = [], n
    for k in range(n_devices, 1, -1):
        i = cut[k][i]
        bounds.append(i)
    return sorted(bounds)


def test_balance_cuts_where_trying_every_cut_did_ties_and_free_layers_included():
    rng = np.random.default_rng(0)
    for trial in range(600):
        n = int(rng.integers(1, 25))
        costs = [list(rng.integers(0, 4, n)),          # ties and layers that cost nothing
                 list(rng.random(n)),
                 [1.0] * n,
                 list(np.round(rng.random(n) * 10, 1))][trial % 4]
        k = int(rng.integers(1, n + 1))
        got = balance(costs, k)
        assert got == _every_cut(costs, k), (costs, k)
        assert all(type(b) is int for b in got)


@pytest.mark.timeout(30)
def test_balance_cuts_8000_layers_into_64_stages_well_under_a_second():
    costs = list(np.random.default_rng(1).random(8000))
    start = time.process_time()     # CPU time: other processes on the machine do not add
    bounds = balance(costs, 64)
    assert time.process_time() - start < 1.0
    assert max(stage_costs(costs, bounds)) <= sum(costs) / 64 + max(costs)


@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf])
def test_balance_refuses_a_cost_that_does_not_add_up(bad):
    with pytest.raises(ValueError, match=rf"costs\[1\] must be a finite number 0 or more"):
        balance([1.0, bad, 2.0], 2)
