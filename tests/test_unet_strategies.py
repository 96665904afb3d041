"""Lab 15: the U-Net under data parallel, a pipeline whose cut carries the skip
connections, and dp × pp on a mesh, each equal to one device; the bytes each rank
traced on each axis equal the formulas; serving from a fresh process."""
from dataclasses import replace

import numpy as np
import pytest
import torch

import parlab
from parlab import data
from parlab.course import lab15
from parlab.course import lab15_choose as choose
from parlab.metrics import max_difference, merged
from parlab.split import UNetConfig, crossing
from parlab.torch import models, unet

CFG = replace(lab15.CFG, steps=3)
LOSS_TOL, GRAD_TOL = 1e-5, 1e-6      # relative loss per step; first gradients
PARAM_TOL = 1e-4                     # after 3 Adam steps (Adam magnifies last-bit differences)


@pytest.fixture(scope="module")
def plans():
    """dp 4, pp 2 and dp 2 × pp 2, 3 steps each, one launch of 4 ranks."""
    return lab15.run_plans(cfg=CFG, pin_cores=False)


@pytest.fixture(scope="module")
def reference():
    return unet.train_single(CFG)


@pytest.mark.parametrize("plan", ["dp", "pp", "dp_pp"])
def test_each_plan_trains_like_one_device(plan, plans, reference):
    got = lab15.plan_outcome(plan, plans[plan]["results"])
    ref = np.asarray(reference["losses"])
    assert len(got["losses"]) == CFG.steps
    assert np.max(np.abs(np.asarray(got["losses"]) - ref) / ref) < LOSS_TOL
    assert got["first_grads"].keys() == reference["first_grads"].keys()
    assert max_difference(got["first_grads"], reference["first_grads"]) < GRAD_TOL
    assert max_difference(got["state"], reference["state"]) < PARAM_TOL
    assert got["replicas_identical"]


@pytest.mark.parametrize("plan", ["dp", "pp", "dp_pp"])
def test_each_rank_moves_the_formula_bytes_on_each_axis(plan, plans):
    moved = lab15.axis_bytes(plan, plans[plan], CFG)
    for rank, axes in moved["bytes"].items():
        for axis, (got, want) in axes.items():
            assert got == want, (plan, rank, axis)
    assert not moved["unexpected_axes"]
    # the formulas by hand: 29,339 parameters; the cut's e1, e2, b per image
    params = 29_339
    cut = 8 * 32 * 32 + 16 * 16 * 16 + 32 * 8 * 8
    want = {"dp": {r: {"dp": 4 * params} for r in range(4)},
            "pp": {r: {"pp": 2 * 4 * 4 * cut * 4} for r in range(2)}}.get(plan)
    if want:
        assert choose.expected_bytes(plan, CFG) == want
    else:
        per = choose.expected_bytes(plan, CFG)
        assert {per[r]["pp"] for r in range(4)} == {2 * 4 * 2 * cut * 4}
        assert per[0]["dp"] + per[1]["dp"] == 4 * params


def test_the_encoder_sends_the_bottleneck_and_both_skips(plans):
    traced = lab15.traced_cut_bytes(plans["pp"]["timeline"], 0, CFG.steps, CFG.micro_batches)
    assert traced["forward"] == {"e1": 4 * 4 * 8 * 32 * 32, "e2": 4 * 4 * 16 * 16 * 16,
                                 "b": 4 * 4 * 32 * 8 * 8}
    assert traced["backward"] == traced["forward"]


