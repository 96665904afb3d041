"""The cost model (parlab.sim): trivial cases equal their closed forms; nothing else imported."""
import math

import pytest

from parlab import sim

LINK = sim.Link(latency_s=1e-5, bandwidth_Bps=1e10)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64])
@pytest.mark.parametrize("size", [0, 4096, 64 * 2**20])
def test_ring_all_reduce_is_the_closed_form(n, size):
    want = 2 * (n - 1) / n * size / LINK.bandwidth_Bps + 2 * (n - 1) * LINK.latency_s
    assert sim.all_reduce_s(size, n, LINK) == pytest.approx(want, rel=1e-12)


def test_one_rank_moves_nothing_and_a_send_is_alpha_plus_s_over_beta():
    assert sim.all_reduce_s(1e9, 1, LINK) == 0.0
    assert sim.send_s(1e6, LINK) == pytest.approx(1e-5 + 1e6 / 1e10)
    with pytest.raises(ValueError):
        sim.all_reduce_s(10, 0, LINK)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 4), (4, 4), (4, 16), (8, 1)])
def test_bubble_is_p_minus_1_over_m_plus_p_minus_1(p, m):
    assert sim.bubble(p, m) == pytest.approx((p - 1) / (m + p - 1))


def _cluster(**kw):
    base = dict(name="toy", devices=16, memory_bytes=1e12, flops=1e12, layer_overhead_s=0.0,
                devices_per_node=4, intra=LINK, inter=sim.Link(1e-4, 1e9))
    base.update(kw)
    return sim.Cluster(**base)


def test_one_device_is_all_compute():
    w = sim.Workload.mlp((64, 256, 10))
    p = sim.predict(w, _cluster(), sim.Plan(), 128)
    # 2 a b FLOPs forward per Linear a -> b and sample, 3x that with the backward
    assert w.flops_per_sample == 6 * (64 * 256 + 256 * 10)
    assert p.parts["compute"] == pytest.approx(w.flops_per_sample * 128 / 1e12)
    assert p.step_s == pytest.approx(p.parts["compute"])
    assert p.memory["states"] == 8 * w.params and p.fits


def test_pure_data_parallel_adds_one_ring_all_reduce_of_the_gradients():
    w = sim.Workload.mlp((64, 256, 256, 10))
    c = _cluster()
    p = sim.predict(w, c, sim.Plan(dp=4), 128)
    assert p.parts["dp"] == pytest.approx(sim.all_reduce_s(4 * w.params, 4, LINK))
    assert p.parts["compute"] == pytest.approx(w.flops_per_sample * 32 / 1e12)   # a quarter
    assert p.parts["tp"] == p.parts["pp"] == p.parts["bubble"] == 0


def test_tensor_parallel_bytes_match_megatron_pairs_and_the_torch_formula():
    sizes = (64, 256, 256, 128, 10)
    w = sim.Workload.mlp(sizes)
    # forward: outputs of the two pairs (256 and 10); backward: the second pair's input (256)
    assert w.tp_bytes == 4 * (256 + 10 + 256) and w.tp_messages == 3
    pytest.importorskip("torch")
    from parlab.torch import tensor_parallel as tp
    assert w.tp_bytes == tp.expected_comm_bytes(sizes, 1, 2, "column_row")["total"]


def test_a_pipeline_idles_its_bubble_and_holds_fewer_parameters():
    w = sim.Workload.mlp((64, 256, 256, 256, 10))
    p = sim.predict(w, _cluster(), sim.Plan(pp=4, micro_batches=4), 64)
    slot = p.parts["compute"] / 4
    assert p.parts["bubble"] == pytest.approx(3 * slot)
    busy = p.parts["compute"] / (p.parts["compute"] + p.parts["bubble"])
    assert 1 - busy == pytest.approx(sim.bubble(4, 4))
    assert p.memory["states"] == pytest.approx(8 * w.params / 4)


def test_an_axis_crossing_nodes_uses_the_slow_link():
    w = sim.Workload.transformer("tiny", layers=4, hidden=512, heads=8, seq=128)
    c = _cluster(devices=8, devices_per_node=4)
    inside = sim.predict(w, c, sim.Plan(dp=2, tp=4), 32)            # tp inside a node
    across = sim.predict(w, c, sim.Plan(dp=2, tp=4, order=("tp", "pp", "dp")), 32)
    assert inside.links == {"dp": "inter", "tp": "intra"}
    assert across.links == {"dp": "intra", "tp": "inter"}
    assert across.parts["tp"] > inside.parts["tp"]


def test_a_model_too_big_for_one_device_fits_once_split():
    w = sim.Workload.transformer("GPT-3", 96, 12288, 96, 2048)
    c = sim.h100_nodes(16)
    assert w.params == pytest.approx(175e9, rel=0.01)       # Brown et al., 2020
    assert not sim.predict(w, c, sim.Plan(dp=128), 1536).fits
    # 16 stages of 8-way tensor parallel, one sequence per micro-batch (no recomputation)
    assert sim.predict(w, c, sim.Plan(dp=1, pp=16, tp=8, micro_batches=1536), 1536).fits
    assert not sim.predict(w, c, sim.Plan(dp=2, pp=8, tp=8, micro_batches=768), 1536).fits


def test_plans_are_every_factorization_and_bad_batches_are_refused():
    assert [(p.dp, p.tp) for p in sim.plans(4)] == [(4, 1), (2, 2), (1, 4)]
    assert len(sim.plans(8, ("dp", "pp", "tp"))) == 10
    with pytest.raises(ValueError, match="does not split"):
        sim.predict(sim.Workload.mlp((8, 8)), _cluster(), sim.Plan(dp=3), 64)
    with pytest.raises(ValueError, match="needs 32 devices"):
        sim.predict(sim.Workload.mlp((8, 8)), _cluster(), sim.Plan(dp=32), 64)


