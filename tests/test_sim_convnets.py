"""Convolution layers, a U-Net and an AmoebaNet-like network in the cost model: their
numbers by hand, and every strategy and the memory model on them."""
import pytest

from parlab import sim
from parlab.sim import layers as L
from parlab.trace import COMM

LINK = sim.Link(1e-5, 1e10)


def _cluster(**kw):
    base = dict(name="toy", devices=8, memory_bytes=1e12, flops=1e12, layer_overhead_s=0.0,
                devices_per_node=8, intra=LINK, inter=LINK, memory_bandwidth_Bps=1e11)
    base.update(kw)
    return sim.Cluster(**base)


def test_a_convolution_counts_k2_cin_cout_parameters_and_2_k2_cin_cout_hw_flops():
    c = L.conv2d("c", 8, 8, 3, 16)                   # 3 x 3, "same" padding
    assert c.params == 9 * 3 * 16 + 16 == 448
    assert c.flops == 2 * 9 * 3 * 16 * 8 * 8 == 55296
    assert c.out_elems == 16 * 64
    assert c.saved_elems == 3 * 64 + 16 * 64             # its input and its ReLU's output
    (g,) = c.gemms                                       # implicit GEMM: pixels x c_out x 9 c_in
    assert (g.m, g.n, g.k, g.a_elems) == (64, 16, 27, 3 * 64) and g.flops == c.flops
    s2 = L.conv2d("s", 8, 8, 3, 16, stride=2)
    assert s2.out_elems == 16 * 16 and s2.flops == 2 * 9 * 3 * 16 * 16
    with pytest.raises(ValueError, match="does not divide by the stride"):
        L.conv2d("bad", 7, 7, 3, 16, stride=2)


def test_pool_upconv_and_concat():
    p = L.max_pool("p", 8, 8, 4)
    assert (p.params, p.flops, p.out_elems, p.saved_elems) == (0, 0.0, 4 * 16, 4 * 64)
    u = L.up_conv("u", 4, 4, 32, 16)                 # 2 x 2, stride 2: 4 x 4 -> 8 x 8
    assert u.params == 4 * 32 * 16 + 16 == 2064
    assert u.flops == 2 * 4 * 32 * 16 * 16 and u.out_elems == 16 * 64
    j = L.concat("j", 100, 28)
    assert (j.out_elems, j.saved_elems, j.flops) == (128, 0.0, 0.0)


def _tiny():
    """image 8, 1 channel in, 2 classes, base 2, depth 1: 7 x 1 + 3 = 10 layers."""
    return sim.Network.unet(image=8, in_channels=1, classes=2, base=2, depth=1)


def test_a_tiny_unet_by_hand():
    net = _tiny()
    names = [x.name for x in net.layers]
    assert names == ["enc0.conv0", "enc0.conv1", "enc0.pool", "bottleneck.conv0",
                     "bottleneck.conv1", "dec0.up", "dec0.concat", "dec0.conv0", "dec0.conv1",
                     "head"]
    # 1->2, 2->2, 2->4, 4->4 (3 x 3), up 4->2 (2 x 2), 4->2, 2->2 (3 x 3), head 2->2 (1 x 1)
    assert net.params == 20 + 38 + 76 + 148 + 34 + 74 + 38 + 6 == 434
    assert net.skips == ((1, 6),)                   # enc0.conv1 -> dec0.concat
    assert net.in_elems == 64


def test_a_cut_between_encoder_and_decoder_carries_the_skip():
    net = _tiny()
    # before the bottleneck: the pooled 2 x 4 x 4 and the skip 2 x 8 x 8 cross
    assert net.crossing(3) == [1, 2] and net.cut_elems(3) == 32 + 128
    # before the concat: the up-convolution's 2 x 8 x 8 and the skip
    assert net.crossing(6) == [1, 5] and net.cut_elems(6) == 128 + 128
    # after the concat the skip has been used: only the concat's 4 x 8 x 8
    assert net.crossing(7) == [6] and net.cut_elems(7) == 256
    assert net.cut_bytes(3, batch=5) == 160 * 5 * 4          # float32
    with pytest.raises(ValueError, match="0 < at < 10"):
        net.cut_elems(0)


