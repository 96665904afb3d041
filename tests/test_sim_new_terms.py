"""The summary model's terms for FSDP layer by layer, context parallelism, expert
parallelism and Float8, each pinned on a case worked by hand (``sim.summary_terms``,
``sim.summary``, ``sim.blocks``, ``sim.costs``, ``sim.memory``)."""
from dataclasses import replace

import pytest

from parlab import sim
from parlab.sim import published_runs_sealed as sealed
from parlab.sim import validate
from parlab.sim.blocks import block
from parlab.sim.costs import CAST_BYTES, Roofline
from parlab.sim.gemm import pass_s
from parlab.sim.summary_terms import all_to_all_s, fsdp_exposed_s, ring_passes_s

ALPHA, BETA = 1e-6, 1e9                       # 1 us, 1 GB/s inside a node


def flat_cluster(devices: int = 8) -> sim.Cluster:
    """No matrix unit and no memory limit: a layer's products take FLOPs / 1e12 s."""
    link = sim.Link(ALPHA, BETA)
    return sim.Cluster("hand", devices, 80e9, 1e12, 0.0, 8, link, link)


FWD, BWD = [1.0] * 3, [2.0] * 3                 # three layers: 1 s forward, 2 s backward

# ------------------------------------------------------------------ FSDP, layer by layer
def test_fsdp_shows_each_pass_first_gather_and_the_last_scatter():
    # forward: gather 0 (0-0.5), layer 0 (0.5-1.5); gather 1 (0.5-1.0), layer 1 (1.5-2.5);
    # gather 2 waits for layer 0 to free its parameters (1.5-2.0), layer 2 (2.5-3.5).
    # backward: gather 2 again (3.5-4.0), layer 2 (4.0-6.0); gather 1 (4.0-4.5), layer 1
    # (6.0-8.0); scatter 2 (6.0-6.5), gather 0 (6.5-7.0), layer 0 (8.0-10.0); scatter 1
    # (8.0-8.5), scatter 0 (10.0-10.5). 10.5 s against 9 s of compute.
    assert fsdp_exposed_s(FWD, BWD, [0.5] * 3, [0.5] * 3) == \
        pytest.approx(1.5)


def test_fsdp_collectives_longer_than_the_compute_show_in_full():
    # gathers of 3 s, scatters of 1: forward gathers done at 3, 6, 9 s (layers end at 4,
    # 7, 10); backward gather 2 (10-13), layer 2 (13-15); gather 1 (13-16), layer 1
    # (16-18); scatter 2 (16-17), gather 0 (17-20), layer 0 (20-22); scatter 1 (20-21),
    # scatter 0 (22-23): 23 s against 9 s of compute
    assert fsdp_exposed_s(FWD, BWD, [3.0] * 3, [1.0] * 3) == \
        pytest.approx(23.0 - 9.0)


def test_hsdp_all_reduces_across_nodes_run_on_their_own_stream():
    # as the first case; each 3 s all-reduce follows its scatter: 6.5-9.5, 9.5-12.5,
    # 12.5-15.5
    assert fsdp_exposed_s(FWD, BWD, [0.5] * 3, [0.5] * 3,
                          [3.0] * 3) == pytest.approx(15.5 - 9.0)


def test_fsdp_pays_each_layers_collective_latency():
    """Per layer, not once a step: with nothing to hide behind, 2 gathers and a scatter per
    layer, each (n - 1) alpha + (n - 1)/n S / B."""
    net = sim.Network.decoder("d", 4, 256, 4, 16)
    c, n = replace(flat_cluster(64), devices_per_node=64), 64
    plan = sim.Plan(dp=n)
    got = sim.predict(sim.Workload.of(net), c, plan, n, zero=3, overlap_dp=True)
    per_layer = [(n - 1) * ALPHA + (n - 1) / n * x.params * b / BETA
                 for x in net.layers for b in (2, 2, 2)]
    compute = got.parts["compute"]
    assert sum(per_layer) - compute <= got.parts["dp"] <= sum(per_layer)
    assert got.parts["dp"] >= 4 * 3 * (n - 1) * ALPHA - compute


# ------------------------------------------------------------------ context parallelism
def test_ring_attention_passes_show_beyond_the_attention_they_hide_behind():
    # one block, s 256, h 512, 8 heads of 64, 2 of them for keys and values: this rank's
    # K and V, 2 x 256 x 128 x 2 bytes, one step 1 us + 131072 B / 1 GB/s; the block's
    # attention products 4 s^2 h = 134217728 FLOPs forward (134.2 us), twice backward.
    # cp 2: 1 step forward against 134.2 / 2 us, 3 backward against 268.4 / 3 us
    net = sim.Network.llama("one", 1, 512, 8, 256, kv_heads=2, ffn=1024)
    step = ALPHA + 2 * 256 * 128 * 2 / BETA
    fwd = 4 * 256 ** 2 * 512 / 1e12
    want = (step - fwd / 2) + 3 * (step - 2 * fwd / 3)
    assert ring_passes_s(net, [0], 1, 1, 2, flat_cluster(), 1) == pytest.approx(want)
    assert want == pytest.approx(192.74368e-6)
    assert ring_passes_s(net, [0], 1, 1, 1, flat_cluster(), 1) == 0.0


