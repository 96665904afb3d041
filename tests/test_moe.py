"""A mixture of experts: routing, capacity and the balance loss on one device, and expert
parallelism over the traced all-to-all, equal to one device."""
import numpy as np
import pytest
import torch
from batched import launch_each
from conftest import rank_processes

from parlab.torch import moe
from parlab.torch import tensor_parallel as tp

TOL = 1e-5
CFG, BATCH, STEPS = moe.MoEConfig(), 64, 3


@pytest.fixture(scope="module")
def runs():
    out = {n: launch_each({"ep": (moe.train_ep, (CFG, BATCH, STEPS))}, n)["ep"] for n in (2, 4)}
    assert not rank_processes(), "ranks left running"
    return out


@pytest.fixture(scope="module")
def reference():
    return moe.train_reference(CFG, BATCH, STEPS)


@pytest.mark.parametrize("world_size", [2, 4])
def test_expert_parallel_trains_like_one_device(world_size, runs, reference):
    local = CFG.experts // world_size
    for r, res in enumerate(runs[world_size].results):
        np.testing.assert_allclose(res["losses"], reference["losses"], atol=TOL)
        assert res["per_expert"] == reference["per_expert"]
        mine = {f"moe.experts.{e}." for e in range(r * local, (r + 1) * local)}
        held = {k for k in reference["weights"]
                if not k.startswith("moe.experts.") or k.startswith(tuple(mine))}
        assert set(res["weights"]) == held
        assert set(res["first_grads"]) == held & set(reference["first_grads"])
        for name, grad in res["first_grads"].items():
            np.testing.assert_allclose(grad, reference["first_grads"][name], atol=TOL,
                                       err_msg=f"rank {r}: gradient of {name}")
        for name, w in res["weights"].items():
            np.testing.assert_allclose(w, reference["weights"][name], atol=TOL,
                                       err_msg=f"rank {r}: {name} after {STEPS} steps")


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_to_all_bytes_follow_the_routing(world_size, runs):
    run = runs[world_size]
    for r, res in enumerate(run.results):
        want = sum(moe.expected_all_to_all_bytes(CFG, BATCH // world_size, counts, r,
                                                 world_size) for counts in res["per_expert"])
        got = sum(s.bytes for s in run.timeline.spans
                  if s.rank == r and s.name.startswith("all_to_all"))
        assert got == want, f"rank {r}"


def test_capacity_keeps_first_choices_before_second_ones():
    experts_of = torch.tensor([[0, 1], [0, 2], [0, 1]])
    kept = moe.kept_assignments(experts_of, 3, capacity=2)
    assert kept.tolist() == [[True, True], [True, True], [False, True]]
    assert moe.kept_assignments(experts_of, 3, None).all()


def test_a_small_capacity_drops_tokens_on_one_device():
    full = moe.build(CFG).moe
    tight = moe.build(moe.MoEConfig(capacity_factor=0.5)).moe
    x = torch.randn(64, CFG.d_model, generator=torch.Generator().manual_seed(0))
    assert full(x)[2].sum() == 64 * CFG.top_k
    assert tight(x)[2].max() <= tight.capacity(64) == 8
    assert tight(x)[2].sum() < 64 * CFG.top_k


def test_the_balance_loss_is_one_when_the_router_spreads_evenly():
    experts = 4
    even = torch.full((8, experts), 1 / experts)
    assert moe.balance_loss(even, (torch.arange(8) % experts).reshape(8, 1), experts) \
        == pytest.approx(1.0)
    skewed = torch.tensor([[0.7, 0.1, 0.1, 0.1]] * 8)
    assert moe.balance_loss(skewed, torch.zeros(8, 1, dtype=torch.long), experts) \
        == pytest.approx(4 * 0.7)


def test_bad_settings_say_what_to_change():
    with pytest.raises(ValueError, match="applies no capacity: set MoEConfig\\(capacity_factor=None\\)"):
        moe.ExpertParallelMoE(moe.build(moe.MoEConfig(capacity_factor=1.0)).moe, tp.layout(2))
    with pytest.raises(ValueError, match="top_k must be between 1 and experts \\(8\\), got 9"):
        moe.MoEConfig(top_k=9)
    with pytest.raises(ValueError, match="the experts has 8 units, which do not split evenly "
                                         "over 3 devices"):
        moe.ExpertParallelMoE(moe.build(CFG).moe, tp.layout(3))


def test_a_rank_whose_experts_get_no_tokens_still_takes_part():
    import torch.nn.functional as F
    import workers

    import parlab
    from parlab.torch import training
    out = parlab.launch(workers.moe_starved_rank, 2, timeout=60)
    dense = moe.build(CFG)
    workers.starve(dense.moe.router, CFG.experts // 2)
    x, y = training.on_device(*next(training.digit_batches("mlp", BATCH)), "cpu")
    logits, aux, _ = dense(x)
    (F.cross_entropy(logits, y) + CFG.aux_weight * aux).backward()
    assert all(sum(r["per_expert"][4:]) == 0 for r in out.results)
    for r in out.results:
        np.testing.assert_allclose(r["router_grad"], dense.moe.router.weight.grad, atol=TOL)


def test_the_router_learns_from_the_task_with_one_expert_a_token():
    model = moe.build(moe.MoEConfig(top_k=1, aux_weight=0.0))
    x = torch.rand(16, CFG.d_in, generator=torch.Generator().manual_seed(0))
    logits, _, _ = model(x)
    logits.sum().backward()
    assert model.moe.router.weight.grad.abs().max() > 1e-4
