"""Expert parallelism in the cost model (``sim.experts``): the all-to-all's price, an MoE
layer's bytes per rank against the course's traced formula, and the published rows."""
import math

import pytest
import torch

from parlab import sim
from parlab.sim import collectives, experts
from parlab.torch import moe

LAYER = experts.moe_layer("test", 1024, 512, 2048, 8, 2, gated=True)


def test_all_to_all_on_one_link_is_pairwise_exchange():
    link = sim.Link(1e-5, 1e9)
    # 3 steps of alpha, and 3/4 of 4 MB leaving the rank at 1 GB/s
    assert collectives.all_to_all_s(4e6, 4, link) == pytest.approx(3e-5 + 3e-3)
    assert collectives.all_to_all_s(4e6, 1, link) == 0.0


def test_all_to_all_across_nodes_is_paced_by_the_network_share():
    cluster = sim.h100_infiniband(2)
    nbytes, n = 16e6, 16                    # 8 members a node: 7 peers inside, 8 outside
    inside = 7 * (cluster.intra.latency_s + nbytes / n / cluster.intra.bandwidth_Bps)
    across = 8 * (cluster.inter.latency_s + nbytes / n / cluster.inter.bandwidth_Bps)
    assert across > inside
    assert collectives.all_to_all_time(cluster, nbytes, n) == pytest.approx(across)
    one_node = collectives.all_to_all_time(cluster, nbytes, 8)
    assert one_node == pytest.approx(collectives.all_to_all_s(nbytes, 8, cluster.intra))


def test_layer_counts_parameters_and_flops():
    d, f, e, k, t = 512, 2048, 8, 2, 1024
    assert LAYER.params == d * e + e * 3 * d * f
    assert LAYER.rows == t * k
    assert LAYER.forward_flops == 2 * t * d * e + 2 * t * k * 3 * d * f
    capped = experts.moe_layer("capped", t, d, f, e, k, capacity_factor=1.25)
    assert capped.rows == e * math.ceil(1.25 * t * k / e)
    assert "PREDICTED" in str(LAYER)


def test_one_rank_sends_nothing():
    out = experts.expert_parallel(LAYER, 1, cluster=sim.h100_nvlink())
    assert out["bytes"]["all_to_all"] == out["sent"]["all_to_all"] == 0
    assert out["seconds"]["all_to_all"] == 0
    assert out["step_s"] == pytest.approx(out["seconds"]["compute"])
    assert out["experts_per_rank"] == 8


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_bytes_leaving_a_rank_scale_as_ep_minus_one_over_ep(ep):
    out = experts.expert_parallel(LAYER, ep, cluster=sim.h100_nvlink())
    handed = 4 * LAYER.tokens * LAYER.top_k * LAYER.d_model * LAYER.act_bytes
    assert out["bytes"]["all_to_all"] == handed           # the same whatever ep
    assert out["sent"]["all_to_all"] == pytest.approx(handed * (ep - 1) / ep)
    assert out["experts_per_rank"] == 8 // ep
    assert out["params"] == LAYER.router_params + 8 // ep * LAYER.expert_params
    assert out["seconds"]["all_to_all"] > 0
    assert "PREDICTED" in out["memory"].device


def _seeded_routing(cfg, tokens, seed=0):
    """Assignments per expert for ``tokens`` random inputs through the course's router."""
    model = moe.build(cfg, seed)
    x = torch.randn(tokens, cfg.d_model, generator=torch.Generator().manual_seed(seed))
    _, _, experts_of = moe.route(model.moe.router, x, cfg.top_k)
    return torch.bincount(experts_of.reshape(-1), minlength=cfg.experts).tolist()