def test_calibration_recovers_known_costs():
    sizes = (64, 256, 10)
    w = sim.Workload.mlp(sizes)
    rate, per_layer, link, extra = 2e9, 1e-4, sim.Link(2e-4, 5e8), 1e-3
    measured = {
        "compute": {b: 2 * w.layers * per_layer + w.flops_per_sample * b / rate for b in (16, 64)},
        "send": {s: link.time(s) for s in (4096, 65536, 2**20)},
        "all_reduce": {2: {s: sim.all_reduce_s(s, 2, link) + extra for s in (4096, 2**20)}},
    }
    c = sim.calibrated(measured, sizes)
    assert c.flops == pytest.approx(rate, rel=1e-6)
    assert c.layer_overhead_s == pytest.approx(per_layer, rel=1e-6)
    assert c.intra.latency_s == pytest.approx(2e-4, rel=1e-3)
    assert c.intra.bandwidth_Bps == pytest.approx(5e8, rel=1e-3)
    assert c.collective_overhead_s == pytest.approx(extra, rel=1e-3)


def test_sim_is_framework_free():
    import ast
    from pathlib import Path
    names = set()
    for path in Path(sim.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in names if m.split(".")[0] in ("torch", "tensorflow", "keras")}
    assert math.isfinite(sim.predict(sim.presets()["GPT-2 XL (1.5 B)"], sim.h100_nodes(1),
                                     sim.Plan(dp=8), 512).step_s)


# ------------------------------------------------------------------ predicted timelines
from parlab.trace import COMM, COMPUTE, WAIT  # noqa: E402

FREE = sim.Link(0.0, float("inf"))


def _even(layers=8, width=64):
    """``layers`` identical layers, each F 1 ms and B 2 ms at any batch (no fixed part)."""
    net = sim.Network.mlp((width,) * (layers + 1))
    costs = sim.Measured(forward=(1e-3,) * layers, backward=(2e-3,) * layers, update=0.0,
                         batch=64, params=net.params)
    return net, costs


def _free_cluster(devices=16, **kw):
    return _cluster(devices=devices, intra=FREE, inter=FREE, **kw)


def _idle_share(tl):
    """Share of the ranks' time not computing: the pipeline bubble (wait + idle)."""
    return 1 - tl.summary().mean("compute")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 8), (4, 16)])
def test_a_predicted_pipeline_idles_the_bubble_formula(schedule, p, m):
    net, costs = _even(8)
    tl = sim.pipeline(net, _free_cluster(), 64 * m, stages=p, micro_batches=m,
                      schedule=schedule, costs=costs)
    assert _idle_share(tl) == pytest.approx((p - 1) / (m + p - 1), abs=1e-9)
    assert tl.step_s == pytest.approx((m + p - 1) * 3e-3 * 8 / p)


def test_interleaving_shrinks_the_bubble_by_the_chunks():
    net, costs = _even(8)
    plain = sim.pipeline(net, _free_cluster(), 64 * 8, stages=4, micro_batches=8, costs=costs)
    inter = sim.pipeline(net, _free_cluster(), 64 * 8, stages=4, micro_batches=8, costs=costs,
                         schedule="interleaved", chunks=2)
    # Narayanan et al., 2021, section 2.2: bubble time (p - 1) / v slots of the whole model
    slot = 3e-3 * 8 / 4
    assert inter.step_s == pytest.approx(8 * slot + 3 * slot / 2)
    assert plain.step_s == pytest.approx(8 * slot + 3 * slot)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_data_parallel_all_reduce_is_the_ring_closed_form(n):
    net = sim.Network.mlp((64, 256, 10))
    c = _cluster(devices=8, devices_per_node=8)           # one node: the fast link
    tl = sim.data_parallel(net, c, 64 * n, devices=n, overlap=False)
    size = 4 * net.params
    comm = [s for s in tl if s.kind == COMM and s.rank == 0]
    assert len(comm) == 1 and comm[0].bytes == size
    want = 2 * (n - 1) / n * size / LINK.bandwidth_Bps + 2 * (n - 1) * LINK.latency_s
    assert comm[0].duration == pytest.approx(want, rel=1e-9)


def test_overlapping_buckets_hide_the_all_reduce_behind_the_backward():
    net = sim.Network.mlp((256, 1024, 1024, 1024, 10))
    c = _cluster(devices=8, intra=sim.Link(1e-5, 1e8))
    after = sim.data_parallel(net, c, 256, devices=4, buckets=3, overlap=False)
    hidden = sim.data_parallel(net, c, 256, devices=4, buckets=3, overlap=True)
    one = sim.data_parallel(net, c, 256, devices=4, buckets=1, overlap=True)
    compute = sum(s.duration for s in after if s.rank == 0 and s.kind == COMPUTE)
    assert compute < hidden.step_s < one.step_s <= after.step_s + 1e-12
    assert len(hidden.ranks) == 8                 # 4 main lanes, 4 bucket lanes
    assert hidden.labels[4] == "rank 0 buckets (predicted)"


def test_tensor_parallel_moves_what_the_course_formula_says():
    pytest.importorskip("torch")
    from parlab.torch import tensor_parallel as tp
    sizes = (64, 256, 256, 128, 10)
    net = sim.Network.mlp(sizes)
    for scheme in ("naive", "column_row"):
        tl = sim.tensor_parallel(net, _cluster(), 64, devices=2, scheme=scheme)
        assert tl.comm_bytes(0) == tp.expected_comm_bytes(sizes, 64, 2, scheme)["total"]
    naive = sim.tensor_parallel(net, _cluster(), 64, devices=2, scheme="naive")
    paired = sim.tensor_parallel(net, _cluster(), 64, devices=2)
    assert naive.step_s > paired.step_s


def test_each_tensor_parallel_collective_costs_its_ranks_the_measured_operator_time():
    """``tp_operator_s``: paid after every tp collective, inside the pass that holds it
    (lab 03's MLP: column_row 3 collectives a step, naive 7); nothing where no tp."""
    net, costs = _even(4)

    def run(scheme, devices=2, **kw):
        return sim.tensor_parallel(net, _free_cluster(**kw), 64, devices=devices, scheme=scheme,
                                   steps=2, costs=costs)
    for scheme, collectives in (("column_row", 3), ("naive", 7)):
        plain, paid = run(scheme), run(scheme, tp_operator_s=1e-4)
        assert paid.step_s == pytest.approx(plain.step_s + collectives * 1e-4)
        for phase in ("forward", "backward"):     # one span a step, the cost inside it
            assert len([s for s in paid if s.rank == 0 and s.name == phase]) == 2
        # after the collective, not before it: the first one starts when it did
        first = [min(s.start for s in tl if s.kind == "comm") for tl in (plain, paid)]
        assert first[0] == pytest.approx(first[1])
    assert run("naive", devices=1, tp_operator_s=1e-4).step_s == pytest.approx(
        run("naive", devices=1).step_s)
    with pytest.raises(ValueError, match="tp_operator_s"):
        _free_cluster(tp_operator_s=-1e-4)
    # with a pipeline too: every tp collective of every rank's program, the all-gather
    # of a stage's received activations included, is followed by the cost, in its pass
    from parlab.sim.engine import Collective, Compute
    from parlab.sim.program import programs
    progs, _ = programs(net, _free_cluster(tp_operator_s=1e-4), costs, 64, tp=2, pp=2,
                        micro_batches=2, dp=2)
    for prog in progs:
        at = [k for k, op in enumerate(prog) if isinstance(op, Collective) and op.axis == "tp"]
        assert len(at) >= 4 and all(isinstance(prog[k + 1], Compute)
                                    and prog[k + 1].seconds == 1e-4 for k in at)
        assert any(prog[k].name == "all-gather" for k in at)     # the stage boundary's