def test_context_parallel_splits_the_work_and_the_activations():
    net = sim.Network.llama("l", 4, 1024, 8, 4096, 32000, kv_heads=2, ffn=2816)
    w, c = sim.Workload.of(net), sim.h100_nodes(1)
    one = sim.predict(w, c, sim.Plan(dp=2), 4)
    two = sim.predict(w, c, sim.Plan(dp=2, cp=2), 4)
    assert two.plan.devices == 4 and "cp" in two.parts and "cp" not in one.parts
    assert two.parts["compute"] == pytest.approx(one.parts["compute"] / 2, rel=0.05)
    assert two.memory["activations"] == pytest.approx(one.memory["activations"] / 2)
    mem = sim.memory(net, 4, dp=2, cp=2)
    assert mem.activations == pytest.approx(sim.memory(net, 4, dp=2).activations / 2)


# ------------------------------------------------------------------ experts
def test_a_mixture_of_experts_block_by_hand():
    # h 512, 8 heads (kv 8), MLP 1024 (GELU, biases), 4 experts, 2 a token, 8 tokens:
    # attention 4 h^2 + 4 h biases, 4 experts of 2 h f + f + h, a router h x 4, 2 norms
    moe = block("b", 8, 512, 8, ffn=1024, experts=4, top_k=2)
    assert moe.params == 4 * 512 ** 2 + 4 * 512 + 4 * (2 * 512 * 1024 + 1024 + 512) + \
        512 * 4 + 2 * 2 * 512 == 5_255_168
    assert moe.expert_params == 4 * (2 * 512 * 1024 + 1024 + 512) == 4_200_448
    assert moe.routed_elems == 2 * 8 * 512
    # QKV, the scores and their use, the projection, both MLP products on 2 x 8 rows, router
    assert moe.flops == (2 * 8 * 1536 * 512 + 2 * 2 * 8 * 8 * 64 * 8 + 2 * 8 * 512 * 512
                         + 2 * 2 * 16 * 1024 * 512 + 2 * 8 * 4 * 512) == 50_495_488
    dense = block("b", 8, 512, 8, ffn=1024)
    assert dense.expert_params == 0 and dense.routed_elems == 0
    with pytest.raises(ValueError, match="top_k"):
        block("b", 8, 512, 8, experts=2, top_k=3)


def test_expert_parallel_all_to_alls_by_hand():
    # 2 x 256 x 512 routed elements, 2 bytes: 524288 B a rank; 4 ranks in a node:
    # 3 alpha + 3/4 x 524288 / 1 GB/s each; dispatch and combine, forward and backward
    net = sim.Network.llama("m", 1, 512, 8, 256, ffn=1024, experts=4, top_k=2)
    one = 3 * ALPHA + 3 / 4 * 524288 / BETA
    assert all_to_all_s(net, [0], 1, 1, 4, flat_cluster(), 1) == pytest.approx(4 * one)
    full = net.trained(recompute="full")
    assert all_to_all_s(full, [0], 1, 1, 4, flat_cluster(), 1) == pytest.approx(6 * one)
    assert all_to_all_s(net, [0], 1, 1, 1, flat_cluster(), 1) == 0.0


def test_expert_parallel_spreads_the_experts_states():
    net = sim.Network.llama("m", 2, 1024, 8, 1024, 32000, ffn=2816, experts=8, top_k=2)
    experts = sum(x.expert_params for x in net.layers)
    per_param = sum(net.state.values())
    for ep in (1, 2, 8):
        mem = sim.memory(net, 8, dp=8, ep=ep)
        assert mem.states == pytest.approx((net.params - experts + experts / ep) * per_param)
    got = sim.predict(sim.Workload.of(net), sim.h100_nodes(1), sim.Plan(dp=8, ep=8), 8)
    assert got.parts["ep"] > 0
    assert got.memory["states"] == pytest.approx(sim.memory(net, 8, dp=8, ep=8).states)


def test_plans_with_context_and_expert_parallelism():
    plan = sim.Plan(dp=4, tp=2, cp=2, ep=4)
    assert plan.devices == 16 and plan.label() == "dp 4 × tp 2 × cp 2 × ep 4"
    assert (plan.span("tp"), plan.span("cp"), plan.span("dp")) == (2, 4, 16)
    with pytest.raises(ValueError, match="ep=3 must divide"):
        sim.Plan(dp=4, ep=3)
    with pytest.raises(ValueError, match="ep=3 must divide"):
        sim.memory(sim.Network.decoder("d", 2, 256, 4, 16), 4, dp=4, ep=3)


