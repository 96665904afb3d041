"""Every torch strategy on a 2-rank sub-group of a 4-rank launch equals its single-device
reference, while the other pair runs the same strategy in its own group at the same time.
All strategies run one after the other in a single launch (see the ``pairs`` fixture)."""
import numpy as np
import pytest
import workers
from conftest import rank_processes

import parlab
from parlab.metrics import max_difference, merged
from parlab.split import SplitConfig
from parlab.torch import data_parallel as dp
from parlab.torch import parameter_server as ps
from parlab.torch import pipeline as pl
from parlab.torch import single
from parlab.torch import tensor_parallel as tp

TOL = 1e-5
CFG = SplitConfig(**workers.PAIR_CFG)
PAIRS = ([0, 1], [2, 3])


NAMES = ("split", "pipeline", "naive", "column_row", "dtensor", "by_hand", "ring", "ddp",
         "parameter_server", "wavefront")


@pytest.fixture(scope="module")
def pairs():
    """Every strategy on both pairs, in one launch; per strategy, [[pair 0], [pair 1]]."""
    out = parlab.launch(workers.strategies_on_pairs, 4, args=(NAMES,), timeout=240)
    for rank, r in enumerate(out.results):
        assert r["ranks"] == PAIRS[rank // 2] and r["member"] == rank % 2
    # every traced message stayed inside its pair, and is labelled with the mesh axis it ran on
    comm = [s for s in out.timeline if s.kind == "comm"]
    assert comm, "the strategies communicated nothing"
    for s in comm:
        if s.rank < 4 and s.peer is not None:       # lanes 4.. are DDP's background lanes
            assert s.peer in PAIRS[s.rank // 2], f"rank {s.rank} talked to {s.peer} outside its pair"
        assert s.axis == "member", s
    assert not rank_processes(), "ranks left running"
    return {name: [[out.results[r]["runs"][name] for r in pair] for pair in PAIRS] for name in NAMES}


def _run(name, pairs):
    return pairs[name]


def test_split_on_each_pair_equals_one_device(pairs):
    ref = single.train_reference(SplitConfig(bounds=[4], **workers.PAIR_CFG))
    for pair in _run("split", pairs):
        assert max_difference(merged(pair), ref["state"]) < TOL


def test_pipeline_on_each_pair_equals_one_device(pairs):
    ref = single.train_reference(CFG)
    for pair in _run("pipeline", pairs):
        assert max_difference(merged(pair), ref["state"]) < TOL


@pytest.mark.parametrize("scheme", ["naive", "column_row"])
def test_tensor_parallel_on_each_pair_equals_one_device(scheme, pairs):
    ref = tp.dense_reference(CFG.sizes, batch_size=48, steps=3, lr=0.1)
    kinds = tp.layer_kinds(CFG.sizes, 2, scheme)
    for pair in _run(scheme, pairs):
        for index, res in enumerate(pair):
            for n, v in res["shards"].items():
                want = tp.dense_slice(n, ref["state"][n], kinds[n], index, 2)
                np.testing.assert_allclose(v, want, atol=TOL, err_msg=n)


def test_dtensor_on_each_pair_equals_one_device(pairs):
    ref = tp.dense_reference(CFG.sizes, batch_size=48, steps=1, lr=0.1)
    kinds = tp.layer_kinds(CFG.sizes, 2, "column_row")
    for pair in _run("dtensor", pairs):
        for index, res in enumerate(pair):
            for n, g in res["grads"].items():
                want = tp.dense_slice(n, ref["first_grads"][n], kinds[n], index, 2)
                np.testing.assert_allclose(g, want, atol=TOL, err_msg=n)


@pytest.mark.parametrize("mode", ["by_hand", "ring", "ddp"])
def test_data_parallel_on_each_pair_equals_one_device(mode, pairs):
    ref = dp.train_single(global_batch=64, steps=3, lr=0.1)
    for pair in _run(mode, pairs):
        for res in pair:
            assert max_difference(res["state"], ref["state"]) < TOL


def test_parameter_server_on_each_pair_equals_one_device(pairs):
    ref = dp.train_single(global_batch=64, steps=3, lr=0.1)
    for pair in _run("parameter_server", pairs):
        assert [r["role"] for r in pair] == ["server", "worker"]
        assert max_difference(ps.state_dict(pair), ref["state"]) < TOL


def test_lstm_wavefront_on_each_pair_equals_one_device(pairs):
    ref = pl.lstm_single_device(2, hidden=16, length=6, batch=8, repeats=1)
    for pair in _run("wavefront", pairs):
        np.testing.assert_allclose(pair[-1]["h"], ref["stepped cells"]["h"], atol=TOL)