STRATEGY_CASES = [
    ("single_device", {}, 1), ("manual_split", {"devices": 2}, 2),
    ("tensor_parallel", {"devices": 2, "scheme": "naive"}, 2),
    ("tensor_parallel", {"devices": 4}, 4),
    ("pipeline", {"stages": 2, "micro_batches": 4, "schedule": "gpipe"}, 2),
    ("pipeline", {"stages": 2, "micro_batches": 4, "schedule": "1f1b"}, 2),
    ("pipeline", {"stages": 2, "micro_batches": 4, "schedule": "interleaved"}, 2),
    ("data_parallel", {"devices": 2, "buckets": 2}, 4),
    ("data_parallel", {"devices": 4, "buckets": "per_tensor", "overlap": False}, 4),
    ("parameter_server", {"workers": 2, "mode": "sync", "slow": {2: 3}}, 3),
    ("parameter_server", {"workers": 2, "mode": "async", "slow": {2: 3}}, 3),
    ("hybrid", {"dp": 2, "tp": 2}, 4), ("hybrid", {"dp": 2, "pp": 2}, 4),
    ("hybrid", {"dp": 2, "pp": 2, "tp": 2, "overlap": True}, 16),     # 8 ranks, 8 bucket lanes
]


@pytest.mark.parametrize("name,options,lanes", STRATEGY_CASES,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(STRATEGY_CASES)])
def test_every_strategy_predicts_a_labelled_timeline_without_overlapping_compute(name, options,
                                                                                lanes):
    net = sim.Network.mlp((64, 256, 256, 128, 10))
    tl = sim.timeline(name, net, _cluster(), 64, steps=2, **options)
    assert isinstance(tl, sim.PredictedTimeline) and tl.predicted
    assert "PREDICTED" in tl.title and all("predicted" in tl.labels[r] for r in tl.ranks)
    assert len(tl.ranks) == lanes and tl.steps == 2 and tl.step_s > 0
    for r in tl.ranks:
        compute = sorted((s.start, s.end) for s in tl if s.rank == r and s.kind == COMPUTE)
        assert all(a[1] <= b[0] + 1e-15 for a, b in zip(compute, compute[1:])), r
    assert {s.kind for s in tl} <= {"compute", "comm", "wait"}
    assert tl.window(tl.start, tl.end).predicted      # views stay predictions


def test_a_slow_worker_holds_up_sync_but_not_async():
    net = sim.Network.mlp((64, 256, 256, 128, 10))
    kw = dict(workers=2, slow={2: 3}, steps=6)
    c = _cluster(flops=1e9)                   # compute, not the server's links, dominates
    sync = sim.parameter_server(net, c, 64, mode="sync", **kw)
    asyn = sim.parameter_server(net, c, 64, mode="async", **kw)
    assert sync.summary()[1]["wait_share"] > 0.5          # the fast worker waits
    assert asyn.summary()[1]["wait_share"] < 0.1
    # the same number of gradients applied: async finishes sooner
    assert asyn.duration < sync.duration


def test_plot_draws_a_prediction_as_one():
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    from parlab import plot
    fig = plot.timeline(sim.single_device(sim.Network.mlp((8, 8)), _cluster(), 8))
    assert "predicted" in fig.axes[0].get_title()


# ------------------------------------------------------------------ costs
def test_measured_costs_from_two_timelines_recover_the_fixed_part():
    from parlab.trace import Span, Timeline
    net = sim.Network.mlp((64, 256, 10))          # 2 layers, FLOPs 32768 : 5120

    def tl(fwd, bwd):
        spans, t = [], 0.0
        for _ in range(3):
            for name, d in (("forward", fwd), ("backward", bwd), ("update", 1e-4)):
                spans.append(Span(0, COMPUTE, name, t, t + d))
                t += d
        return Timeline(spans)
    fixed = 1e-4                                   # per layer and pass
    per = {16: (2 * fixed + 16e-5, 2 * fixed + 32e-5), 64: (2 * fixed + 64e-5, 2 * fixed + 128e-5)}
    m = sim.Measured.from_timeline({b: tl(*per[b]) for b in per}, net)
    assert m.fixed_s == pytest.approx(fixed)
    assert sum(m.forward_s(i, 64) for i in range(2)) == pytest.approx(per[64][0])
    assert sum(m.backward_s(i, 16) for i in range(2)) == pytest.approx(per[16][1])
    # tensor parallel halves the part that grows with the batch, not the fixed part
    assert m.forward_s(0, 64, shard=2) == pytest.approx(fixed + (m.forward[0] - fixed) / 2)


