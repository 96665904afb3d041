"""The published runs expressed through the cost model (parlab.sim.validate): the networks
are the published architectures (parameter counts as their papers print them), each
hardware record builds its preset, the summary model's new options do what they say,
and every run gets a prediction or a reason."""
import math

import pytest

from parlab import sim
from parlab.sim import collectives as col
from parlab.sim import convnets, imagenet, validate
from parlab.sim import published_runs as pr
from parlab.sim.published_setups import HARDWARE

N = sim.Network


# ------------------------------------------------------------------ the architectures
@pytest.mark.parametrize("build,params", [
    (lambda: imagenet.vgg16(N), 138_357_544),            # Simonyan & Zisserman, torchvision
    (lambda: imagenet.resnet(N, 101), 44_549_160),       # He et al., torchvision
    (lambda: imagenet.inception_v3(N), 23_834_568),      # torchvision without the aux head
])
def test_classic_networks_have_their_published_parameter_counts(build, params):
    assert build().params == params


def test_amoebanet_d_is_gpipes_and_torchgpipes():
    """GPipe Table 1: AmoebaNet-D (18, 208) has 82 M parameters; torchgpipe's nn.Sequential
    of it has 24 layers (its balances sum to 24)."""
    net = imagenet.amoebanet_d(N, 224, 18, 208)
    assert net.params == pytest.approx(82e6, rel=0.01)
    assert len(net) == 24 == sum((7, 17))
    assert all(j - i == 2 for i, j in net.skips)          # each cell reads the two before
    # a cut carries both tensors: the cell before and the one before that
    assert net.cut_elems(10) == net.out_elems(9) + net.out_elems(8)


def test_torchgpipes_unet_has_its_241_modules_and_skips():
    net = convnets.unet_stacked(N, 192, 3, 1, 64, 5, 5)
    assert len(net) == 241 == sum((30, 66, 84, 61))
    assert len(net.skips) == 5
    # VGG-16's forward: 15.5 G multiply-adds at 224 px (Simonyan & Zisserman, table 4)
    assert sum(x.flops for x in imagenet.vgg16(N).layers) / 2 == pytest.approx(15.47e9, rel=0.01)


def test_float32_blocks_keep_and_move_twice_the_bytes():
    from parlab.sim.blocks import block
    half, full = block("b", 128, 256, 4), block("b", 128, 256, 4, act_bytes=4)
    assert full.saved_elems == pytest.approx(half.saved_elems, rel=0.2)   # elements, not bytes
    assert full.elementwise_bytes == pytest.approx(2 * half.elementwise_bytes)
    assert full.flops == half.flops and full.params == half.params


# ------------------------------------------------------------------ the hardware
@pytest.mark.parametrize("key", sorted(HARDWARE))
def test_every_hardware_record_builds_its_preset_at_any_size(key):
    from parlab.sim.published_setups import Parallel, Setup
    hw = HARDWARE[key]
    assert not hw.preset.startswith("new:")
    sizes = (1, hw.per_node, 4 * hw.per_node) if hw.nics else (1, hw.per_node)
    for gpus in sizes:                          # one host, or nodes of per_node devices
        c = validate.cluster_for(Setup(None, Parallel(gpus, None, None, dp=gpus), key))
        assert c.devices >= gpus and c.devices_per_node == hw.per_node
        assert c.memory_bytes == pytest.approx(hw.memory_gb * 1e9, rel=0.08)   # GB or GiB


def test_network_cards_per_node_follow_the_records():
    from parlab.sim import clusters
    assert col.cards_per_device(clusters.a800_nodes(2)) == pytest.approx(1 / 8)
    assert col.cards_per_device(clusters.a100_omnipath(2)) == pytest.approx(4 / 8)
    assert col.cards_per_device(clusters.p100_roce(2)) == pytest.approx(1 / 4)
    # a whole node's ring leaves through its one card: one card's bandwidth
    c = clusters.a800_nodes(2)
    assert col.ring_link(c, 16).bandwidth_Bps == pytest.approx(c.inter.bandwidth_Bps)


# ------------------------------------------------------------------ the summary's options
def _gpt():
    return sim.Network.transformer("gpt", 8, 1024, 16, 512, vocab=1000)


def test_zero_1_moves_an_all_reduces_bytes_in_two_halves_and_zero_3_half_as_much_again():
    w, c = sim.Workload.of(_gpt()), sim.h100_infiniband(2)
    plan = sim.Plan(dp=16)
    plain = sim.predict(w, c, plan, 16).parts["dp"]
    z1 = sim.predict(w, c, plan, 16, zero=1).parts["dp"]
    z3 = sim.predict(w, c, plan, 16, zero=3).parts["dp"]
    grads = w.params * 2
    half = col.half_ring_time(c, grads, 16)
    assert z1 == pytest.approx(2 * half)
    assert z3 == pytest.approx(3 * half)
    assert plain == pytest.approx(col.all_reduce_time(c, grads, 16))
    # ZeRO's states: 2 + 2 + 12/16 bytes a parameter at stage 1
    mem = sim.predict(w, c, plan, 16, zero=1).memory["states"]
    assert mem == pytest.approx(w.params * (4 + 12 / 16))


