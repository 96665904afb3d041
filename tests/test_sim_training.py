"""How large models are trained, in the cost model: activation recomputation, sequence
parallelism, ZeRO / FSDP, interleaved 1F1B with tensor parallelism, micro-batches
without a pipeline, and Llama-style blocks. Expected values by hand, formulas cited."""
import pytest

from parlab import sim
from parlab.sim import collectives as col
from parlab.trace import COMM, COMPUTE

FREE = sim.Link(0.0, float("inf"))


def _cluster(**kw):
    base = dict(name="toy", devices=16, memory_bytes=1e12, flops=1e12, layer_overhead_s=0.0,
                devices_per_node=16, intra=FREE, inter=FREE, memory_bandwidth_Bps=1e11)
    base.update(kw)
    return sim.Cluster(**base)


def _even(layers=8, width=64):
    """``layers`` identical layers, each F 1 ms and B 2 ms at any batch (no fixed part)."""
    net = sim.Network.mlp((width,) * (layers + 1))
    costs = sim.Measured(forward=(1e-3,) * layers, backward=(2e-3,) * layers, update=0.0,
                         batch=64, params=net.params)
    return net, costs


# ------------------------------------------------------------------ blocks
def test_a_gpt_block_keeps_korthikanti_equation_1():
    """s h (34 + 5 a s / h) bytes per sequence (Korthikanti et al., 2022, eq. 1), of which
    10 s h whole on every tp rank; 5 a s^2 is attention's (what selective drops)."""
    s, h, a = 512, 1024, 16
    b = sim.Network.transformer("gpt", 1, h, a, s).layers[0]
    assert 2 * (b.saved_elems + b.saved_replicated_elems) == s * h * (34 + 5 * a * s / h)
    assert 2 * b.saved_replicated_elems == 10 * s * h
    assert 2 * b.attention_elems == 5 * a * s * s
    assert b.params == 12 * h * h + 13 * h
    assert b.flops == 24 * s * h * h + 4 * s * s * h
    assert sum(g.flops for g in b.gemms) == b.flops


def test_llama_blocks_count_gqa_and_the_gated_mlp():
    """Llama 2 7B and 70B as published (Touvron et al., 2023): 6,738,415,616 and
    68,976,648,192 parameters (vocab 32000, untied, RMSNorm, no biases)."""
    assert sim.Network.llama("7B", 32, 4096, 32, 4096, 32000, ffn=11008).params == 6_738_415_616
    big = sim.Network.llama("70B", 80, 8192, 64, 4096, 32000, kv_heads=8, ffn=28672)
    assert big.params == 68_976_648_192
    s, h, a, kv, f = 256, 512, 8, 2, 1408
    d = h // a
    blk = sim.Network.llama("t", 1, h, a, s, kv_heads=kv, ffn=f).layers[0]
    # Q, O: h^2; K, V: h kv d; gate, up, down: 3 h f; two RMSNorms: 2h
    assert blk.params == 2 * h * h + 2 * h * kv * d + 3 * h * f + 2 * h
    assert blk.flops == 2 * s * (2 * h * h + 2 * h * kv * d + 3 * h * f) + 4 * s * s * h
    # kept (bytes): Q 2sh, K and V 2 s kv d each, out-proj input 2sh, gated MLP 6sf, and
    # flash attention's softmax statistics 4 a s; whole: norms 4sh, QKV and MLP inputs 4sh
    assert 2 * blk.saved_elems == 4 * s * h + 4 * s * kv * d + 6 * s * f + 4 * a * s
    assert 2 * blk.saved_replicated_elems == 8 * s * h
    with pytest.raises(ValueError, match="kv_heads"):
        sim.Network.llama("bad", 1, 512, 8, 64, kv_heads=3)


# ------------------------------------------------------------------ activation memory
def _per_layer_bytes(**kw):
    s, h, a, t = 2048, 4096, 32, 8
    net = sim.Network.transformer("gpt", 4, h, a, s)
    return sim.memory(net, 1, tp=t, **kw).activations / 4, (s, h, a, t)


def test_activation_memory_matches_korthikanti_table_2():
    """Per layer and sequence (Korthikanti et al., 2022, table 2)."""
    got, (s, h, a, t) = _per_layer_bytes()
    assert got == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)))
    got, _ = _per_layer_bytes(sequence_parallel=True)
    assert got == pytest.approx(s * h / t * (34 + 5 * a * s / h))
    got, _ = _per_layer_bytes(recompute="selective")
    assert got == pytest.approx(s * h * (10 + 24 / t))
    got, _ = _per_layer_bytes(recompute="selective", sequence_parallel=True)
    assert got == pytest.approx(34 * s * h / t)


