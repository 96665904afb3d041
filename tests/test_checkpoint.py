"""Checkpoints of a sharded run: a run resumed on 4, 2 or 1 ranks equals the run that was
never stopped; a rank dying mid-save leaves the previous checkpoint loadable; a checkpoint
that does not fit the model, or is damaged, is refused in words before anything loads;
each rank writes its share of the bytes; an asynchronous save gives the same checkpoint."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import parlab
from parlab.errors import WorkerError
from parlab.metrics import max_difference

torch = pytest.importorskip("torch")
from parlab.torch import checkpoint as ck, models  # noqa: E402

CFG = ck.Config(sizes=(64, 32, 32, 10), batch_size=32)
STEPS, EVERY = 6, 3
TOL = 1e-5            # rounding only: sums over different numbers of rows per rank
TIMEOUT = 60


def run(n, folder, cfg=CFG, **kw):
    kwargs = {"steps": STEPS, "every": EVERY, "folder": str(folder), **kw}
    return parlab.launch(ck.train, n, args=(cfg,), kwargs=kwargs, timeout=TIMEOUT).results


def global_losses(results):
    """(step, loss of the whole global batch): each rank's loss is the mean over its
    equal share of rows, so the mean over the ranks is the batch's."""
    steps = [s for s, _ in results[0]["losses"]]
    return steps, np.mean([[v for _, v in r["losses"]] for r in results], axis=0)


def copy_of(folder, into):
    shutil.copytree(folder, into)
    return into


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return run(4, tmp_path_factory.mktemp("full"))


@pytest.fixture(scope="module")
def at_step3(tmp_path_factory):
    """A 4-rank FSDP2 run stopped after step 3, its checkpoint saved at step 3."""
    folder = tmp_path_factory.mktemp("first_half")
    run(4, folder, steps=3)
    assert ck.latest(folder).name == "step-000003"
    return folder


def assert_same_as_uninterrupted(results, uninterrupted, start=3):
    steps, losses = global_losses(results)
    full_steps, full_losses = global_losses(uninterrupted)
    assert steps == full_steps[start:]
    np.testing.assert_allclose(losses, full_losses[start:], atol=TOL)
    for r in results:
        assert r["start"] == start
        assert max_difference(r["state"], uninterrupted[0]["state"]) < TOL


@pytest.mark.parametrize("n", [2, 1, 4])
def test_resumed_on_any_number_of_ranks_equals_the_uninterrupted_run(
        n, uninterrupted, at_step3, tmp_path):
    folder = copy_of(at_step3, tmp_path / "run")
    assert_same_as_uninterrupted(run(n, folder, resume=True), uninterrupted)
    assert ck.latest(folder).name == "step-000006"
    manifest = ck.read_manifest(ck.latest(folder))
    assert (manifest["step"], manifest["world_size"], manifest["strategy"]) == (6, n, "fsdp2")
    assert manifest["parameters"]["0.weight"] == [32, 64]
    assert manifest["seed"] == CFG.seed and manifest["torch"] == torch.__version__


def test_replicated_on_two_resumed_on_one(uninterrupted, tmp_path):
    run(2, tmp_path, steps=3, strategy="replicated")
    assert_same_as_uninterrupted(run(1, tmp_path, resume=True, strategy="replicated"),
                                 uninterrupted)


def test_a_rank_dying_mid_save_leaves_the_previous_checkpoint(
        uninterrupted, tmp_path, no_leftover_ranks):
    with pytest.raises(WorkerError) as err:
        run(4, tmp_path, fail_at=(1, 6))
    assert err.value.rank == 1
    assert ck.latest(tmp_path).name == "step-000003"
    partial = list(tmp_path.glob(".step-000006.partial-*"))
    assert len(partial) == 1 and not (partial[0] / ck.MANIFEST).exists()
    assert not (tmp_path / "step-000006").exists()
    ck.check(ck.latest(tmp_path), models.mlp(CFG.sizes))
    assert_same_as_uninterrupted(run(2, tmp_path, resume=True), uninterrupted)
    assert ck.latest(tmp_path).name == "step-000006"
    assert not list(tmp_path.glob(".step-000006.partial-*"))   # replaced by the new save


