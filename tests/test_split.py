"""Manual split: equivalence with one device, the balancer, merging, bad splits."""
import itertools

import numpy as np
import pytest
import torch
from batched import launch_by_size

import parlab
from parlab.split import SplitConfig, balance, check_bounds, imbalance, stage_costs
from parlab.torch import split

TOL = 1e-5  # float32; the split runs the same operations in the same order as one device
# Adam divides each update by the gradient's own running magnitude, so on components whose
# gradient is near zero it amplifies float32 rounding (which varies with the reference's
# thread count, i.e. with machine load): seen 1.2e-5 after 6 steps under load.
TOL_ADAM = 1e-4


def _merged(results):
    return {k: v for r in results for k, v in r["state"].items()}


SPLITS = [(2, [4], "sgd"), (4, [2, 4, 6], "adam"), (4, [1, 3, 5], "sgd")]


def _split_cfg(bounds, opt):
    return SplitConfig(bounds=bounds, steps=6, optimizer=opt, lr=1e-2 if opt == "adam" else 0.1)


@pytest.fixture(scope="module")
def runs():
    """The equivalence and memory runs of this module: one launch per number of devices."""
    calls = {}
    for n, bounds, opt in SPLITS:
        calls.setdefault(n, {})[("split", tuple(bounds), opt)] = (split.train_split,
                                                                   (_split_cfg(bounds, opt),))
    for n in (1, 2):
        bounds = split.split_by_params(split.build(SplitConfig(steps=1)), n) if n > 1 else []
        calls.setdefault(n, {})[("memory", n)] = (split.train_split,
                                                  (SplitConfig(bounds=bounds, steps=1),))
    return launch_by_size(calls)


@pytest.mark.parametrize("n,bounds,opt", SPLITS)
def test_split_training_equals_single_device(n, bounds, opt, runs):
    cfg = _split_cfg(bounds, opt)
    ref = split.train_reference(cfg)
    out = runs[("split", tuple(bounds), opt)]
    np.testing.assert_allclose(out.results[-1]["first_logits"], ref["first_logits"], atol=TOL)
    grads = {k: v for r in out.results for k, v in r["first_grads"].items()}
    assert grads.keys() == ref["first_grads"].keys()
    for k in grads:
        np.testing.assert_allclose(grads[k], ref["first_grads"][k], atol=TOL, err_msg=k)
    state = _merged(out.results)
    tol = TOL_ADAM if opt == "adam" else TOL
    for k, v in ref["state"].items():
        np.testing.assert_allclose(state[k], v, atol=tol, err_msg=k)
    np.testing.assert_allclose(out.results[-1]["losses"], ref["losses"], atol=tol)
    merged = split.merge(cfg, out.results)
    x = torch.as_tensor(parlab.data.digits("test")[0][:16])
    ref_model = split.build(cfg)
    ref_model.load_state_dict({k: torch.as_tensor(v) for k, v in ref["state"].items()})
    torch.testing.assert_close(merged(x), ref_model(x), atol=tol, rtol=0)


def test_memory_per_device_falls_with_more_devices(runs):
    peak = {n: max(sum(r["memory"].values()) for r in runs[("memory", n)].results)
            for n in (1, 2)}
    assert peak[2] < 0.8 * peak[1], peak


def test_the_balancer_splits_uneven_layers_unlike_the_parameter_split(no_leftover_ranks):
    cfg = SplitConfig(model="conv_stack", width=32, steps=20)
    model = split.build(cfg)
    torch.set_num_threads(1)
    try:
        times = split.layer_times(model, torch.zeros(split.input_shape(cfg)))
    finally:
        torch.set_num_threads(parlab.hardware.cpu_count())
    naive, balanced = split.split_by_params(model, 2), balance(times, 2)
    assert naive != balanced
    # on the layer times it was given, the balancer's split is the more even one
    assert imbalance(times, balanced) < imbalance(times, naive), (times, naive, balanced)
    # Both train on 2 ranks. Which runs more evenly is a ratio of two launches' timings
    # (busiest/mean compute: 1.61-1.75 against 1.10-1.32, quiet and beside 3 busy loops),
    # which other processes move: `python -m parlab bench --only manual_split` prints it.
    for bounds in (naive, balanced):
        out = parlab.launch(split.train_split, 2,
                            args=(SplitConfig(**{**cfg.__dict__, "bounds": bounds}),))
        assert all(out.timeline.seconds_by_kind(r)["compute"] > 0 for r in (0, 1)), bounds


def test_balance_is_optimal_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(30):
        costs = list(rng.integers(1, 20, rng.integers(3, 9)))
        n = int(rng.integers(2, min(4, len(costs)) + 1))
        best = min(max(stage_costs(costs, list(b)))
                   for b in itertools.combinations(range(1, len(costs)), n - 1))
        got = balance(costs, n)
        assert len(got) == n - 1 and max(stage_costs(costs, got)) == best
    assert balance([1, 1, 1, 10, 1, 1], 2) == [3]
    assert imbalance([1, 1], [1]) == 1.0
    with pytest.raises(ValueError, match="between 1 and 3"):
        balance([1, 2, 3], 4)


@pytest.mark.parametrize("bounds,n,match", [([4], 3, "3 devices need 2"), ([4, 2], 3, "rise strictly"),
                                            ([0], 2, "rise strictly"), ([7], 2, "rise strictly")])
def test_bad_splits_are_refused_with_what_to_change(bounds, n, match):
    with pytest.raises(ValueError, match=match):
        check_bounds(bounds, 7, n)


def test_a_split_for_the_wrong_number_of_ranks_fails_fast_and_clearly(no_leftover_ranks):
    with pytest.raises(parlab.WorkerError, match="4 devices need 3 split points"):
        parlab.launch(split.train_split, 4, args=(SplitConfig(bounds=[4], steps=1),), timeout=60)


def test_placed_sequential_computes_the_same_as_the_model():
    cfg = SplitConfig()
    placed = split.PlacedSequential(split.segments(split.build(cfg), [2, 4]), ["cpu"] * 3)
    x = torch.randn(4, 64)
    torch.testing.assert_close(placed(x), split.build(cfg)(x))
    with pytest.raises(ValueError, match="3 segments but 2 devices"):
        split.PlacedSequential(split.segments(split.build(cfg), [2, 4]), ["cpu"] * 2)


def test_config_refuses_unknown_models():
    with pytest.raises(ValueError, match="model must be"):
        SplitConfig(model="transformer")