def test_a_pipeline_sends_the_skip_tensors_across_its_cut():
    net, batch, m = _tiny(), 32, 4
    tl = sim.pipeline(net, _cluster(), batch, stages=2, micro_batches=m, schedule="gpipe",
                      bounds=[3])
    sends = [s for s in tl if s.kind == COMM and s.name == "recv"]   # isend: seen at the receiver
    assert len(sends) == 2 * m                        # forward and backward, per micro-batch
    assert {s.bytes for s in sends} == {160 * (batch // m) * 4}
    # 1F1B and a dp x pp hybrid cut where asked
    tl2 = sim.hybrid(net, _cluster(), batch, dp=2, pp=2, micro_batches=2, bounds=[6])
    assert {s.bytes for s in tl2 if s.kind == COMM and s.axis == "pp"} == {256 * 8 * 4}


def test_unet_runs_on_one_device_and_data_parallel():
    net = sim.Network.unet(image=64, in_channels=3, classes=3, base=8, depth=3)
    c = _cluster()
    one = sim.single_device(net, c, 16)
    assert one.step_s > 0
    dp = sim.data_parallel(net, c, 16, devices=4, overlap=False)
    (ar,) = [s for s in dp if s.kind == COMM and s.rank == 0]
    assert ar.bytes == 4 * net.params                # float32 gradients, one bucket


def test_unet_memory_per_stage_holds_its_layers_states_and_activations():
    net = _tiny()
    st = net.state                                    # Adam in float32: 4 + 4 + 8
    assert (st["params"], st["grads"], st["optimizer"]) == (4, 4, 8)
    whole = sim.memory(net, 8)
    assert whole.states == pytest.approx(16 * 434)
    saved = sum(x.saved_elems for x in net.layers)
    assert whole.activations == pytest.approx(saved * 8 * 4)
    stages = sim.memory_per_device(net, 8, pp=2, micro_batches=2, schedule="gpipe", bounds=[3])
    first = sum(x.params for x in net.layers[:3])
    assert stages[0].states == pytest.approx(16 * first)
    assert stages[1].states == pytest.approx(16 * (434 - first))
    # GPipe keeps both micro-batches' activations of the stage's layers
    assert stages[0].activations == pytest.approx(
        sum(x.saved_elems for x in net.layers[:3]) * 8 * 4)


def test_unet_parameters_match_pytorch():
    torch = pytest.importorskip("torch")
    from torch import nn

    def double(a, b):
        return [nn.Conv2d(a, b, 3, padding=1), nn.Conv2d(b, b, 3, padding=1)]
    base, depth, cin, classes = 64, 4, 1, 2
    mods, c = [], cin
    for d in range(depth + 1):
        mods += double(c, base << d)
        c = base << d
    for d in reversed(range(depth)):
        mods.append(nn.ConvTranspose2d(base << (d + 1), base << d, 2, stride=2))
        mods += double(2 * (base << d), base << d)
    mods.append(nn.Conv2d(base, classes, 1))
    want = sum(p.numel() for m in mods for p in m.parameters())
    assert sim.Network.unet(image=64, in_channels=cin, classes=classes, base=base,
                            depth=depth).params == want
    # a convolution's FLOPs as the course counts a PyTorch model's (torch.calibrate)
    from parlab.torch.calibrate import network_of
    seen = network_of(nn.Sequential(nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.ReLU()),
                      (16, 32, 32))
    mine = L.conv2d("c", 32, 32, 16, 32, stride=2)
    assert seen.layers[0].flops == mine.flops and seen.layers[0].params == mine.params
    assert seen.layers[0].out_elems == mine.out_elems
    del torch


def test_amoebanet_cells_read_the_two_cells_before():
    net = sim.Network.amoebanet(image=64, cells=6, filters=16, classes=10)
    # stem, 2 stem reductions, 2 + reduce + 2 + reduce + 2 cells, classifier
    assert len(net) == 1 + 2 + 6 + 2 + 1
    assert all((i - 2, i) in net.skips for i in range(2, len(net) - 1))
    # a cut between two cells carries the outputs of the two cells before it
    at = 6
    assert net.crossing(at) == [at - 2, at - 1]
    assert net.cut_elems(at) == net.layers[at - 2].out_elems + net.layers[at - 1].out_elems
    tl = sim.pipeline(net, _cluster(), 8, stages=4, micro_batches=2, schedule="1f1b")
    assert tl.step_s > 0
    flops = sum(x.flops for x in net.layers)
    assert flops == pytest.approx(sum(g.flops for x in net.layers for g in x.gemms))


@pytest.mark.parametrize("kw,match", [
    ({"image": 100, "depth": 3}, "multiple of 8"),
    ({"depth": -1}, "depth"),
    ({"base": 0}, "base"),
])
def test_bad_unets_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        sim.Network.unet(**kw)


def test_bad_skips_are_refused():
    net = _tiny()
    with pytest.raises(ValueError, match="a skip is"):
        sim.Network("n", net.layers, 64, skips=((5, 3),))