def test_full_recomputation_keeps_each_layers_input_and_rebuilds_one_layer():
    s, h, a, t, layers = 2048, 4096, 32, 8, 4
    net = sim.Network.transformer("gpt", layers, h, a, s)
    mem = sim.memory(net, 1, tp=t, recompute="full").activations
    one_layer = s * h * (10 + 24 / t + 5 * a * s / (h * t))     # rebuilt for its backward
    assert mem == pytest.approx(layers * 2 * s * h + one_layer)
    sp = sim.memory(net, 1, tp=t, recompute="full", sequence_parallel=True).activations
    assert sp == pytest.approx(layers * 2 * s * h / t + s * h / t * (34 + 5 * a * s / h))


# ------------------------------------------------------------------ ZeRO
@pytest.mark.parametrize("zero,shares", [(0, (1, 1, 1)), (1, (1, 1, 4)), (2, (1, 4, 4)),
                                         (3, (4, 4, 4))])
def test_zero_shares_out_the_states_over_dp(zero, shares):
    """Rajbhandari et al., 2020, figure 1: stage 1 the optimizer state, 2 the gradients
    too, 3 the parameters too (mixed-precision Adam: 2 + 2 + 12 bytes a parameter)."""
    net = sim.Network.transformer("gpt", 4, 512, 8, 128, vocab=1000)
    p = net.params
    mem = sim.memory(net, 8, dp=4, zero=zero)
    assert (mem.params, mem.grads, mem.optimizer) == pytest.approx(
        (2 * p / shares[0], 2 * p / shares[1], 12 * p / shares[2]))
    largest = max(x.params for x in net.layers)
    assert mem.buffers == pytest.approx(2 * largest * 2 if zero == 3 else 0.0)
    # the explicit plain-DP figures of parlab.zero, for the same model
    from parlab import zero as zero_plan
    table = zero_plan.per_device_bytes(p, 4, zero, mixed_precision=True)
    assert mem.states == pytest.approx(table["total"])


def test_zero_1_and_2_reduce_scatter_then_all_gather_what_an_all_reduce_moves():
    net = sim.Network.mlp((256, 1024, 1024, 10))
    c = _cluster(intra=sim.Link(1e-5, 1e9), devices_per_node=16)
    tl = sim.data_parallel(net, c, 64, devices=4, overlap=False, zero=1)
    comm = [x for x in tl if x.rank == 0 and x.kind == COMM]
    assert [x.name for x in comm] == ["reduce-scatter", "all-gather params"]
    g = 4 * net.params                               # float32 gradients and weights
    half = col.half_ring_time(c, g, 4)
    assert [x.duration for x in comm] == pytest.approx([half, half])
    # the same wire time as one all-reduce: 2 x (n-1)/n S / B, 2(n-1) alpha
    assert 2 * half == pytest.approx(col.all_reduce_time(c, g, 4))


def test_zero_3_gathers_each_layers_parameters_twice_and_scatters_its_gradients():
    net, costs = _even(4, 256)
    c = _cluster(intra=sim.Link(1e-5, 1e9))
    tl = sim.data_parallel(net, c, 256, devices=4, overlap=False, zero=3, costs=costs)
    names = [x.name for x in tl if x.rank == 0 and x.kind == COMM]
    assert names.count("all-gather params") == 2 * 4 and names.count("reduce-scatter grads") == 4
    # 1.5x plain data parallel's bytes on the wire (ZeRO, section 7.2.1)
    wire = sum(3 / 4 * x.bytes for x in tl if x.rank == 0 and x.kind == COMM)
    assert wire == pytest.approx(1.5 * 2 * 3 / 4 * 4 * net.params)
    # with free links and prefetching, the step is the compute alone
    fast = sim.data_parallel(net, _cluster(), 256, devices=4, overlap=True, zero=3, costs=costs)
    assert fast.step_s == pytest.approx(4 * 3e-3)
    # prefetch hides gathers behind compute on a real link
    slow = sim.data_parallel(net, c, 256, devices=4, overlap=True, zero=3, costs=costs)
    assert fast.step_s < slow.step_s < tl.step_s


# ------------------------------------------------------------------ recomputation
def test_full_recomputation_runs_every_forward_again():
    net, costs = _even(8)
    plain = sim.single_device(net, _cluster(), 64, costs=costs)
    again = sim.single_device(net, _cluster(), 64, costs=costs, recompute="full")
    assert plain.step_s == pytest.approx(8 * 3e-3)
    assert again.step_s == pytest.approx(8 * 4e-3)               # F + (F + B)
    assert any(x.name == "recompute" for x in again if x.kind == COMPUTE)