def test_a_pass_s_call_is_paid_once_per_pass_by_every_rank_that_runs_one():
    """Timed on a one-layer network, a pass's call (``call_s``) is not shared out over the
    layers: one device pays it once, each of two split ranks once, so the split costs more
    compute in all; the single device's step is what was measured, as before."""
    from parlab.trace import Span, Timeline
    net = sim.Network.mlp((64, 256, 256, 10))     # 3 layers

    def tl(fwd, bwd, upd):
        spans, t = [], 0.0
        for _ in range(3):
            for name, d in (("forward", fwd), ("backward", bwd), ("update", upd)):
                spans.append(Span(0, COMPUTE, name, t, t + d))
                t += d
        return Timeline(spans)
    fixed, call = 1e-4, (3e-4, 2e-4, 1e-4)        # per layer pass; per call of each phase
    per = {b: (call[0] + 3 * fixed + b * 1e-5, call[1] + 3 * fixed + b * 2e-5, call[2] + 4e-4)
           for b in (16, 64)}
    tiny = tl(call[0] + fixed, call[1] + fixed, call[2])   # one layer of next to no work
    m = sim.Measured.from_timeline({b: tl(*per[b]) for b in per}, net, calls=tiny)
    assert m.fixed_s == pytest.approx(fixed)
    assert m.call_s == pytest.approx(call)
    one = sim.single_device(net, _free_cluster(), 64, costs=m)
    assert one.step_s == pytest.approx(sum(per[64]))
    split = sim.manual_split(net, _free_cluster(), 64, devices=2, bounds=[2], costs=m)
    computed = sum(s.duration for s in split if s.kind == COMPUTE)
    assert computed == pytest.approx(sum(per[64]) + sum(call))
    # the update: its call once per rank, the rest by the rank's share of the parameters
    assert m.update_s(net.params) == pytest.approx(per[64][2])
    assert m.update_s(0) == pytest.approx(call[2])
    # without the one-layer timings: no call, the intercepts shared by the layers
    plain = sim.Measured.from_timeline({b: tl(*per[b]) for b in per}, net)
    assert plain.call_s == (0.0, 0.0, 0.0)
    assert sim.single_device(net, _free_cluster(), 64, costs=plain).step_s == \
        pytest.approx(sum(per[64]))


def test_the_roofline_takes_the_slower_of_compute_and_memory():
    net = sim.Network.mlp((1024, 1024))
    fast_memory = _cluster(memory_bandwidth_Bps=1e15)
    slow_memory = _cluster(memory_bandwidth_Bps=1e6)
    r = sim.Roofline(net, fast_memory)
    assert r.forward_s(0, 10) == pytest.approx(2 * 1024 * 1024 * 10 / 1e12, rel=1e-3)
    assert sim.Roofline(net, slow_memory).forward_s(0, 10) > 1.0    # 4 MB of weights at 1 MB/s
    assert r.backward_s(0, 10) == pytest.approx(2 * r.forward_s(0, 10))


# ------------------------------------------------------------------ memory
def test_adam_in_mixed_precision_keeps_16_bytes_per_parameter_without_zero():
    net = sim.Network.transformer("tiny", 4, 256, 4, 64, vocab=1000)
    mem = sim.memory(net, 8, dp=4)
    assert mem.states == pytest.approx(16 * net.params)
    assert (mem.params, mem.grads, mem.optimizer) == (2 * net.params, 2 * net.params,
                                                      12 * net.params)
    assert sim.memory(sim.Network.mlp((8, 8)), 8).states == 8 * 72       # SGD fp32: 4 + 4


def test_memory_falls_with_stages_and_tensor_parallel_and_1f1b_keeps_fewer_micro_batches():
    from parlab.pipeline import one_f_one_b, peak_in_flight
    net, _ = _even(8, 256)
    one = sim.memory(net, 64)
    tp = sim.memory(net, 64, tp=4)
    assert tp.states == pytest.approx(one.states / 4) and tp.activations == pytest.approx(
        one.activations / 4)
    gp = sim.memory_per_device(net, 64, pp=4, micro_batches=8, schedule="gpipe")
    fb = sim.memory_per_device(net, 64, pp=4, micro_batches=8, schedule="1f1b")
    per_mb = gp[0].activations / 8
    assert [m.activations / per_mb for m in fb] == pytest.approx(peak_in_flight(one_f_one_b(4, 8)))
    assert gp[0].states == pytest.approx(one.states / 4)


def test_a_model_that_does_not_fit_says_what_to_change():
    net = sim.Network.transformer("GPT-2 XL", 48, 1600, 25, 1024, vocab=50257)
    mem = sim.memory(net, 8, cluster=sim.t4_pcie())
    assert not mem.fits
    with pytest.raises(sim.DoesNotFit, match="tensor parallel.*ZeRO"):
        mem.check()
    assert sim.memory(sim.Network.mlp((64, 256, 10)), 64, cluster=sim.t4_pcie()).check().fits


# ------------------------------------------------------------------ published figures
def test_the_model_reproduces_published_figures_within_15_percent():
    from parlab.sim import published
    found = published.checks()
    names = " ".join(c.name for c in found)
    assert "GPipe" in names and "Megatron" in names and "nccl-tests" in names
    for c in found:
        assert c.within, str(c)
        assert str(c).startswith(f"sim vs published: {c.name} predicted")


# ------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize("call,match", [
    (lambda n, c: sim.data_parallel(n, c, 64, devices=3), "does not split into 3"),
    (lambda n, c: sim.data_parallel(n, c, 64, devices=0), "devices must be a whole number >= 1"),
    (lambda n, c: sim.tensor_parallel(n, c, 64, devices=2.0), "whole number"),
    (lambda n, c: sim.pipeline(n, c, 64, stages=True), "whole number"),
    (lambda n, c: sim.pipeline(n, c, 64, stages=2, micro_batches=3), "does not split into 3"),
    (lambda n, c: sim.pipeline(n, c, 64, stages=8), "8 stages need at least 8 layers"),
    (lambda n, c: sim.pipeline(n, c, 64, stages=2, micro_batches=3, schedule="interleaved"),
     "does not split|multiple of 2"),
    (lambda n, c: sim.pipeline(n, c, 60, stages=4, micro_batches=6, schedule="interleaved",
                               chunks=1), "chunks >= 2|4 layers"),
    (lambda n, c: sim.manual_split(n, c, 64, devices=2, bounds=[4]), "must rise strictly"),
    (lambda n, c: sim.hybrid(n, c, 64, dp=8, tp=4), "needs 32 devices"),
    (lambda n, c: sim.tensor_parallel(n, c, 64, scheme="rows"), "scheme must be one of"),
    (lambda n, c: sim.parameter_server(n, c, 64, slow={0: 3}), "keys must be worker ranks"),
    (lambda n, c: sim.timeline("zero", n, c, 64), "strategy must be one of"),
    (lambda n, c: sim.memory(n, 64, dp=2.5), "whole number"),
])
def test_bad_inputs_are_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(sim.Network.mlp((64, 256, 256, 128, 10)), _cluster())