def test_hybrid_sharding_gathers_inside_a_node_and_all_reduces_shards_across():
    w, c = sim.Workload.of(_gpt()), sim.clusters.a100_ethernet(2)
    fsdp = sim.predict(w, c, sim.Plan(dp=16), 16, zero=3).parts["dp"]
    hsdp = sim.predict(w, c, sim.Plan(dp=16), 16, zero=3, sharding="hsdp").parts["dp"]
    grads = w.params * 2
    want = 3 * col.half_ring_time(c, grads, 8) + col.all_reduce_time(c, grads / 8, 2, 8)
    assert hsdp == pytest.approx(want) and hsdp < fsdp


def test_overlap_hides_data_parallel_traffic_behind_compute_but_not_the_last_bucket():
    net, c = _gpt(), sim.h100_infiniband(2)
    for buckets in (1, 4):
        w = sim.Workload.of(net, dp_messages=buckets)
        plain = sim.predict(w, c, sim.Plan(dp=16), 64)
        hidden = sim.predict(w, c, sim.Plan(dp=16), 64, overlap_dp=True)
        dp = plain.parts["dp"]
        assert hidden.parts["dp"] == pytest.approx(
            max(dp / buckets, dp - 2 / 3 * plain.parts["compute"]))
    assert hidden.parts["dp"] < plain.parts["dp"]


def test_interleaving_divides_the_bubble_and_bounds_set_the_busiest_stage():
    net = _gpt()
    w, c = sim.Workload.of(net), sim.h100_nvlink(8)
    plan = sim.Plan(pp=4, micro_batches=8)
    even = sim.predict(w, c, plan, 8)
    two = sim.predict(w, c, plan, 8, chunks=2)
    assert two.parts["bubble"] == pytest.approx(even.parts["bubble"] / 2)
    assert two.parts["pp"] == pytest.approx(2 * even.parts["pp"])
    # Megatron-LM's layout: 2 blocks a stage, the embedding first, the logits last
    bounds = validate.megatron_bounds(net, 4)
    assert bounds == [3, 5, 7]
    laid = sim.predict(w, c, plan, 8, bounds=bounds)
    assert laid.parts["compute"] > even.parts["compute"]        # the logits' stage is slower
    # blocks that do not divide: the embedding and the logits count as blocks
    llama = sim.Network.llama("l", 126, 256, 4, 64, 1000, kv_heads=2, ffn=512)
    assert validate.megatron_bounds(llama, 16)[:2] == [8, 16]


# ------------------------------------------------------------------ every run
def test_every_fitting_run_has_a_prediction_or_a_reason():
    for o in validate.outcomes(pr.fitting()):
        assert o.set == "fitting"
        if o.predicted is None:
            assert o.note, o.run.id
        else:
            assert math.isfinite(o.predicted) and o.predicted > 0, o.run.id
            assert o.line().startswith(f"sim vs published: {o.run.id} predicted ")


# ------------------------------------------------------------------ the printed lines
GOLDEN = __import__("pathlib").Path(__file__).with_name("published_predictions.txt")


def test_the_printed_lines_are_the_recorded_ones():
    """``python -m parlab bench --only sim`` prints these lines (every run of both sets and
    a summary per set) and the README quotes the summaries: the same every time, and a
    change to the model that moves any prediction fails here. After such a change, write
    the file again (``python -c "from parlab.sim import validate;
    print(*validate.lines(), sep=chr(10))" > tests/published_predictions.txt``) and say in
    the README what moved; the held-out set's first result stays recorded there."""
    want = GOLDEN.read_text().splitlines()
    got = validate.lines()
    assert len(got) == len(pr.FITTING) + len(pr.HELD_OUT) + 2
    for mine, theirs in zip(got, want):
        assert mine == theirs
    assert got[-2].startswith("sim vs published, fitting set: ")
    assert got[-1].startswith("sim vs published, held-out set: ")


def test_a_subset_prints_the_same_lines_and_its_own_summary():
    ids = {"zero-7p5b-stage1-dp64", "nccl-a800-8gpu", "opt-175b"}
    got = validate.lines(only=ids)
    want = [x for x in GOLDEN.read_text().splitlines()
            if any(f"sim vs published: {i} " in x for i in ids)]
    assert got[:3] == want
    assert "1 of 1 expressible" in got[3] and "0 of 0" not in got[3]
    assert "opt-175b: the figure's FLOP count is not stated" in got[4]