def test_selective_recomputation_repeats_attentions_products_and_softmax():
    """Roofline without a matrix unit: 4 s^2 h FLOPs at the rate and 12 a s^2 bytes
    (scale + mask, softmax and dropout, read and written, 2 bytes) at the bandwidth."""
    s, h, a, layers, b = 256, 512, 8, 2, 4
    net = sim.Network.transformer("gpt", layers, h, a, s)
    c = _cluster(flops=1e12, memory_bandwidth_Bps=1e11)
    plain = sim.single_device(net, c, b).step_s
    sel = sim.single_device(net, c, b, recompute="selective").step_s
    assert sel - plain == pytest.approx(layers * (4 * s * s * h * b / 1e12 + 12 * a * s * s * b / 1e11))


def test_gpipe_recomputes_before_the_gradient_arrives():
    """GPipe, K = 2, M = 4, free links; per stage F 4 ms, R 4 ms, B 8 ms. The recompute
    fills the wait (Huang et al., 2019, section 2.3): (M + K - 1) F + (K - 1) B + M (R + B)
    = 20 + 8 + 48 = 76 ms; waiting for the gradient first would take 80."""
    net, costs = _even(8)
    tl = sim.pipeline(net, _cluster(), 256, stages=2, micro_batches=4, schedule="gpipe",
                      recompute="full", costs=costs)
    assert tl.step_s == pytest.approx(76e-3)
    late = sim.pipeline(net, _cluster(), 256, stages=2, micro_batches=4, schedule="1f1b",
                        recompute="full", costs=costs)
    assert late.step_s > tl.step_s


def test_pipedream_pays_the_fill_and_drain_once():
    """p = 2, m = 4, 3 steps, free links, a stage's slot 4 x 3 ms: 1F1B flushes every step,
    (m + p - 1) = 5 slots a step; PipeDream streams all 12 micro-batches, (12 + 1) slots for
    the three (Narayanan et al., 2019). It stashes p - s versions of the weights."""
    net, costs = _even(8)
    kw = dict(stages=2, micro_batches=4, steps=3, costs=costs)
    flushed = sim.pipeline(net, _cluster(), 256, schedule="1f1b", **kw)
    stream = sim.pipeline(net, _cluster(), 256, schedule="pipedream", **kw)
    assert flushed.step_s == pytest.approx(5 * 12e-3)
    assert stream.step_s == pytest.approx(13 * 12e-3 / 3)
    plain = sim.memory_per_device(net, 256, pp=2, micro_batches=4)
    stashed = sim.memory_per_device(net, 256, pp=2, micro_batches=4, schedule="pipedream")
    assert [m.params / p.params for m, p in zip(stashed, plain)] == [2, 1]


# ------------------------------------------------------------------ sequence parallelism
def test_sequence_parallelism_splits_the_repeated_work_and_keeps_the_bytes():
    net = sim.Network.transformer("gpt", 2, 1024, 16, 512)
    c = _cluster(intra=sim.Link(1e-6, 1e11))
    tp = sim.tensor_parallel(net, c, 4, devices=4)
    sp = sim.tensor_parallel(net, c, 4, devices=4, sequence_parallel=True)
    names = [x.name for x in sp if x.rank == 0 and x.kind == COMM]
    # each block: per part an all-gather before and a reduce-scatter after, both passes
    # (the first block's backward has none: the input needs no gradient)
    assert names.count("all-gather") == names.count("reduce-scatter") == 2 * 2 + 2
    assert sp.step_s < tp.step_s
    # the same ring time in all as the all-reduces (Korthikanti et al., section 4.2.2)
    ar = sum(x.duration for x in tp if x.rank == 0 and x.kind == COMM)
    rs_ag = sum(x.duration for x in sp if x.rank == 0 and x.kind == COMM)
    assert rs_ag == pytest.approx(ar, rel=0.02)


# ------------------------------------------------------------------ hybrid
def test_interleaved_1f1b_with_tensor_parallelism_shrinks_the_bubble():
    """dp 1 x pp 2 x tp 2, 4 micro-batches, free links: a stage's slot is 4 layers of
    (0.5 + 1) ms; 1F1B (m + p - 1) slots = 30 ms, interleaved over v = 2 chunks
    m + (p - 1)/v slots = 27 ms (Narayanan et al., 2021, section 2.2)."""
    net, costs = _even(8)
    plain = sim.hybrid(net, _cluster(), 256, dp=1, tp=2, pp=2, micro_batches=4, costs=costs)
    inter = sim.hybrid(net, _cluster(), 256, dp=1, tp=2, pp=2, micro_batches=4,
                       schedule="interleaved", chunks=2, costs=costs)
    assert plain.step_s == pytest.approx(30e-3)
    assert inter.step_s == pytest.approx(27e-3)