def test_programs_that_deadlock_are_refused_with_where_they_stuck():
    from parlab.sim import engine
    progs = [[engine.Recv(1, 4)], [engine.Recv(0, 4)]]
    with pytest.raises(sim.Deadlock, match="rank 0 at Recv"):
        engine.run(progs)


def test_a_rank_that_blocked_resumes_a_wake_up_later():
    """On a busy CPU a blocked receiver is scheduled again late: the split pays it twice
    a step (the second stage waits for the activation, the first for the gradient)."""
    net, costs = _even(4)
    quick = sim.manual_split(net, _free_cluster(), 64, devices=2, bounds=[2], costs=costs)
    slow = sim.manual_split(net, _free_cluster(wake_latency_s=1e-3), 64, devices=2, bounds=[2],
                            costs=costs)
    assert slow.step_s == pytest.approx(quick.step_s + 2e-3)
    # every collective pays one: its members never arrive together on a busy CPU
    tp0 = sim.tensor_parallel(net, _free_cluster(), 64, devices=2, costs=costs)
    tp1 = sim.tensor_parallel(net, _free_cluster(wake_latency_s=1e-3), 64, devices=2, costs=costs)
    collectives = sum(1 for s in tp0 if s.rank == 0 and s.kind == COMM)
    assert collectives == 3 and tp1.step_s == pytest.approx(tp0.step_s + 3e-3)


def test_a_receive_s_wake_up_grows_with_how_long_it_blocked():
    """With a measured wake curve a receive that blocked b seconds resumes late by the line
    through the points at b (nothing at no block, flat after the last point)."""
    from parlab.sim.engine import wake_after
    curve = ((0.002, 1e-4), (0.02, 7e-4))
    assert wake_after(0.0, curve) == 0.0
    assert wake_after(0.001, curve) == pytest.approx(5e-5)
    assert wake_after(0.011, curve) == pytest.approx(4e-4)
    assert wake_after(0.5, curve) == pytest.approx(7e-4)
    # lab 02's receives block for as long as the other stage computes: the second stage
    # for the first's forward (2 ms), the first for the second's forward and backward
    # (6 ms, and the second's wake-up); the curve, not wake_latency_s, prices both
    net, costs = _even(4)
    quick = sim.manual_split(net, _free_cluster(), 64, devices=2, bounds=[2], costs=costs)
    assert [s.duration for s in quick if s.kind == WAIT] == pytest.approx([6e-3, 2e-3])
    slow = sim.manual_split(net, _free_cluster(wake_latency_s=1e-3, wake_curve=curve), 64,
                            devices=2, bounds=[2], costs=costs)
    second = wake_after(2e-3, curve)
    assert slow.step_s == pytest.approx(quick.step_s + second + wake_after(6e-3 + second, curve))
    with pytest.raises(ValueError, match="wake_curve"):
        _free_cluster(wake_curve=((0.002, -1.0),))


def test_a_bucket_s_all_reduce_starts_and_lands_after_its_handoff():
    """A measured hand-off: DDP's bucket all-reduce starts ``before`` after the backward
    that fills it, and the rank waiting for it resumes ``after`` after it ends (on free
    links, all that the update waits for)."""
    net, costs = _even(4)
    plain = sim.data_parallel(net, _cluster(devices=2), 64, devices=2, costs=costs)
    slow = sim.data_parallel(net, _cluster(devices=2, handoff_s=(2e-4, 5e-4)), 64, devices=2,
                             costs=costs)
    reduce = [s for s in plain if s.rank == 2 and s.kind == COMM]
    moved = [s for s in slow if s.rank == 2 and s.kind == COMM]
    assert [s.start + 2e-4 for s in reduce] == pytest.approx([s.start for s in moved])
    assert slow.step_s == pytest.approx(plain.step_s + 7e-4)
    hidden = sim.data_parallel(net, _free_cluster(devices=2, handoff_s=(0.0, 5e-4)), 64,
                               devices=2, buckets=4, costs=costs)
    waits = [s for s in hidden if s.rank < 2 and s.kind == WAIT]
    assert waits and all(s.duration == pytest.approx(5e-4) for s in waits)
    with pytest.raises(ValueError, match="handoff_s"):
        _free_cluster(handoff_s=(1e-4,))


def test_presets_derate_their_datasheets_and_say_so():
    h100, a100, t4 = sim.h100_nvlink(), sim.a100_nvlink(), sim.t4_pcie()
    # the maximum achievable matrix rate, not the peak (989 and 312 TFLOP/s)
    assert h100.flops == h100.matrix.rate == 794.5e12 and h100.matrix.sms == 132
    assert a100.flops == a100.matrix.rate == 271.2e12 and a100.matrix.sms == 108
    # no published maximum: the share of the peak that the A100's and H100's reach
    assert t4.flops == pytest.approx((271.2 / 312 + 794.5 / 989) / 2 * 65e12)
    assert h100.intra.bandwidth_Bps == pytest.approx(0.8 * 450e9)
    assert a100.memory_bandwidth_Bps == pytest.approx(0.9 * 2039e9)
    assert t4.memory_bytes == 16e9 and t4.devices == 2
    ib = sim.h100_infiniband(2)
    assert ib.devices == 16 and ib.link(16) is ib.inter and ib.link(8) is ib.intra
    assert ib.inter.bandwidth_Bps == pytest.approx(0.95 * 50e9)    # a card, near line rate
    assert ib.inter.bandwidth_Bps < ib.intra.bandwidth_Bps / 5
    # the same step is faster on faster hardware
    net = sim.Network.transformer("small", 4, 1024, 16, 512)
    times = [sim.data_parallel(net, c, 16, devices=2).step_s for c in (t4, a100, h100)]
    assert times == sorted(times, reverse=True)


def test_ranks_sharing_cores_compute_at_the_shared_rate():
    """4 simulated devices on 2 cores: when all compute at once each runs at half speed;
    a pipeline's stages, rarely all busy, lose less."""
    net, costs = _even(4)
    own = sim.data_parallel(net, _free_cluster(), 256, devices=4, overlap=False, costs=costs)
    shared = sim.data_parallel(net, _free_cluster(cores=2), 256, devices=4, overlap=False,
                               costs=costs)
    assert shared.step_s == pytest.approx(2 * own.step_s)
    two = sim.data_parallel(net, _free_cluster(cores=2), 128, devices=2, overlap=False, costs=costs)
    assert two.step_s == pytest.approx(own.step_s)              # 2 ranks, 2 cores: no loss
    pipe = dict(stages=4, micro_batches=4, schedule="1f1b", costs=costs)
    p_own = sim.pipeline(net, _free_cluster(), 256, **pipe)
    p_shared = sim.pipeline(net, _free_cluster(cores=2), 256, **pipe)
    assert p_own.step_s < p_shared.step_s < 2 * p_own.step_s


