"""The shared-GPU path of the traced layer, run on the CPU.

Ranks sharing one GPU send their CUDA tensors through host memory over gloo (NCCL refuses
two ranks on one GPU). That path is device-agnostic: forcing it on CPU tensors
(``runtime.stage_through_host("all")``) runs every line of it here, without a GPU. What
only a GPU can check (CUDA copies, CUDA-event timing) is in tests/test_gpu.py.
"""
import numpy as np
import pytest
import gpu_workers
import workers
from conftest import rank_processes

import parlab
from parlab.metrics import max_difference, merged
from parlab.splitting import SplitConfig
from parlab.torch import data_parallel as dp
from parlab.torch import parameter_server as ps
from parlab.torch import pipeline as pl
from parlab.torch import single
from parlab.torch import tensor_parallel as tp

TOL = 1e-5


def test_every_traced_operation_gives_the_same_result_through_host_memory():
    n = 4
    out = parlab.launch(gpu_workers.staged_ops, n, timeout=120)
    total = sum(range(1, n + 1))
    for rank, r in enumerate(out.results):
        assert r["staging"] == "all" and r["device"] == "cpu"
        np.testing.assert_array_equal(r["all_reduce"], [total] * 4)
        assert r["in_place"], "all_reduce must still reduce the caller's tensor in place"
        np.testing.assert_allclose(r["avg"], [total / n] * 4)
        np.testing.assert_array_equal(r["broadcast"], [1.0] * 3)
        assert [float(a[0]) for a in r["all_gather"]] == [float(i) for i in range(n)]
        np.testing.assert_array_equal(r["reduce_scatter"], np.arange(2.0 * n)[2 * rank:2 * rank + 2] * total)
        left = (rank - 1) % n
        np.testing.assert_array_equal(r["ring"], [left, 10.0 * left])
        np.testing.assert_array_equal(r["all_reduce_async"], [sum(range(n))] * 5)
    assert out.results[0]["recv_any"] == {s: 100.0 + s for s in range(1, n)}
    # the copies are transfer on the timeline, carry no bytes of their own, and come
    # before the matched span (so a rank's own copy is not taken for waiting on peers)
    spans = list(out.timeline)
    copies = [s for s in spans if "· to host" in s.name or "· back" in s.name]
    assert copies and all(s.kind == "comm" and s.bytes == 0 for s in copies)
    for rank in range(n):
        to_host = [s for s in spans if s.rank == rank and s.name == "all_reduce · to host"]
        reduce = [s for s in spans if s.rank == rank and s.name == "all_reduce" and s.kind == "comm"]
        assert to_host and reduce and to_host[0].end <= reduce[0].end
    sent = sum(s.bytes for s in spans if s.rank == 0 and s.name == "all_reduce")
    assert sent == 2 * 4 * 4, "bytes count each all-reduce once (x and y), staging adds none"
    assert not rank_processes()


@pytest.fixture(scope="module")
def staged_pairs():
    names = ("split", "pipeline", "naive", "column_row", "by_hand", "ring", "ddp",
             "parameter_server", "wavefront")
    out = parlab.launch(gpu_workers.staged_strategies, 4, args=(names,), timeout=240)
    assert any("· to host" in s.name for s in out.timeline)
    pairs = ([0, 1], [2, 3])
    return {name: [[out.results[r]["runs"][name] for r in pair] for pair in pairs] for name in names}


def test_strategies_through_host_memory_equal_one_device(staged_pairs):
    cfg = SplitConfig(**workers.PAIR_CFG)
    split_ref = single.train_reference(SplitConfig(bounds=[4], **workers.PAIR_CFG))
    for pair in staged_pairs["split"]:
        assert max_difference(merged(pair), split_ref["state"]) < TOL
    ref = single.train_reference(cfg)
    for pair in staged_pairs["pipeline"]:
        assert max_difference(merged(pair), ref["state"]) < TOL
    dense = tp.dense_reference(cfg.sizes, batch_size=48, steps=3, lr=0.1)
    for scheme in ("naive", "column_row"):
        kinds = tp.layer_kinds(cfg.sizes, 2, scheme)
        for pair in staged_pairs[scheme]:
            for index, res in enumerate(pair):
                for n, v in res["shards"].items():
                    want = tp.dense_slice(n, dense["state"][n], kinds[n], index, 2)
                    np.testing.assert_allclose(v, want, atol=TOL, err_msg=n)
    one = dp.train_single(global_batch=64, steps=3, lr=0.1)
    for mode in ("by_hand", "ring", "ddp"):
        for pair in staged_pairs[mode]:
            for res in pair:
                assert max_difference(res["state"], one["state"]) < TOL, mode
    for pair in staged_pairs["parameter_server"]:
        assert max_difference(ps.state_dict(pair), one["state"]) < TOL
    lstm = pl.lstm_single_device(2, hidden=16, length=6, batch=8, repeats=1)
    for pair in staged_pairs["wavefront"]:
        np.testing.assert_allclose(pair[-1]["h"], lstm["stepped cells"]["h"], atol=TOL)


def test_staging_setting_is_checked():
    from parlab.torch import runtime
    with pytest.raises(ValueError, match="'off', 'cuda' or 'all'"):
        runtime.stage_through_host("sometimes")