def test_a_pipeline_cut_anywhere_trains_like_one_device_and_sends_what_crosses(reference):
    cuts = (1, 2, 4, 5)
    res = parlab.launch(unet.pipeline_at_cuts, 2, args=(CFG, cuts))
    net = choose.network(CFG)
    for k, cut in enumerate(cuts):
        stages = [r[k]["result"] for r in res.results]
        np.testing.assert_allclose(stages[1]["losses"], reference["losses"], rtol=LOSS_TOL)
        assert max_difference(merged(stages, "first_grads"), reference["first_grads"]) < GRAD_TOL
        window = res.timeline.window(*res.results[0][k]["window"])
        traced = lab15.traced_cut_bytes(window, 0, CFG.steps, CFG.micro_batches)
        assert set(traced["forward"]) == set(crossing(models.UNet.BLOCKS, cut))
        assert sum(traced["forward"].values()) == net.cut_bytes(choose.layer_of_cut(net, cut), 4)
        assert lab15._cut_bytes(cut, 4) == (sum(traced["forward"].values()),
                                            sum(traced["backward"].values()))


def test_the_blocks_compute_the_unet_of_lab_01():
    torch.manual_seed(0)
    net = models.unet(8)
    x = torch.randn(2, 1, 32, 32)
    pool, cat = torch.nn.functional.max_pool2d, torch.cat
    e1 = net.enc1(x)
    e2 = net.enc2(pool(e1, 2))
    b = net.bottom(pool(e2, 2))
    d2 = net.dec2(cat([net.up2(b), e2], 1))
    by_hand = net.head(net.dec1(cat([net.up1(d2), e1], 1)))
    assert torch.equal(net(x), by_hand)
    # two stages hold the U-Net's submodules between them, under the same names
    first, second = unet.UNetStage(net, 0, 3), unet.UNetStage(net, 3, 6)
    assert (first.receives, first.sends, second.receives) == (("x",), ("e1", "e2", "b"),
                                                              ("e1", "e2", "b"))
    names = set(first.state_dict()) | set(second.state_dict())
    assert names == set(net.state_dict()) and not set(first.state_dict()) & set(second.state_dict())
    assert torch.equal(second(*first(x)), by_hand)


def test_crossing_names_the_skips_a_cut_carries():
    blocks = models.UNet.BLOCKS
    assert [crossing(blocks, c) for c in range(1, 6)] == [
        ["e1"], ["e1", "e2"], ["e1", "e2", "b"], ["e1", "d2"], ["d1"]]
    stack = [("h1", ("x",)), ("h2", ("h1",)), ("y", ("h2",))]
    assert crossing(stack, 2) == ["h2"]                       # a layer stack: one activation
    with pytest.raises(ValueError, match="1 .. 5"):
        crossing(blocks, 6)


def test_the_weighted_loss_is_a_mean_over_pixels_that_splits_over_replicas():
    x, y = unet.training_data(CFG)
    w = data.class_weights(y)
    share = np.bincount(y.ravel(), minlength=3) / y.size
    np.testing.assert_allclose(w * share, [1 / 3] * 3, rtol=1e-6)   # every class weighs alike
    loss = unet.WeightedPixelLoss(w)
    torch.manual_seed(0)
    logits, masks = torch.randn(8, 3, 32, 32), torch.as_tensor(y[:8])
    halves = (loss(logits[:4], masks[:4]) + loss(logits[4:], masks[4:])) / 2
    assert torch.allclose(loss(logits, masks), halves, rtol=1e-6)
    with pytest.raises(ValueError, match="class 2 has no pixel"):
        data.class_weights(np.zeros((2, 4, 4), dtype=np.int64) + np.eye(4, dtype=np.int64))


@pytest.mark.parametrize("kwargs,message", [
    ({"size": 30}, "multiple of 4"),
    ({"cuts": (3, 2)}, "rise strictly"),
    ({"cuts": (6,)}, "inside 1 .. 5"),
    ({"optimizer": "lion"}, "'adam' or 'sgd'"),
    ({"global_batch": 0}, "whole number >= 1"),
])
def test_bad_unet_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        UNetConfig(**kwargs)


def test_a_pipeline_with_the_wrong_number_of_ranks_says_so():
    with pytest.raises(parlab.WorkerError, match=r"cuts \[3\] make 2 stages but the group has 3"):
        parlab.launch(unet.train_pipeline, 3, args=(CFG,))


