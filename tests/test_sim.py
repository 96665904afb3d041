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
    assert p.parts["compute"] == pytest.approx(6 * w.params * 128 / 1e12)
    assert p.step_s == pytest.approx(p.parts["compute"])
    assert p.memory["states"] == 8 * w.params and p.fits


def test_pure_data_parallel_adds_one_ring_all_reduce_of_the_gradients():
    w = sim.Workload.mlp((64, 256, 256, 10))
    c = _cluster()
    p = sim.predict(w, c, sim.Plan(dp=4), 128)
    assert p.parts["dp"] == pytest.approx(sim.all_reduce_s(4 * w.params, 4, LINK))
    assert p.parts["compute"] == pytest.approx(6 * w.params * 32 / 1e12)   # a quarter of the batch
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
        "compute": {b: 2 * w.layers * per_layer + 6 * w.params * b / rate for b in (16, 64)},
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