def test_oversubscribed_cores_make_every_wake_up_and_ring_step_dearer():
    """More runnable threads than cores: a woken rank queues behind threads / cores per
    core (each wake-up costs wake × threads / cores), and a collective pays one wake-up
    per ring step, 2(n - 1), besides the rendezvous's (not queued: its members all block
    in it)."""
    from parlab.sim.engine import oversubscription, ring_wakeups_s
    assert oversubscription(4, 2) == 2 and oversubscription(2, 2) == 1
    assert oversubscription(3, 2) == 1.5 and oversubscription(8, 0) == 1    # GPUs: own cores
    assert ring_wakeups_s(4, 1e-3, 2.0) == pytest.approx(6e-3)
    assert ring_wakeups_s(4, 1e-3, 1.0) == 0 and ring_wakeups_s(1, 1e-3, 2.0) == 0
    net, costs = _even(4)
    step = lambda devices, **kw: sim.data_parallel(  # noqa: E731
        net, _free_cluster(cores=2, **kw), 64 * devices, devices=devices, overlap=False,
        costs=costs).step_s
    # 4 ranks on 2 cores: one all-reduce a step; rendezvous 2 × 1 ms, 6 ring steps 1 ms each
    assert step(4, wake_latency_s=1e-3) == pytest.approx(step(4) + 2e-3 + 6e-3)
    # 2 ranks on 2 cores are not oversubscribed: the one wake-up of the rendezvous only
    assert step(2, wake_latency_s=1e-3) == pytest.approx(step(2) + 1e-3)
    # DDP's communication thread counts where it runs beside its rank's compute: with
    # two buckets, 2 ranks + 2 lanes on 2 cores are oversubscribed; with one, posted after
    # the last backward pass, the lane runs only while its rank waits for it: one wake-up
    ddp = lambda buckets, **kw: sim.data_parallel(  # noqa: E731
        net, _free_cluster(cores=2, **kw), 128, devices=2, buckets=buckets, overlap=True,
        costs=costs).step_s
    assert ddp(1, wake_latency_s=1e-3) == pytest.approx(ddp(1) + 1e-3)
    # two: the last bucket's rendezvous queues (2 x 1 ms) and its 2 ring steps pay 1 ms each
    assert ddp(2, wake_latency_s=1e-3) == pytest.approx(ddp(2) + 2e-3 + 2e-3)


def test_a_lane_counts_as_a_thread_only_where_it_runs_beside_its_rank_s_compute():
    from parlab.sim.engine import Collective, Compute, Join, lane_runs_beside_compute
    bucket = Collective((0, 1), 100, 1e-3, background=True)
    assert not lane_runs_beside_compute([Compute("backward", 1e-3), bucket, Join(),
                                         Compute("update", 1e-3)])
    assert lane_runs_beside_compute([Compute("backward", 1e-3), bucket,
                                     Compute("backward", 1e-3), bucket, Join()])
    # a join that leaves the last one running: the lane runs beside what follows
    assert lane_runs_beside_compute([bucket, Join(leave=1), Compute("forward", 1e-3)])
    assert not lane_runs_beside_compute([Compute("forward", 1e-3), Join()])


def test_ddp_s_wrapper_adds_its_measured_cost_to_the_step_s_first_passes():
    """``ddp_wrapper_s`` (forward, backward): DDP's hooks, measured, on each step's
    forward and backward spans; only where the gradients go in overlapped buckets (DDP),
    not after the backward (lab 05 by hand) nor on one device."""
    net, costs = _even(4)

    def run(overlap=True, devices=2, **kw):
        return sim.data_parallel(net, _free_cluster(**kw), 64 * devices, devices=devices,
                                 overlap=overlap, steps=2, costs=costs)
    plain, wrapped = run(), run(ddp_wrapper_s=(2e-4, 3e-4))
    for phase, extra in (("forward", 2e-4), ("backward", 3e-4)):
        before = [s.duration for s in plain if s.rank == 0 and s.name == phase]
        after = [s.duration for s in wrapped if s.rank == 0 and s.name == phase]
        assert len(after) == len(before) == 2          # one span a step, the cost inside it
        assert after == pytest.approx([t + extra for t in before])
    assert wrapped.step_s == pytest.approx(plain.step_s + 5e-4)
    assert run(False, ddp_wrapper_s=(2e-4, 3e-4)).step_s == pytest.approx(run(False).step_s)
    assert run(devices=1, ddp_wrapper_s=(2e-4, 3e-4)).step_s == pytest.approx(
        run(devices=1).step_s)
    with pytest.raises(ValueError, match="ddp_wrapper_s"):
        _free_cluster(ddp_wrapper_s=(1e-4, -1.0))


def test_collectives_back_to_back_pay_no_rendezvous_wake_up_where_the_ranks_fit_the_cores():
    """Lab 05 by hand: one all-reduce per tensor, one after the other. Its members leave
    one together and reach the next together, so only the first, after the backward pass,
    pays the rendezvous's wake-up; on oversubscribed cores every one still does."""
    net, costs = _even(4)

    def by_hand(devices, **kw):
        tl = sim.data_parallel(net, _free_cluster(cores=2, **kw), 64 * devices,
                               devices=devices, buckets="per_tensor", overlap=False,
                               costs=costs)
        return tl.step_s, sum(1 for s in tl if s.rank == 0 and s.kind == COMM) // tl.steps
    (quick, n), (slow, _) = by_hand(2), by_hand(2, wake_latency_s=1e-3)
    assert n == 8 and slow == pytest.approx(quick + 1e-3)
    (quick4, n4), (slow4, _) = by_hand(4), by_hand(4, wake_latency_s=1e-3)
    # 4 ranks on 2 cores: each of the 8 pays its rendezvous (2 x 1 ms) and 6 ring steps
    assert n4 == 8 and slow4 == pytest.approx(quick4 + 8 * (2e-3 + 6e-3))


