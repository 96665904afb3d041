"""Context and expert parallelism in the predicted timelines (``sim.hybrid(cp=, ep=)``,
``sim.stage``): ring attention's K/V passes and a mixture's all-to-alls as events, checked
by hand and against the summary model (``sim.predict``), which prices the same causes in
closed form."""
import pytest

from parlab import sim
from parlab.sim.stage import Mesh

ALPHA, BETA = 1e-6, 1e9                       # 1 us, 1 GB/s inside a node


def flat_cluster(devices: int = 8) -> sim.Cluster:
    """No matrix unit: a layer's products take FLOPs / 1e12 s."""
    link = sim.Link(ALPHA, BETA)
    return sim.Cluster("hand", devices, 80e9, 1e12, 0.0, 8, link, link)


def spans(tl, rank, name):
    return [s for s in tl.spans if s.rank == rank and s.name == name]


def test_ring_passes_wait_by_hand():
    # one block, s 256, h 512, 8 heads of 64, 2 of them for keys and values; batch 2 over
    # cp 2: each rank one sequence's half. A pass carries the rank's K and V,
    # 2 x 256 x 128 x 2 bytes: 1 us + 131.072 us. The attention products, 134.2 us forward
    # and twice that backward, hide it: 1 pass against 134.2 / 2 us, then 3 against
    # 268.4 / 3 us. The rank waits 192.74 us for K/V in all (as ``summary_terms`` says)
    net = sim.Network.llama("one", 1, 512, 8, 256, kv_heads=2, ffn=1024)
    tl = sim.hybrid(net, flat_cluster(), 2, dp=1, cp=2)
    step = ALPHA + 2 * 256 * 128 * 2 / BETA
    fwd = 4 * 256 ** 2 * 512 / 1e12
    want = (step - fwd / 2) + 3 * (step - 2 * fwd / 3)
    for rank in (0, 1):
        waited = sum(s.end - s.start for s in spans(tl, rank, "wait for K/V"))
        assert waited == pytest.approx(want) == pytest.approx(192.74368e-6)
    passes = spans(tl, 2, "K/V pass")            # lane 2: rank 0's second lane
    assert len(passes) == 4 and all(s.bytes == 2 * 256 * 128 * 2 for s in passes)
    assert all(s.end - s.start == pytest.approx(step) for s in passes)
    assert tl.labels[2] == "rank 0 K/V passes (predicted)"


@pytest.mark.parametrize("cp, recompute, per_block", [(2, None, 1 + 3), (4, None, 3 + 7),
                                                       (4, "full", 2 * 3 + 7)])
def test_ring_passes_per_block(cp, recompute, per_block):
    net = sim.Network.llama("l", 3, 512, 8, 512, ffn=1024)
    tl = sim.hybrid(net, flat_cluster(8), 8, dp=2, cp=cp, micro_batches=2, recompute=recompute)
    lanes = tl.labels
    for rank in range(2 * cp):
        got = [s for s in tl.spans if s.rank == 2 * cp + rank and s.name == "K/V pass"]
        assert len(got) == 3 * 2 * per_block, lanes[2 * cp + rank]


def test_all_to_alls_by_hand():
    # 4 experts, 2 a token, one block of 256 tokens a rank: 2 x 256 x 512 routed
    # elements, 524288 bytes; over 4 ranks in a node 3 alpha + 3/4 x 524288 / 1 GB/s each,
    # dispatch and combine forward and backward
    net = sim.Network.llama("m", 1, 512, 8, 256, ffn=1024, experts=4, top_k=2)
    tl = sim.hybrid(net, flat_cluster(8), 4, dp=4, ep=4)
    one = 3 * ALPHA + 3 / 4 * 524288 / BETA
    for rank in range(4):
        got = [s for s in tl.spans if s.rank == rank and s.kind == "comm" and s.axis == "ep"]
        assert [s.name for s in got] == ["all-to-all dispatch", "all-to-all combine"] * 2
        assert all(s.bytes == 524288 and s.end - s.start == pytest.approx(one) for s in got)
    # ep = dp: every rank's experts are its own; only the dense gradients are averaged
    assert not [s for s in tl.spans if s.axis == "edp"]


def test_experts_gradients_go_over_the_ranks_that_hold_them():
    net = sim.Network.llama("m", 2, 512, 8, 256, ffn=1024, experts=4, top_k=2)
    wire = net.grad_wire_bytes
    experts = sum(x.expert_params for x in net.layers)
    tl = sim.hybrid(net, flat_cluster(8), 8, dp=8, ep=4)
    edp = [s for s in tl.spans if s.rank == 0 and s.kind == "comm" and s.axis == "edp"]
    dense = [s for s in tl.spans if s.rank == 0 and s.kind == "comm" and s.axis == "dp"]
    assert sum(s.bytes for s in edp) == pytest.approx(experts / 4 * wire)
    assert sum(s.bytes for s in dense) == pytest.approx((net.params - experts) * wire)
    # 2 ranks hold the same experts: one ring step each way, 1 alpha + S / 2 / B a pass
    nbytes = experts / 4 * wire
    assert sum(s.end - s.start for s in edp) == pytest.approx(2 * (ALPHA + nbytes / 2 / BETA))