def test_a_model_of_other_sizes_is_refused_naming_the_key_and_both_shapes(at_step3):
    path = ck.latest(at_step3)
    ck.check(path, models.mlp(CFG.sizes))
    with pytest.raises(ValueError) as err:
        ck.check(path, models.mlp((64, 48, 32, 10)))
    text = str(err.value)
    for part in ("step-000003", "0.weight", "(32, 64)", "(48, 64)", "(64, 32, 32, 10)"):
        assert part in text, text
    with pytest.raises(ValueError, match=r"has 4\.weight of shape \(10, 32\), which this "
                                         r"model lacks"):
        ck.check(path, models.mlp((64, 32, 10)))


def test_a_checkpoint_without_its_manifest_is_incomplete(at_step3, tmp_path):
    folder = copy_of(at_step3, tmp_path / "run")
    (folder / "step-000003" / ck.MANIFEST).unlink()
    assert ck.latest(folder) is None
    with pytest.raises(ValueError, match="damaged or incomplete: it has no manifest"):
        ck.check(folder / "step-000003", models.mlp(CFG.sizes))


def test_a_truncated_shard_is_refused_naming_the_file(at_step3, tmp_path, no_leftover_ranks):
    folder = copy_of(at_step3, tmp_path / "run")
    shard = folder / "step-000003" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"damaged.*__1_0\.distcp"):
        ck.check(folder / "step-000003", models.mlp(CFG.sizes))
    with pytest.raises(WorkerError, match=r"__1_0\.distcp"):    # the loader checks first
        run(2, folder, resume=True)
    # without the manifest's file sizes, DCP's own index of each file still tells
    manifest = ck.read_manifest(folder / "step-000003")
    del manifest["files"]
    (folder / "step-000003" / ck.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"file __1_0\.distcp ends before"):
        ck.check(folder / "step-000003", models.mlp(CFG.sizes))


@pytest.mark.parametrize("n", [4, 2])
def test_each_fsdp2_rank_writes_its_share_of_the_bytes(n, tmp_path):
    # big enough that DCP's per-tensor headers (about 1.5 kB each) stay under 5 %
    cfg = ck.Config(sizes=(64, 512, 512, 10))
    results = run(n, tmp_path, cfg=cfg, steps=1, every=1)
    want = ck.expected_bytes(results[0]["params"], n, "fsdp2")
    got = [r["saved"][0][1] for r in results]
    print(f"\nfsdp2 on {n}: bytes per rank {got}, expected {want:.0f}")
    for b in got:
        assert abs(b - want) <= 0.1 * want, (got, want)


def test_an_asynchronous_save_gives_the_same_checkpoints(uninterrupted, tmp_path):
    results = run(4, tmp_path / "async", async_save=True)
    for r in results:
        assert max_difference(r["state"], uninterrupted[0]["state"]) < TOL
        assert [s for s, _ in r["saved"]] == [3, 6]
    print(f"\nblocked s per save, sync {uninterrupted[0]['blocked_s']}, "
          f"async {results[0]['blocked_s']}; save s, sync {uninterrupted[0]['save_s']}, "
          f"async {results[0]['save_s']}")
    assert ck.read_manifest(ck.latest(tmp_path / "async"))["step"] == 6
    done = run(2, copy_of(tmp_path / "async", tmp_path / "at6"), resume=True)
    assert_same_as_uninterrupted(done, uninterrupted, start=6)        # loads step 6's weights
    at3 = copy_of(tmp_path / "async", tmp_path / "at3")
    shutil.rmtree(at3 / "step-000006")
    assert_same_as_uninterrupted(run(2, at3, resume=True), uninterrupted)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="strategy must be one of"):
        ck.expected_bytes(100, 2, "zero1")
    assert ck.latest(Path("/nonexistent/folder")) is None


def test_the_random_state_comes_back_with_the_checkpoint(tmp_path):
    """Training that draws random numbers (one a step, as dropout would) resumes with the
    generator where the save left it: the next draw equals the uninterrupted run's."""
    from plain_workers import draw_each_step
    whole = run(2, tmp_path / "whole", after_step=draw_each_step)
    run(2, tmp_path / "stopped", steps=3, after_step=draw_each_step)
    resumed = run(2, tmp_path / "stopped", resume=True, after_step=draw_each_step)
    assert [r["random_draw"] for r in resumed] == [r["random_draw"] for r in whole]
    alone = run(2, copy_of(tmp_path / "stopped", tmp_path / "alone"), resume=True,
                restore="weights", after_step=draw_each_step)
    assert alone[0]["random_draw"] != whole[0]["random_draw"]