def _comm_s(tl):
    return [s.duration for s in tl.spans if s.kind == "comm"]


def test_a_transfer_shares_the_cores_with_the_ranks_computing_as_it_starts():
    """gloo moves the bytes on a thread at each end: a message that starts while a rank
    computes on 2 cores makes 3 runnable threads, and takes 3/2 of its time; with the
    cores free, or each rank on a processor of its own, it takes its price."""
    from parlab.sim.engine import Collective, Compute, Recv, Send, run
    busy = [[Send(1, 100, 1e-3), Compute("next", 10e-3)], [Recv(0, 100)]]
    assert _comm_s(run(busy, cores=0)) == [pytest.approx(1e-3)]           # GPUs: own cores
    assert _comm_s(run(busy, cores=2)) == [pytest.approx(1.5e-3)]
    assert _comm_s(run(busy, cores=4)) == [pytest.approx(1e-3)]           # 3 threads, 4 cores
    idle = [[Send(1, 100, 1e-3)], [Recv(0, 100)]]
    assert _comm_s(run(idle, cores=2)) == [pytest.approx(1e-3)]
    # a collective of two while a third rank computes: 3 threads on 2 cores, one time for
    # both members, whichever of them the engine settles it for first
    pair = Collective((0, 1), 100, 2e-3)
    tl = run([[pair], [pair], [Compute("other", 10e-3)]], cores=2)
    assert _comm_s(tl) == [pytest.approx(3e-3)] * 2


def test_messages_take_a_measured_stray_drawn_once_each_and_repeatably():
    """With the strays a machine measured, every message takes its price plus one of
    them (both ends the same), never less than nothing; the same programs give the same
    timeline; without strays, the price."""
    from parlab.sim.engine import Collective, Recv, Send, run
    progs = [[Send(1, 100, 1e-3, blocking=True) for _ in range(20)]
             + [Collective((0, 1), 100, 2e-3)] * 20,
             [Recv(0, 100) for _ in range(20)] + [Collective((0, 1), 100, 2e-3)] * 20]
    spread = ((-2e-3, 0.0, 5e-3), (1e-3, 7e-3))
    a, b = run(progs, spread=spread), run(progs, spread=spread)
    assert [s.duration for s in a.spans] == [s.duration for s in b.spans]
    p2p = [s for s in a.spans if s.kind == "comm" and s.name == "send"]
    assert {round(s.duration, 9) for s in p2p} <= {0.0, 1e-3, 6e-3}      # 1 - 2 ms: nothing
    assert len({round(s.duration, 9) for s in p2p}) > 1                   # drawn, not fixed
    def times(rank, name):
        return [s.duration for s in a.spans if s.kind == "comm" and s.rank == rank
                and s.name == name]
    # each message: one time at both ends
    assert times(0, "send") == times(1, "recv")
    assert times(0, "all-reduce") == times(1, "all-reduce")
    colls = {round(s.duration, 9) for s in a.spans if s.name == "all-reduce"}
    assert colls <= {3e-3, 9e-3}
    assert sorted(_comm_s(run(progs))) == [pytest.approx(1e-3)] * 40 + [pytest.approx(2e-3)] * 40


def test_a_one_pass_collective_meets_the_all_reduces_strays_half_as_often():
    """The strays are measured on 2-rank all-reduces (two passes round the ring); an
    all-gather or a reduce-scatter (one pass) takes one with probability 1/2, else its
    price; an all-reduce takes one every time."""
    from parlab.sim.engine import Collective, run
    gather, reduce = Collective((0, 1), 100, 1e-3, "all-gather"), Collective((0, 1), 100, 1e-3)
    assert (gather.passes, reduce.passes) == (1, 2)
    assert Collective((0, 1), 100, 1e-3, "reduce-scatter grads").passes == 1
    progs = [[gather, reduce] * 200] * 2
    tl = run(progs, spread=((), (4e-3,)))
    def strayed(name):
        return [s.duration > 2e-3 for s in tl.spans if s.kind == "comm" and s.rank == 0
                and s.name == name]
    assert all(strayed("all-reduce")) and len(strayed("all-reduce")) == 200
    assert 70 <= sum(strayed("all-gather")) <= 130          # binomial(200, 1/2): 5 sd
    assert [s.duration for s in tl.spans] == [s.duration for s in run(progs, spread=(
        (), (4e-3,))).spans]                                   # seeded: the same again


def test_a_one_pass_collective_pays_no_wake_up_at_its_start_where_the_ranks_fit_the_cores():
    """Every collective waits one wake-up after its last member arrives (one member
    blocked), except back to back or in one pass where the ranks fit the cores (an
    all-gather meets only its half of the strays); oversubscribed, a one-pass one, half."""
    from parlab.sim.engine import Collective, Compute, run

    def pair(name):                     # both ranks compute 1 ms, then meet in ``name``
        return [[Compute("forward", 1e-3), Collective((0, 1), 100, 1e-3, name)]] * 2
    for name, wake in (("all-reduce", 4e-4), ("all-gather", 0.0), ("reduce-scatter", 0.0)):
        tl = run(pair(name), wake_s=4e-4, cores=2)
        waits = [s.duration for s in tl.spans if s.kind == "wait" and s.rank == 0]
        assert waits == ([pytest.approx(wake)] if wake else []), name
        assert tl.duration == pytest.approx(2e-3 + wake)
    back_to_back = [[Collective((0, 1), 100, 1e-3, "all-reduce")] * 2] * 2
    tl = run(back_to_back, wake_s=4e-4, cores=2)
    assert tl.duration == pytest.approx(2e-3 + 4e-4)        # the first only
    def start_wait(name):                                    # 2 ranks on 1 core
        return [s.duration for s in run(pair(name), wake_s=4e-4, cores=1).spans
                if s.kind == "wait" and s.rank == 0][0]
    assert start_wait("all-gather") == pytest.approx(start_wait("all-reduce") / 2)
    assert start_wait("all-reduce") == pytest.approx(2 * 4e-4)   # queued behind 2 per core