def test_the_mesh_groups_cover_every_rank_once():
    m = Mesh(flat_cluster(16), dp=2, pp=2, tp=2, cp=2, ep=2)
    assert m.size == 16 and m.rank(1, 1, 1, 1) == 15 and m.rank(0, 0, 1, 1) == 3
    for s in range(2):
        for t in range(2):
            everyone = set(m.dp_group(s, t))
            assert len(everyone) == 4
            groups = {m.ep_group(d, s, t, q) for d in range(2) for q in range(2)}
            assert sorted(r for g in groups for r in g) == sorted(everyone)
            for d in range(2):
                for q in range(2):
                    r = m.rank(d, s, t, q)
                    assert set(m.ep_group(d, s, t, q)) & set(m.expert_dp_group(d, s, t, q)) == {r}
                    assert r in m.cp_group(d, s, t) and len(m.cp_group(d, s, t)) == 2


CASES = [
    ("long", dict(tp=8, cp=2), 2), ("long", dict(tp=4, cp=2, dp=2), 4),
    ("short", dict(tp=8, cp=4), 1), ("short", dict(tp=8, cp=2, dp=2), 2),
    ("moe", dict(dp=8, ep=8), 8), ("moe", dict(dp=4, tp=2, ep=4), 8),
    ("moe", dict(dp=16, ep=8), 16), ("moe", dict(dp=4, cp=2, ep=8), 8),
]
NETS = {
    "long": lambda: sim.Network.llama("long", 4, 4096, 32, 32768, kv_heads=8, ffn=14336),
    "short": lambda: sim.Network.llama("short", 4, 4096, 32, 2048, ffn=14336),
    "moe": lambda: sim.Network.llama("moe", 4, 2048, 16, 4096, ffn=4096, experts=8, top_k=2),
}


@pytest.mark.parametrize("which, shape, batch", CASES)
def test_the_timeline_agrees_with_the_summary(which, shape, batch):
    """Two ways to the same step: the event engine running every rank's program, and the
    summary's closed form. Without a pipeline they agree to rounding, whether the ring's
    passes hide (long sequences) or show (short ones, across nodes)."""
    net, c = NETS[which](), sim.h100_nodes(4)
    plan = sim.Plan(**{a: shape.get(a, 1) for a in ("dp", "tp", "cp", "ep")})
    want = sim.predict(sim.Workload.of(net), c, plan, batch)
    got = sim.hybrid(net, c, batch, **{"dp": 1, **shape})
    assert got.step_s == pytest.approx(want.step_s, rel=1e-9)
    if which == "short":
        assert want.parts["cp"] > 0


def test_bad_context_or_expert_settings_are_refused_by_name():
    net = sim.Network.decoder("d", 2, 256, 4, 16)
    plain = sim.Network.mlp([64, 64, 64])
    with pytest.raises(ValueError, match="cp=2 splits the sequences of transformer blocks"):
        sim.hybrid(plain, flat_cluster(), 4, dp=1, cp=2)
    with pytest.raises(ValueError, match="no expert layer"):
        sim.hybrid(net, flat_cluster(), 4, dp=2, ep=2)
    moe = sim.Network.llama("m", 1, 512, 8, 256, ffn=1024, experts=4, top_k=2)
    with pytest.raises(ValueError, match="ep=4 must divide dp × cp = 2"):
        sim.hybrid(moe, flat_cluster(), 4, dp=2, ep=4)
    with pytest.raises(ValueError, match="use zero=0 here"):
        sim.hybrid(moe, flat_cluster(), 4, dp=4, ep=2, zero=1)
    with pytest.raises(ValueError, match=r"1 × 1 × 4 × 4 \(dp × pp × cp × tp\) needs 16"):
        sim.hybrid(net, flat_cluster(8), 4, dp=1, tp=4, cp=4)


def test_an_ep_that_does_not_divide_the_experts_is_refused_everywhere():
    """Each rank holds whole experts: 8 experts split over ep 3 or 16 ranks are refused by
    predict, memory and hybrid, naming the experts."""
    net = sim.Network.llama("m", 1, 512, 8, 256, ffn=1024, experts=8, top_k=2)
    assert net.layers[0].experts == 8
    assert sim.Network.llama("d", 1, 512, 8, 256).layers[0].experts == 1
    for dp, ep in ((6, 3), (16, 16)):
        with pytest.raises(ValueError, match=f"predict: ep={ep} must divide the 8 experts"):
            sim.predict(sim.Workload.of(net), flat_cluster(16), sim.Plan(dp=dp, ep=ep), dp)
        with pytest.raises(ValueError, match=f"memory: ep={ep} must divide the 8 experts"):
            sim.memory(net, dp, dp=dp, ep=ep)
        with pytest.raises(ValueError, match=f"hybrid: ep={ep} must divide the 8 experts"):
            sim.hybrid(net, flat_cluster(16), dp, dp=dp, ep=ep)
