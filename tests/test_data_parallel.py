"""Data parallelism: every way of averaging equals one device on the whole batch."""
import numpy as np
import pytest

from batched import launch_each
from conftest import rank_processes

import parlab
from parlab.course import lab05
from parlab.torch import data_parallel as dp

TOL = 1e-5
STEPS, BATCH = 4, 96
EQUIVALENCE = [("by_hand", 2), ("by_hand", 4), ("ddp", 2), ("ddp", 4), ("ddp_no_overlap", 2),
               ("ring", 3)]
RINGS = [(2, 8), (3, 7), (4, 5)]


@pytest.fixture(scope="module")
def runs():
    """Every launch of this module's tests, one launch per world size."""
    calls = {}
    for mode, n in EQUIVALENCE:
        calls.setdefault(n, {})[mode] = (dp.train_data_parallel, (mode, "mlp", BATCH, STEPS, 0.1, 0.1))
    for mode in ("ddp", "ddp_fp16"):
        calls[2][f"fp16 {mode}"] = (dp.train_data_parallel, (mode, "mlp", 64, 3, 0.1, 0.1))
    for n, numel in RINGS:
        calls[n]["ring demo"] = (dp.ring_demo, (numel,))
    out = {n: launch_each(c, n) for n, c in calls.items()}
    assert not rank_processes(), "ranks left running"
    return out


@pytest.mark.parametrize("mode,world_size", EQUIVALENCE)
def test_data_parallel_equals_one_device_on_the_global_batch(mode, world_size, runs):
    steps, batch = STEPS, BATCH
    ref = dp.train_single(global_batch=batch, steps=steps)
    out = runs[world_size][mode]
    for k, v in ref["state"].items():
        np.testing.assert_allclose(out.results[0]["state"][k], v, atol=TOL, err_msg=k)
    for r in out.results[1:]:  # replicas stay identical, bit for bit
        for k in ref["state"]:
            np.testing.assert_array_equal(r["state"][k], out.results[0]["state"][k])
    if mode == "ddp":
        assert out.results[0]["buckets_per_step"] >= 2          # 0.1 MB buckets: several
        lanes = {s.rank for s in out.timeline if "bucket all_reduce" in s.name}
        assert lanes == set(range(world_size, 2 * world_size))  # drawn on background lanes
        # numbered, so that buckets in flight together still show as separate bars
        names = {s.name for s in out.timeline if "bucket all_reduce" in s.name}
        assert len(names) >= out.results[0]["buckets_each_step"][-1] >= 2
        # on the main lanes, backward() is split: computing, then waiting for the buckets
        waits = {s.rank for s in out.timeline if s.name == "wait for buckets" and s.kind == "wait"}
        assert waits == set(range(world_size))
        assert out.results[0]["buckets_each_step"][1:] == [out.results[0]["buckets_each_step"][-1]] * (steps - 1)
    if mode == "ddp_no_overlap":     # the same buckets, all started after the backward
        assert out.results[0]["buckets_per_step"] >= 2
        for r in range(world_size):
            back = [s for s in out.timeline if s.rank == r and s.name == "backward"]
            lane = [s for s in out.timeline if s.rank == world_size + r and s.kind == "comm"]
            assert len(lane) == out.results[0]["buckets_per_step"] * steps
            for s in lane:      # after the end of its step's backward pass
                own = max((b for b in back if b.start <= s.start), key=lambda b: b.start)
                assert own.end <= s.start


def test_fp16_compression_halves_the_bytes_and_stays_close(runs):
    ref = dp.train_single(global_batch=64, steps=3)
    pair = {m: runs[2][f"fp16 {m}"] for m in ("ddp", "ddp_fp16")}
    sent = {m: sum(s.bytes for s in r.timeline if s.rank == 2) for m, r in pair.items()}
    assert sent["ddp_fp16"] * 2 == sent["ddp"]
    drift = max(float(np.abs(pair["ddp_fp16"].results[0]["state"][k] - ref["state"][k]).max()) for k in ref["state"])
    assert 0 < drift < 1e-3


@pytest.mark.parametrize("world_size,numel", RINGS)
def test_the_ring_all_reduce_equals_the_sum(world_size, numel, runs):
    out = runs[world_size]["ring demo"].results
    expected = sum(np.arange(numel, dtype=np.float32) + 100 * r for r in range(world_size))
    for r in out:
        np.testing.assert_array_equal(r["result"], expected)
    log = out[0]["log"]
    assert len(log) == 2 * (world_size - 1)          # n-1 reduce-scatter + n-1 all-gather steps
    assert {e["to"] for e in log} == {1}             # always to the right neighbour


def test_bad_global_batches_are_refused(no_leftover_ranks):
    with pytest.raises(parlab.WorkerError, match="global batch of 100 does not split over 3"):
        parlab.launch(dp.train_data_parallel, 3, args=("by_hand", "mlp", 100, 1), timeout=60)


def _sum_without_dividing(model):
    from parlab.torch import comm
    for p in model.parameters():
        comm.all_reduce(p.grad)


def test_the_gradient_averaging_exercise_check(capsys, no_leftover_ranks):
    assert lab05.check_average_gradients(dp.average_gradients) is dp.average_gradients
    assert "correct" in capsys.readouterr().out
    assert lab05.check_average_gradients(_sum_without_dividing) is dp.average_gradients
    assert "about 2x the right one" in capsys.readouterr().out
