"""Runs of the mixture of experts a lab shows: the balance loss flattening the experts'
histogram over training, capacity against dropped assignments, and expert × data
parallelism on a 2 × 2 mesh, equal to one device and moving the formula's bytes per axis."""
import numpy as np
import pytest
from batched import launch_each
from conftest import rank_processes

from parlab.torch import moe
from parlab.torch import moe_runs as runs

TOL = 1e-5
CFG, BATCH, STEPS, LR = moe.MoEConfig(), 64, 3, 0.1


def _late_imbalance(run, last=10):
    return float(np.mean(run["imbalance"][-last:]))


def test_the_balance_loss_flattens_the_experts_histogram():
    out = runs.balance_over_training(seed=0)
    plain, balanced = out[0.0], out[0.1]
    assert len(plain["per_expert"]) == len(balanced["imbalance"]) == 100
    assert all(sum(h) == BATCH * CFG.top_k for h in plain["per_expert"])
    # measured over seeds 0-2 (docs/moe.md): the busiest expert 2.42-3.99x the mean
    # without the loss, 1.43-1.50x with it, over the last 10 steps
    assert _late_imbalance(plain) > 1.5 * _late_imbalance(balanced)
    assert _late_imbalance(balanced) < 1.8
    assert min(plain["per_expert"][-1]) == 0 < min(balanced["per_expert"][-1])
    assert np.mean(balanced["balance_loss"][-10:]) < np.mean(plain["balance_loss"][-10:])
    for run in (plain, balanced):               # both still learn the digits
        assert run["test_accuracy"] > 0.8 > 4 * out["baseline"]
        assert run["task_loss"][-1] < run["task_loss"][0]


def test_a_larger_capacity_drops_fewer_assignments_and_none_drops_nothing():
    rows = runs.capacity_sweep(train_steps=30, timed_steps=1)
    assert [r["capacity_factor"] for r in rows] == [None, 2.0, 1.5, 1.25, 1.0, 0.75, 0.5]
    assert rows[0]["dropped_share"] == 0 and rows[0]["capacity"] is None
    dropped = [r["dropped_share"] for r in rows[1:]]
    assert dropped == sorted(dropped) and dropped[-1] > dropped[0]
    assert [r["capacity"] for r in rows[1:]] == [32, 24, 20, 16, 12, 8]
    assert rows[-1]["test_loss"] > rows[0]["test_loss"]     # dropping half loses information
    assert all(r["step_s"] > 0 for r in rows)               # timings: read, never compared


@pytest.fixture(scope="module")
def ep_dp():
    run = launch_each({"ep_dp": (runs.train_ep_dp, (CFG, BATCH, STEPS, LR, 0, 2, 2))}, 4)
    assert not rank_processes(), "ranks left running"
    return run["ep_dp"]


def test_ep_by_dp_trains_like_one_device(ep_dp):
    ref = moe.train_reference(CFG, BATCH, STEPS, lr=LR)
    for rank, res in enumerate(ep_dp.results):
        assert res["coords"] == {"dp": rank // 2, "ep": rank % 2}
        np.testing.assert_allclose(res["losses"], ref["losses"], atol=TOL)
        assert res["per_expert"] == ref["per_expert"]
        mine = tuple(f"moe.experts.{e}." for e in range(4 * (rank % 2), 4 * (rank % 2) + 4))
        held = {k for k in ref["weights"] if not k.startswith("moe.experts.") or k.startswith(mine)}
        assert set(res["weights"]) == held
        for name, w in res["weights"].items():
            np.testing.assert_allclose(w, ref["weights"][name], atol=TOL,
                                       err_msg=f"rank {rank}: {name} after {STEPS} steps")
        for name, grad in res["first_grads"].items():
            # an expert no token reached has no gradient on one device: zero here
            want = ref["first_grads"].get(name, np.zeros_like(grad))
            np.testing.assert_allclose(grad, want, atol=TOL, err_msg=f"rank {rank}: {name}")
    for step in range(STEPS):     # the ranks' own routings add up to the whole batch's
        whole = np.sum([res["routing"][step] for res in ep_dp.results], axis=0)
        assert whole.tolist() == ref["per_expert"][step]


def test_ep_by_dp_bytes_per_axis_follow_the_formula(ep_dp):
    for rank in range(4):
        want = {}
        for step in range(STEPS):
            routing = [res["routing"][step] for res in ep_dp.results]
            for axis, b in runs.expected_bytes_per_axis(CFG, routing, rank).items():
                want[axis] = want.get(axis, 0) + b
        got = {a: b for a, b in ep_dp.timeline.bytes_by_axis(rank).items() if b}
        assert got == want, f"rank {rank}"
    per_step = runs.expected_bytes_per_axis(CFG, [res["routing"][0] for res in ep_dp.results], 0)
    assert per_step["dp"] == 4 * 4 * (2 * 128 * 256 + 256 + 128)      # 4 experts' gradients
    assert per_step["world"] == 4 * (65 * 128 + 128 * 8 + 129 * 10) + 8 * 8 + 4 * 8 + 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(world_size=3), r"ep × dp must equal the number of ranks: ep=2 × dp=2 = 4, but 3 "
                         r"ranks run"),
    (dict(cfg=moe.MoEConfig(experts=6), ep=4, dp=1, world_size=4),
     r"6 experts do not split over ep=4 ranks: use ep in \[1, 2, 3, 6\]"),
    (dict(batch_size=66), r"a batch of 66 does not split over 4 ranks"),
    (dict(cfg=moe.MoEConfig(capacity_factor=1.0)), r"set MoEConfig\(capacity_factor=None\)"),
])
def test_bad_meshes_say_what_to_change_before_any_group_is_built(kwargs, message):
    args = dict(cfg=CFG, batch_size=BATCH, ep=2, dp=2, world_size=4) | kwargs
    world_size = args.pop("world_size")
    with pytest.raises(ValueError, match=message):        # no process group exists here
        runs.train_ep_dp(0, world_size, **args)
    with pytest.raises(ValueError, match=message):
        runs.check_ep_dp(args["cfg"], world_size, args["batch_size"], args["ep"], args["dp"])


def test_bad_sweeps_and_routings_are_refused():
    with pytest.raises(ValueError, match="capacity factors must be positive or None"):
        runs.capacity_sweep(factors=(1.0, 0.0))
    with pytest.raises(ValueError, match=r"routing must give 4 ranks' counts \(ep=2 × dp=2\)"):
        runs.expected_bytes_per_axis(CFG, [[16] * 8], 0)
    with pytest.raises(ValueError, match="balance_weights must not be negative"):
        runs.balance_over_training(balance_weights=(-0.1,), steps=1)