def test_an_isend_leaves_late_by_the_held_share_of_what_its_rank_computes_before_it_blocks():
    """gloo's thread that writes an isend shares its pinned rank's core: in a measured
    share of the sends it waits for the rank's compute after the post to end. The engine
    delays the data by that share of the compute (further isends do not stop the count; a
    receive, which may block, does); a blocking send, and a held share of 0, not at all."""
    from parlab.sim.engine import Compute, Recv, Send, held_s, run
    isend = Send(1, 100, 1e-3)

    def received_at(first, held, then=()):          # when rank 1's receive ends
        tl = run([first, [Recv(0, 100), *then]], held=held)
        return min(s.end for s in tl.spans if s.rank == 1 and s.kind == "comm")
    computing = [isend, Compute("forward", 4e-3), Send(1, 100, 1e-3), Compute("f", 2e-3),
                 Recv(1, 100), Compute("backward", 8e-3)]
    assert held_s(0.25, computing, 0) == pytest.approx(0.25 * 6e-3)
    assert held_s(0.25, computing, 2) == pytest.approx(0.25 * 2e-3)
    assert held_s(0.0, computing, 0) == 0.0
    assert received_at(computing[:2], 0.25) == pytest.approx(1e-3 + 1e-3)
    assert received_at(computing[:2], 0.0) == pytest.approx(1e-3)
    assert received_at([isend, Recv(1, 100), Compute("f", 4e-3)], 0.25,
                       then=[Send(0, 100, 1e-3)]) == pytest.approx(1e-3)   # a receive next
    blocking = Send(1, 100, 1e-3, blocking=True)
    assert received_at([blocking, Compute("forward", 4e-3)], 0.25) == pytest.approx(1e-3)
    # the cluster carries the measured share to every strategy's engine
    assert _free_cluster(held_send_share=0.25).held_send_share == 0.25
    for bad in (-0.1, 1.5, float("nan"), "a quarter", True):
        with pytest.raises(ValueError, match="held_send_share"):
            _free_cluster(held_send_share=bad)


def test_a_gpipe_stage_s_isends_are_held_where_1f1b_s_are_not():
    """GPipe's stages send each micro-batch and compute the next (held); 1F1B's last
    stage sends a gradient and then waits for the next activation (not held): a held
    share lengthens GPipe's predicted step more than 1F1B's."""
    net, costs = _even(4)
    def step(schedule, held):
        return sim.pipeline(net, _free_cluster(held_send_share=held), 64, stages=2,
                            micro_batches=4, schedule=schedule, costs=costs).step_s
    gpipe, one_f_one_b = (step(s, 0.25) - step(s, 0.0) for s in ("gpipe", "1f1b"))
    assert gpipe > one_f_one_b >= 0 and gpipe > 0


def test_the_strays_of_a_sweep_are_each_message_less_its_price():
    from parlab.sim import calibrate
    link = sim.Link(1e-4, 1e9)
    records = [{"op": "send_recv", "world_size": 2, "bytes": 1000, "times_s": (1e-4, 3e-3)},
               {"op": "all_reduce", "world_size": 2, "bytes": 1000, "times_s": (5e-4,)},
               {"op": "all_reduce", "world_size": 4, "bytes": 1000, "times_s": (9.0,)}]
    p2p, coll = calibrate.spread_from_records(records, link, overhead_s=1e-4)
    assert p2p == pytest.approx((1e-4 - link.time(1000), 3e-3 - link.time(1000)))
    assert coll == pytest.approx((5e-4 - sim.all_reduce_s(1000, 2, link) - 1e-4,))
    with pytest.raises(ValueError, match="message_spread_s must be a tuple"):
        _cluster(message_spread_s=[1e-3])


def test_a_compute_fit_whose_larger_steps_were_no_slower_charges_the_steps_to_arithmetic():
    from parlab.sim import calibrate
    rate, fixed = calibrate.fit_compute([1e9, 2e9, 4e9], [0.010, 0.020, 0.040], layers=4)
    assert rate == pytest.approx(1e11) and fixed == pytest.approx(0.0, abs=1e-12)
    rate, fixed = calibrate.fit_compute([1e9, 2e9, 4e9], [0.012, 0.014, 0.018], layers=4)
    assert rate == pytest.approx(1 / 2e-12) and fixed == pytest.approx(0.010 / 8)
    # noise bigger than the arithmetic: the largest step no slower than the smallest
    rate, fixed = calibrate.fit_compute([1e9, 2e9, 4e9], [0.012, 0.011, 0.0115], layers=4)
    assert fixed == 0.0 and 1e11 < rate < 1e12          # a finite rate, all of each step


def test_pipeline_costs_are_the_stages_summed_and_shared_by_arithmetic():
    """lab 04's calibration: per m, the stages' median F and B add up to the network's
    pass for one micro-batch; a line through them; the rows' part shared by FLOPs."""
    from parlab.sim import calibrate
    from parlab.trace import Span, Timeline
    net = sim.Network.mlp((64, 512, 512, 512, 10))
    # stage 0 F = 1 ms + 0.01 ms per row, stage 1 twice that; B twice F; m = 1 and 4
    timelines = {}
    for m in (1, 4):
        rows, spans, t = 400 / m, [], 0.0
        for k in range(m):
            for r, scale in ((0, 1.0), (1, 2.0)):
                for kind, x in (("F", 1.0), ("B", 2.0)):
                    d = x * scale * (1e-3 + 1e-5 * rows)
                    spans.append(Span(r, COMPUTE, f"{kind}{k}", t, t + d))
                    t += d
        spans.append(Span(0, COMPUTE, "update", t, t + 1e-3))
        timelines[m] = Timeline(spans)
    costs = calibrate.costs_from_pipeline(net, timelines, 400, stages=2)
    for rows in (100, 400):
        whole_f = sum(costs.forward_s(i, rows) for i in range(len(net)))
        whole_b = sum(costs.backward_s(i, rows) for i in range(len(net)))
        # one fixed part per layer pass (Measured.fixed_s), shared by F and B alike
        assert whole_f + whole_b == pytest.approx(9 * (1e-3 + 1e-5 * rows))
        assert whole_f - whole_b == pytest.approx(-3e-5 * rows)
    grows = [costs.forward_s(i, 400) - costs.fixed_s for i in range(len(net))]
    assert grows[0] / grows[1] == pytest.approx(64 / 512, rel=0.01)   # 64 inputs: an eighth
    assert costs.update_s(net.params) == pytest.approx(2e-3)