def test_the_served_model_segments_in_a_fresh_process(tmp_path):
    torch.manual_seed(0)
    model = unet.build(CFG)
    images, _ = data.shapes(3, seed=2)
    served = lab15.serve_in_fresh_process(model, images, folder=str(tmp_path))
    from parlab.torch import serve
    assert np.array_equal(served["masks"], serve.segment(model.eval(), images))
    assert served["pid"] != __import__("os").getpid() and "segmented 3 images" in served["said"]
    assert (tmp_path / "unet_shapes.pt").exists()
    with pytest.raises(RuntimeError, match="the serving process failed"):
        (tmp_path / "unet_shapes.pt").write_bytes(b"not a model")
        from parlab.course import lab15_serve
        lab15_serve.subprocess_serve(str(tmp_path / "unet_shapes.pt"), images)


# ------------------------------------------------------------------ the exercises
def test_cut_bytes_check_accepts_the_reference_on_real_ranks(capsys):
    assert lab15.check_cut_bytes(lab15._cut_bytes) is lab15._cut_bytes
    out = capsys.readouterr().out
    assert "correct on all 15 cases" in out and "cut 3 229 kB" in out


def test_cut_bytes_check_says_what_is_wrong_and_falls_back(capsys):
    def forgets_the_skips(cut, micro_batch, size=32, base=8):
        last = ["e1", "e2", "b", "d2", "d1"][cut - 1]
        n = 4 * micro_batch * lab15.tensor_elements(last, size, base)
        return n, n
    assert lab15.check_cut_bytes(forgets_the_skips) is lab15._cut_bytes
    assert "not yet right" in capsys.readouterr().out

    def todo(*args):
        raise NotImplementedError
    assert lab15.check_cut_bytes(todo) is lab15._cut_bytes
    assert "not attempted yet" in capsys.readouterr().out


def test_plan_check_runs_the_cost_model_on_the_choice(capsys):
    def best():
        return {"dp": 4, "pp": 2, "micro_batches": 32}
    assert lab15.check_plan(best) is best
    assert "right: it fits" in capsys.readouterr().out
    for plan, said in (({"dp": 8, "pp": 1}, "does not fit in memory"),
                       ({"dp": 4, "pp": 2, "micro_batches": 4}, "more than 10 % slower"),
                       ({"dp": 4, "pp": 1}, "has 8 devices")):
        use = lab15.check_plan(lambda plan=plan: plan)
        assert use() == choose.best_plan(choose.SCENARIO) and lab15.whose(use) == "the reference"
        assert said in capsys.readouterr().out


def test_the_cost_model_prefers_data_parallel_here_and_explains():
    """The choice's inputs, planted: one device's passes and a link, no ranks."""
    net = choose.network(CFG)
    cluster = parlab.sim.calibrate.this_machine(parlab.sim.Link(3e-5, 2e9), flops=2e9,
                                                layer_overhead_s=1e-4)
    cal = {"net": net, "cluster": replace(cluster, cores=2), "costs": None}
    choices = choose.predict(cal, CFG)
    assert choose.pick(choices) == "dp" and choices["pp"].devices_used == 2
    text = choose.reasons(choices["dp_pp"], CFG, net)
    assert "micro-batches of 2 images" in text and "back for each of 4 micro-batches, 918 kB in all" in text
    assert all(c.fits for c in choices.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: torch.cuda.is_available() is False")
def test_the_plans_on_ranks_sharing_one_gpu_train_like_one_device():
    """The same plans with the ranks computing on the GPU (messages through host memory),
    against one device on the CPU: convolutions in float32 (no TF32), other kernels and
    summation orders, so a looser tolerance."""
    runs = lab15.run_plans(cfg=CFG, devices=parlab.devices(4, mode="shared-gpu"),
                           pin_cores=False)
    for plan, e in lab15.equivalence(runs, unet.train_single(CFG)).items():
        assert e["loss"] < 1e-4 and e["grads"] < 1e-4 and e["replicas_identical"], (plan, e)
        assert lab15.axis_bytes(plan, runs[plan], CFG)["unexpected_axes"] == []
