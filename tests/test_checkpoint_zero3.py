"""Checkpoints of the hand-written ZeRO-3: saved on 4 ranks, resumed on 2, 1 or 4, the run
equals the uninterrupted one and the FSDP2 run of ``checkpoint.train``; DTensor's split is
the course's; each rank writes its share of the bytes; a checkpoint of the other kind is
refused in words."""
import shutil

import numpy as np
import pytest

import parlab
from parlab.metrics import max_difference

torch = pytest.importorskip("torch")
from parlab.torch import checkpoint as ck, checkpoint_zero3 as cz, models  # noqa: E402

CFG = ck.Config(sizes=(64, 32, 32, 10), batch_size=32)
STEPS, EVERY = 6, 3
TOL = 1e-5            # rounding only: sums over different numbers of rows per rank
TIMEOUT = 60


def run(n, folder, fn=cz.train_zero3, cfg=CFG, **kw):
    kwargs = {"steps": STEPS, "every": EVERY, "folder": str(folder), **kw}
    return parlab.launch(fn, n, args=(cfg,), kwargs=kwargs, timeout=TIMEOUT).results


def global_losses(results):
    """(steps, the whole batch's loss): the mean of the ranks' equal-share means."""
    return ([s for s, _ in results[0]["losses"]],
            np.mean([[v for _, v in r["losses"]] for r in results], axis=0))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return run(4, tmp_path_factory.mktemp("zero3_full"))


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsdp2_full")
    return folder, run(4, folder, fn=ck.train)


@pytest.fixture(scope="module")
def at_step3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zero3_first_half")
    run(4, folder, steps=3)
    assert ck.latest(folder).name == "step-000003"
    return folder


def test_dtensor_shard0_splits_as_the_course_shards():
    for n in range(1, 80):
        for w in range(1, 9):
            s = -(-n // w)
            pieces = [cz.split(n, w, i) for i in range(w)]
            assert sum(v for v, _ in pieces) == n
            for i, (valid, offset) in enumerate(pieces):
                if valid:
                    assert offset == i * s and valid == min(s, n - i * s)


def test_uninterrupted_zero3_equals_fsdp2(uninterrupted, fsdp2):
    # the same model, data and Adam, and both average the gradient over the whole batch
    _, ref = fsdp2
    for r in uninterrupted:
        assert max_difference(r["state"], ref[0]["state"]) < TOL
    np.testing.assert_allclose(global_losses(uninterrupted)[1], global_losses(ref)[1],
                               atol=TOL)


@pytest.mark.parametrize("n", [2, 1, 4])
def test_resumed_on_any_number_of_ranks_equals_the_uninterrupted_run(
        n, uninterrupted, fsdp2, at_step3, tmp_path):
    folder = shutil.copytree(at_step3, tmp_path / "run")
    results = run(n, folder, resume=True)
    steps, losses = global_losses(results)
    full_steps, full_losses = global_losses(uninterrupted)
    assert steps == full_steps[3:]
    np.testing.assert_allclose(losses, full_losses[3:], atol=TOL)
    for r in results:
        assert r["start"] == 3
        assert max_difference(r["state"], uninterrupted[0]["state"]) < TOL
        assert max_difference(r["state"], fsdp2[1][0]["state"]) < TOL
    manifest = ck.read_manifest(ck.latest(folder))
    assert (manifest["step"], manifest["world_size"], manifest["strategy"]) == (6, n, "zero3")
    assert manifest["flat"] == {"0": 2080, "2": 1056, "4": 330}


def test_each_rank_writes_its_share_of_the_bytes(uninterrupted, at_step3, tmp_path):
    # small model: the data is exactly 12 bytes (value + 2 moments, float32) per element
    # of this rank's shard; DCP adds a torch.save header of about 1.3-1.6 kB per item
    params, flat = uninterrupted[0]["params"], (2080, 1056, 330)
    meta = ck._verify_files(ck.latest(at_step3), {})
    data = [12 * sum(cz.split(n, 4, i)[0] for n in flat) for i in range(4)]
    assert sum(data) == 12 * params
    for i, r in enumerate(uninterrupted):
        got = r["saved"][0][1]
        items = sum(1 for s in meta.storage_data.values()
                    if s.relative_path.startswith(f"__{i}_"))
        print(f"\nrank {i}: {got} bytes, {data[i]} of data, {items} items, "
              f"{(got - data[i]) / items:.0f} B of header each")
        assert data[i] < got <= data[i] + 1600 * items
    # a wider model: the headers stay under 5 %, every rank writes 12 x params / 4
    results = run(4, tmp_path, cfg=ck.Config(sizes=(64, 512, 512, 10)), steps=1, every=1)
    want = ck.expected_bytes(results[0]["params"], 4)
    got = [r["saved"][0][1] for r in results]
    print(f"zero3 on 4, sizes (64, 512, 512, 10): bytes per rank {got}, "
          f"expected {want:.0f}")
    for b in got:
        assert want <= b <= 1.05 * want, (got, want)


def test_a_zero3_checkpoint_is_refused_by_the_plain_check_naming_the_key(at_step3, fsdp2):
    path = ck.latest(at_step3)
    cz.check(path, models.mlp(CFG.sizes))
    with pytest.raises(ValueError, match=r"saved by strategy 'zero3'.*checkpoint_zero3\.load"):
        ck.check(path, models.mlp(CFG.sizes))
    with pytest.raises(ValueError, match=r"strategy 'fsdp2', not 'zero3'.*checkpoint\.load"):
        cz.check(ck.latest(fsdp2[0]), models.mlp(CFG.sizes))
    with pytest.raises(ValueError, match=r"model\.0\.flat.*\(2080,\).*\(3120,\).*"
                                         r"\(64, 32, 32, 10\)"):
        cz.check(path, models.mlp((64, 48, 32, 10)))