@pytest.mark.parametrize("world_size", [2, 4])
def test_traced_bytes_equal_the_course_formula(world_size):
    cfg, batch = moe.MoEConfig(), 64
    per_expert = _seeded_routing(cfg, batch)
    assert len(set(per_expert)) > 1                       # uneven: a real test of the ranks
    here = batch // world_size
    for rank in range(world_size):
        want = moe.expected_all_to_all_bytes(cfg, here, per_expert, rank, world_size)
        got = experts.traced_all_to_all_bytes(per_expert, rank, world_size, tokens=here,
                                              d_model=cfg.d_model, top_k=cfg.top_k)
        assert got == want


def test_the_balanced_prediction_is_the_course_formula_under_balanced_routing():
    cfg, ep, here = moe.MoEConfig(), 4, 16
    balanced = [here * cfg.top_k * ep // cfg.experts] * cfg.experts
    layer = experts.moe_layer("course", here, cfg.d_model, cfg.d_ff, cfg.experts, cfg.top_k,
                              act_bytes=4, bias=True)
    predicted = experts.all_to_all_bytes(layer, ep)
    course = moe.expected_all_to_all_bytes(cfg, here, balanced, 0, ep)
    assert predicted["all_to_all"] + predicted["routing"] == course
    course_model = sum(p.numel() for p in moe.build(cfg).moe.parameters())
    assert layer.params == course_model


def test_published_rows_are_present_labelled_and_finite():
    rows = experts.published_moe_rows()
    assert {r.id for r in rows} >= {"deepseek-v3", "mixtral-8x22b", "qwen2-57b-a14b"}
    for row in rows:
        numbers = (row.all_to_all_gb, row.sent_gb, row.nvlink_s, row.as_run_s,
                   row.infiniband_s, row.compute_s, row.step_s, row.states_gb,
                   row.predicted, row.published, row.ratio)
        assert all(math.isfinite(x) and x > 0 for x in numbers)
        assert row.nvlink_s <= row.as_run_s <= row.infiniband_s
        assert "PREDICTED" in str(row) and "ratio" in str(row)
    text = "\n".join(experts.lines())
    assert "PREDICTED" in text and "arXiv:2412.19437" in text
    deepseek = next(r for r in rows if r.id == "deepseek-v3")
    assert deepseek.layout.startswith("EP64") and deepseek.states_gb < 80


def test_published_counts_match_the_stated_sizes():
    runs = {r.id: r for r in experts.published_runs()}
    total, active, _ = experts.model_params(runs["qwen2-57b-a14b"])
    assert total == pytest.approx(57e9, rel=0.02) and active == pytest.approx(14e9, rel=0.05)
    total, active, _ = experts.model_params(runs["mixtral-8x22b"])
    assert total == pytest.approx(141e9, rel=0.02) and active == pytest.approx(39e9, rel=0.02)


@pytest.mark.parametrize("call, words", [
    (lambda: experts.moe_layer("x", 16, 8, 8, 4, 5), "top_k must be at most experts"),
    (lambda: experts.moe_layer("x", 0, 8, 8, 4, 1), "tokens"),
    (lambda: experts.moe_layer("x", 16, 8, 8, 4, 1, capacity_factor=0), "capacity_factor"),
    (lambda: experts.expert_parallel(LAYER, 3, cluster=sim.h100_nvlink()), "ep=3 must divide"),
    (lambda: experts.expert_parallel(LAYER, 8, dp=2, cluster=sim.h100_nvlink()),
     "do not fit"),
    (lambda: experts.expert_parallel(LAYER, 2, cluster="h100"), "sim Cluster"),
    (lambda: experts.traced_all_to_all_bytes([1, 2, 3], 0, 2, tokens=4, d_model=8, top_k=1),
     "ep=2 must divide"),
    (lambda: experts.traced_all_to_all_bytes([1, 2], 2, 2, tokens=4, d_model=8, top_k=1),
     "rank must be below"),
    (lambda: collectives.all_to_all_s(-1.0, 2, sim.Link(0, 1e9)), "nbytes"),
])
def test_bad_input_says_what_to_change(call, words):
    with pytest.raises(ValueError, match=words):
        call()
