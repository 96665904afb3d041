"""parlab.torch.replicas: the replica checksum and the non-finite check, on real ranks.

Each planted difference (a tensor changed on one rank, a NaN, a drift from one step on)
must be named with its step, tensor and rank; identical replicas must give nothing. The
fixes the lab runs train like one device (equivalence with a single-device reference).
"""
import sys

import cloudpickle
import numpy as np
import pytest
import torch

import parlab
from parlab.course import lab09_programs as programs
from parlab.torch import replicas

cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------ fingerprints, no ranks
def test_fingerprint_is_equal_for_equal_bits_and_differs_for_one_flipped_bit():
    a = torch.linspace(-1, 1, 100)
    b = a.clone()
    assert replicas.fingerprint(a) == replicas.fingerprint(b)
    programs.flip_a_bit(b)
    assert replicas.fingerprint(a) != replicas.fingerprint(b)
    assert 0 < float((a - b).abs().max()) < 1e-6        # the lowest bit: invisible in the loss


def test_fingerprint_takes_bits_not_values_and_any_dtype_or_shape():
    assert replicas.fingerprint(torch.tensor([0.0])) != replicas.fingerprint(torch.tensor([-0.0]))
    for t in (torch.tensor(3.0), torch.ones(2, 3, dtype=torch.bfloat16),
              torch.arange(6).reshape(2, 3).t(), torch.ones(0)):
        assert replicas.fingerprint(t) == replicas.fingerprint(t.clone())


def test_state_tensors_include_buffers():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    assert {"1.running_mean", "1.running_var", "0.weight"} <= set(replicas.state_tensors(net))


# ------------------------------------------------------------------ on ranks
def planted(rank, world_size):
    """Equal replicas, then one tensor changed on rank 2, then a NaN on rank 1."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    torch.manual_seed(0)
    for p in net.parameters():
        torch.nn.init.normal_(p)
    out = {"equal": [str(d) for d in replicas.compare_replicas(net)]}
    with torch.no_grad():
        if rank == 2:
            net[1].bias += 0.25
    found = replicas.compare_replicas(net)
    out["changed"] = [(d.tensor, d.ranks, d.max_difference) for d in found]
    out["within_atol"] = replicas.compare_replicas(net, atol=0.5)
    with torch.no_grad():
        if rank == 1:
            net[0].weight[0, 0] = float("nan")
    nan = replicas.compare_replicas(net)
    out["nan"] = [(d.tensor, d.ranks, d.max_difference) for d in nan]
    out["nonfinite"] = replicas.nonfinite_ranks({"weights": net[0].weight, "bias": net[1].bias})
    return out


def drifting(rank, world_size, at=3):
    """A DriftWatch and a NonFiniteWatch over steps; rank 1 drifts from step ``at``,
    and its loss turns infinite at step ``at + 2``."""
    w = torch.zeros(5)
    drift, nonfinite = replicas.DriftWatch({"w": w}), replicas.NonFiniteWatch()
    for step in range(6):
        loss = torch.tensor(float("inf") if rank == 1 and step == at + 2 else 1.0)
        nonfinite.check(step, batch=torch.ones(2), loss=loss)
        w += 1.0 + (1e-3 if rank == 1 and step >= at else 0.0)
        drift.check(step)
    return {"drift": drift.first, "counts": drift.differing, "nonfinite": nonfinite.first}


@pytest.fixture(scope="module")
def planted_run():
    return parlab.launch(planted, 3, timeout=60).results


def test_identical_replicas_differ_nowhere(planted_run):
    assert all(r["equal"] == [] for r in planted_run)


def test_a_tensor_changed_on_one_rank_is_named_with_its_rank_and_size(planted_run):
    for r in planted_run:      # every rank gets the same answer
        assert len(r["changed"]) == 1
        name, ranks, gap = r["changed"][0]
        assert name == "1.bias" and list(ranks) == [2] and gap == pytest.approx(0.25)
        assert r["within_atol"] == []


def test_a_nan_counts_as_a_difference_and_as_non_finite(planted_run):
    for r in planted_run:
        named = {name: (list(ranks), gap) for name, ranks, gap in r["nan"]}
        assert named["0.weight"][0] == [1] and np.isnan(named["0.weight"][1])
        assert named["1.bias"][0] == [2]
        assert r["nonfinite"] == {1: ["weights"]}


def test_the_watches_keep_the_first_step_rank_and_tensor():
    results = parlab.launch(drifting, 2, timeout=60).results
    for r in results:
        assert r["drift"]["step"] == 3 and r["drift"]["tensor"] == "w" and r["drift"]["ranks"] == [1]
        assert r["drift"]["max_difference"] == pytest.approx(1e-3, rel=1e-3)
        assert [n for _, n in r["counts"]] == [0, 0, 0, 1, 1, 1]
        assert r["nonfinite"] == {"step": 5, "rank": 1, "tensor": "loss", "ranks": {1: ["loss"]}}


# ------------------------------------------------------------------ the fixes train like one device
def _one_device(steps, build, lr=0.2):
    """One device on the two shards together, with the lab programs' model and data."""
    net = build()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for _, ((x0, y0), (x1, y1)) in zip(range(steps), zip(programs.shards(0), programs.shards(1))):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(torch.cat([x0, x1])), torch.cat([y0, y1])).backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in net.state_dict().items()}


def _max_gap(a, b):
    return max(float(np.abs(a[k] - b[k]).max()) for k in b)


def test_broadcast_replicas_stay_equal_and_train_like_one_device():
    from parlab.torch import training
    results = parlab.launch(programs.replicas_broadcast, 2, timeout=60, seed=0).results
    assert all(r["first"] is None for r in results)

    def rank0_weights():        # rank 0 draws its weights right after seeding with seed + 0
        torch.manual_seed(0)
        return training.build_model("mlp", sizes=programs.SIZES)
    want = _one_device(programs.STEPS, rank0_weights)
    assert _max_gap(results[0]["state"], want) < 1e-5


def test_the_schedule_fixed_trains_like_one_device_and_the_broken_one_drifts():
    fixed = parlab.launch(programs.scheduled, 2, timeout=60).results
    broken = parlab.launch(programs.scheduled_on_rank_0, 2, timeout=60).results
    want = programs.scheduled_on_one_device(12)
    assert fixed[0]["first"] is None and _max_gap(fixed[0]["state"], want["state"]) < 1e-5
    assert broken[0]["first"]["step"] == 4 and broken[0]["first"]["ranks"] == [1]


def test_the_guarded_standardization_trains_like_one_device():
    from parlab.torch import training
    results = parlab.launch(programs.standardized, 2, kwargs=dict(eps=1e-6), timeout=60).results
    assert all(r["first"] is None for r in results)

    def standardize(x, rank, step):
        x = x.clone()
        if rank == programs.BLANK["rank"] and step == programs.BLANK["step"]:
            x[0] = 0.0
        return (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-6)

    net = training.build_model("mlp", sizes=programs.SIZES, seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.2)
    for step, ((x0, y0), (x1, y1)) in zip(range(programs.STEPS),
                                          zip(programs.shards(0), programs.shards(1))):
        opt.zero_grad()
        x = torch.cat([standardize(x0, 0, step), standardize(x1, 1, step)])
        torch.nn.functional.cross_entropy(net(x), torch.cat([y0, y1])).backward()
        opt.step()
    want = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    assert _max_gap(results[0]["state"], want) < 1e-5