def test_micro_batches_without_a_pipeline_run_one_after_another():
    net, costs = _even(4)
    tl = sim.hybrid(net, _cluster(), 256, dp=2, tp=2, micro_batches=4, costs=costs)
    spans = [x.name for x in tl if x.rank == 0 and x.kind == COMPUTE]
    assert spans[:4] == ["F0", "B0", "F1", "B1"]
    # the same work as the whole batch at once (costs grow with the batch, no fixed part)
    whole = sim.hybrid(net, _cluster(), 256, dp=2, tp=2, costs=costs)
    assert tl.step_s == pytest.approx(whole.step_s)
    # and a micro-batch's activations, not the replica's whole batch's
    one = sim.memory(net, 256, dp=2, micro_batches=4).activations
    assert one == pytest.approx(sim.memory(net, 256, dp=2).activations / 4)


def test_strategy_options_are_checked():
    net = sim.Network.mlp((8, 8, 8))
    with pytest.raises(ValueError, match="zero must be"):
        sim.data_parallel(net, _cluster(), 8, devices=2, zero=4)
    with pytest.raises(ValueError, match="recompute must be one of"):
        sim.single_device(net, _cluster(), 8, recompute="some")
    with pytest.raises(ValueError, match="zero must be"):
        sim.memory(net, 8, dp=2, zero=True)


# ------------------------------------------------------------------ one accounting
def test_the_summary_model_is_made_from_the_network():
    """Workload.of(net): lab 07's summary reads the same layers as the timelines: one
    device's predicted compute is the timeline's forward and backward (its update aside)."""
    net = sim.Network.transformer("gpt", 4, 1024, 16, 512, vocab=1000)
    c = sim.h100_nvlink(8)
    w = sim.Workload.of(net)
    assert w.params == net.params and w.layers == len(net) == 6
    assert w.flops_per_sample == 3 * sum(x.flops for x in net.layers)
    assert w.state_bytes_per_param == 16 and w.grad_bytes_per_param == 2
    p = sim.predict(w, c, sim.Plan(), 8)
    tl = sim.single_device(net, c, 8)
    update = sum(x.duration for x in tl if x.name == "update")
    assert p.parts["compute"] == pytest.approx(tl.step_s - update)
    # activations: Korthikanti's split and whole parts, plus the head's softmax (4 s V)
    s, h, a = 512, 1024, 16
    blocks = 4 * s * h * (24 + 5 * a * s / h)
    assert w.act_whole_bytes == pytest.approx(4 * 10 * s * h + 2 * 2 * s * h)
    assert w.act_split_bytes == pytest.approx(blocks + 4 * s * 1000)
    # tp: each block all-reduces s h twice per pass, the embedding once forward, the head
    # once each way
    assert w.tp_messages == 4 * 4 + 1 + 2
    assert w.tp_bytes == pytest.approx(2 * s * h * (4 * 4 + 1 + 2))


def test_the_summary_follows_recomputation_and_sequence_parallelism():
    s, h, a = 512, 1024, 16
    net = sim.Network.transformer("gpt", 2, h, a, s)
    sel = sim.Workload.of(net.trained(recompute="selective"))
    assert sel.act_split_bytes == pytest.approx(2 * 24 * s * h)
    assert sel.flops_per_sample == pytest.approx(2 * (3 * (24 * s * h * h + 4 * s * s * h)
                                                      + 4 * s * s * h))
    sp = sim.Workload.of(net.trained(sequence_parallel=True))
    assert sp.act_whole_bytes == 0 and sp.act_split_bytes == pytest.approx(
        2 * s * h * (34 + 5 * a * s / h))
    full = sim.Workload.of(net.trained(recompute="full"))
    assert full.act_split_bytes == 0 and full.act_whole_bytes == pytest.approx(2 * 2 * s * h)
    assert full.flops_per_sample == pytest.approx(4 * sum(x.flops for x in net.layers))


def test_a_unet_summary_carries_its_largest_cut():
    net = sim.Network.unet(image=8, in_channels=1, classes=2, base=2, depth=1)
    w = sim.Workload.of(net)
    assert w.boundary_bytes == 4 * max(net.cut_elems(at) for at in range(1, len(net)))
