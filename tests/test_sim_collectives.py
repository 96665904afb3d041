"""Collectives over groups that span nodes (parlab.sim.collectives): multi-rail rings and
NVLink SHARP, by hand and against NCCL's published bus bandwidths."""
from dataclasses import replace

import pytest

from parlab import sim
from parlab.sim import collectives as col

GiB = 2**30


def _busbw(seconds, n, nbytes=4 * GiB):
    """nccl-tests' bus bandwidth: algbw x 2(n - 1)/n (doc/PERFORMANCE.md)."""
    return nbytes / seconds * 2 * (n - 1) / n


def test_a_group_inside_a_node_rings_over_nvlink():
    c = replace(sim.h100_nvlink(8), nvls=False)
    assert col.ring_link(c, 8) is c.intra
    t = col.all_reduce_time(c, GiB, 8)
    assert t == pytest.approx(2 * 7 * 3e-6 + 2 * 7 / 8 * GiB / (0.8 * 450e9))


CARD = 0.95 * 50e9           # an NDR card, sustained (clusters.SUSTAINED_NIC)


def test_across_nodes_a_whole_node_drives_all_its_cards():
    """2 DGX H100s, dp over all 16: 8 members per node, 8 cards of 0.95 x 50 GB/s: the
    ring's bandwidth is min(NVLink 360, 8 x 47.5 = 380) GB/s, each step paying the card's
    latency."""
    c = replace(sim.h100_infiniband(2), nvls=False)
    assert col.members_per_node(c, 16, 1) == 8
    link = col.ring_link(c, 16, 1)
    assert link.bandwidth_Bps == pytest.approx(360e9) and link.latency_s == 8e-6
    assert col.all_reduce_time(c, GiB, 16) == pytest.approx(
        2 * 15 * 8e-6 + 2 * 15 / 16 * GiB / 360e9)
    # dp across nodes of a tp-8 mesh: one member per node, one card
    assert col.members_per_node(c, 2, 8) == 1
    assert col.ring_link(c, 2, 8).bandwidth_Bps == pytest.approx(CARD)
    # tp 2 inside, dp 8 across the two nodes: 4 members a node, 4 cards
    assert col.ring_link(c, 8, 2).bandwidth_Bps == pytest.approx(4 * CARD)
    # one card per ring, as before, was ~8x slower for the whole-node group (the latencies
    # are the same)
    one_card = sim.all_reduce_s(GiB, 16, c.inter)
    assert one_card / col.all_reduce_time(c, GiB, 16) == pytest.approx(360e9 / CARD, rel=0.05)


def test_fewer_cards_than_devices_share_them():
    c = replace(sim.h100_infiniband(2), nvls=False, nics_per_node=4)
    assert col.cards_per_device(c) == 0.5
    assert col.ring_link(c, 16, 1).bandwidth_Bps == pytest.approx(4 * CARD)


@pytest.mark.parametrize("n,published", [(4, 370), (5, 420), (6, 440), (7, 460), (8, 480)])
def test_nvlink_sharp_reaches_the_bus_bandwidth_nccl_measured(n, published):
    """NVIDIA/nccl issue 1455 (8 x H100 SXM, NCCL_ALGO=NVLS): bus bandwidth 370, 420, 440,
    460, 480 GB/s on 4-8 GPUs; the ring ~365-370. t = 2 alpha + S (1 + 1/n) / (0.86 B)."""
    c = sim.h100_nvlink(8)
    t = col.all_reduce_time(c, 4 * GiB, n)
    assert t == pytest.approx(min(
        2 * 3e-6 + 4 * GiB * (1 + 1 / n) / (0.86 * 360e9),
        sim.all_reduce_s(4 * GiB, n, c.intra)))
    assert _busbw(t, n) / 1e9 == pytest.approx(published, rel=0.05)
    ring = col.all_reduce_time(replace(c, nvls=False), 4 * GiB, n)
    assert _busbw(ring, n) / 1e9 == pytest.approx(360, rel=0.01)


def test_nvls_across_nodes_runs_the_slower_of_its_two_parts():
    c = sim.h100_infiniband(2)
    inside = 2 * 3e-6 + GiB * (1 + 1 / 8) / (0.86 * 360e9)
    across = sim.all_reduce_s(GiB / 8, 2, sim.Link(8e-6, CARD))
    ring = col.all_reduce_time(replace(c, nvls=False), GiB, 16)
    assert col.all_reduce_time(c, GiB, 16) == pytest.approx(min(max(inside, across), ring))
    # no in-switch reduction with one member a node
    assert col.nvls_s(c, GiB, 2, 8) == float("inf")


def test_half_a_ring_for_reduce_scatter_and_all_gather():
    c = replace(sim.h100_infiniband(2), nvls=False)
    assert col.half_ring_time(c, GiB, 16) == pytest.approx(15 * 8e-6 + 15 / 16 * GiB / 360e9)
    assert col.half_ring_time(c, GiB, 1) == 0.0


def test_the_summary_model_and_the_timelines_price_groups_the_same_way():
    c = sim.h100_infiniband(2)
    w = sim.Workload.transformer("gpt", 8, 4096, 32, 2048)
    p = sim.predict(w, c, sim.Plan(dp=2, tp=8), 16)
    assert p.links == {"dp": "inter", "tp": "intra"}
    assert "2 nodes, 1 per node, over 1 network card" in p.paths["dp"]
    assert "NVLink SHARP" in p.paths["tp"]
    grads = w.params / 8 * 2
    assert p.parts["dp"] == pytest.approx(col.all_reduce_time(c, grads, 2, 8))
    whole = sim.predict(w, c, sim.Plan(dp=16), 16)
    assert "8 network cards" in whole.paths["dp"]
    net = sim.Network.transformer("gpt", 4, 1024, 16, 512)
    tl = sim.data_parallel(net, c, 16, devices=16, overlap=False)
    (ar,) = [s for s in tl if s.rank == 0 and s.kind == "comm"]
    assert ar.duration == pytest.approx(col.all_reduce_time(c, 2 * net.params, 16, 1))