# ------------------------------------------------------------------ Float8
def test_float8_products_and_their_casts_by_hand():
    # one Linear 512 -> 1024 on 64 samples: forward casts its input (64 x 512) and its
    # weight (512 x 1024), backward the output's gradient (64 x 1024), 5 bytes an element
    net = replace(sim.Network.mlp([512, 1024]), fp8=True)
    c = sim.h100_nvlink(1)
    r, layer = Roofline(net, c), net.layers[0]
    products = pass_s(c.fp8_matrix, layer.gemms, 64, 1, 1)
    assert r._fp8_matmul_s(layer, 64, 1, False) - products == pytest.approx(
        CAST_BYTES * (64 * 512 + 512 * 1024) / c.memory_bandwidth_Bps)
    products = pass_s(c.fp8_matrix, layer.gemms, 64, 1, 1, backward=True)
    assert r._fp8_matmul_s(layer, 64, 1, True) - products == pytest.approx(
        CAST_BYTES * 64 * 1024 / c.memory_bandwidth_Bps)
    assert c.fp8_matrix.rate == 1402.6e12


def test_float8_runs_large_products_faster_and_needs_a_unit():
    big = sim.Network.llama("l", 1, 8192, 64, 8192, kv_heads=8, ffn=28672)
    c = sim.h100_nvlink(1)
    bf16 = Roofline(big, c).forward_s(0, 1)
    fp8 = Roofline(replace(big, fp8=True), c).forward_s(0, 1)
    assert fp8 < 0.8 * bf16
    with pytest.raises(ValueError, match="no 8-bit float matrix rate"):
        Roofline(replace(big, fp8=True), sim.a100_nvlink(1)).forward_s(0, 1)


# ------------------------------------------------------------------ the sealed set
def test_every_sealed_run_is_expressible_now():
    for run in sealed.runs():
        got = sealed.outcome(run)
        assert got.predicted is not None and got.predicted > 0, (run.id, got.note)
    assert all(sealed.outcome(r, before=True).predicted is None
               for r in sealed.runs() if r.id in sealed.NOT_IN_THE_MODEL)


def test_the_supplements_are_what_the_records_own_words_state():
    grok = {r.id: r for r in sealed.runs()}["dgxc-grok1-314b-2048"]
    extra = sealed.NOT_IN_THE_RECORDS[grok.id]
    assert f"EP {extra['ep']}" in grok.title
    assert f"{extra['experts']} experts, {extra['top_k']} active" in grok.setup.model.name
    net = validate.network_for(grok, grok.setup, validate.Experts(**extra))
    assert sum(x.expert_params > 0 for x in net.layers) == grok.setup.model.layers


# ------------------------------------------------------------------ presets from measurements
def test_the_h200_and_the_a100_pcie_presets_carry_their_measured_rates():
    from parlab.sim import clusters
    h200, h100 = sim.h200_nvlink(), sim.h100_nvlink()
    assert h200.matrix.rate == h100.matrix.rate == 794.5e12          # "H200 is the same"
    assert h200.fp8_matrix.rate == clusters.H200_FP8 == 1453.4e12
    assert h200.memory_bytes == 141e9 and h200.memory_bandwidth_Bps == pytest.approx(0.9 * 4.8e12)
    pcie = sim.a100_pcie()
    assert pcie.matrix.rate == clusters.A100_PCIE == 252.9e12
    assert pcie.intra.bandwidth_Bps == pytest.approx(0.8 * 31.5e9)
    assert sim.a100_pcie(gb=40).memory_bandwidth_Bps == pytest.approx(0.9 * 1555e9)
    with pytest.raises(ValueError, match="gb must be 40 or 80"):
        sim.a100_pcie(gb=48)
    # a step whose work is large products: slower on the card by the measured rates' ratio,
    # and its tensor-parallel all-reduces far slower over PCIe than over NVLink
    net = sim.Network.llama("l", 2, 4096, 32, 2048, ffn=14336)
    one = [sim.predict(sim.Workload.of(net), c, sim.Plan(dp=1), 8).parts["compute"]
           for c in (sim.a100_nvlink(2), pcie)]
    assert one[1] / one[0] == pytest.approx(271.2 / 252.9, rel=0.05)
    tp = [sim.predict(sim.Workload.of(net), c, sim.Plan(dp=1, tp=2), 8).parts["tp"]
          for c in (sim.a100_nvlink(2), pcie)]
    assert tp[1] > 5 * tp[0]
    # the H200's memory holds what the H100's cannot
    big = sim.Network.llama("b", 32, 8192, 64, 4096, ffn=28672)
    assert not sim.memory(big, 8, dp=8, zero=3, cluster=h100).fits
    assert sim.memory(big, 8, dp=8, zero=3, cluster=h200).fits
