"""The shared-GPU path of the traced layer, run on the CPU.

Ranks sharing one GPU send their CUDA tensors through host memory over gloo (NCCL refuses
two ranks on one GPU). That path is device-agnostic: forcing it on CPU tensors
(``runtime.stage_through_host("all")``) runs every line of it here, without a GPU. What
only a GPU can check (CUDA copies, CUDA-event timing) is in tests/test_gpu.py.
"""
import gpu_workers
import pytest
from conftest import rank_processes

import parlab


def test_every_traced_operation_gives_the_same_result_through_host_memory():
    out = parlab.launch(gpu_workers.staged_ops, 4, timeout=120)
    gpu_workers.check_staged_ops(out, expect_staging="all", expect_device="cpu")
    assert not rank_processes()


@pytest.fixture(scope="module")
def staged_pairs():
    out = parlab.launch(gpu_workers.staged_strategies, 4, args=(gpu_workers.PAIR_NAMES,), timeout=240)
    assert any("· to host" in s.name for s in out.timeline)
    return gpu_workers.by_pair(out, gpu_workers.PAIR_NAMES)


def test_strategies_through_host_memory_equal_one_device(staged_pairs):
    gpu_workers.check_pairs_equal_references(staged_pairs, tol=1e-5)


def test_staging_setting_is_checked():
    from parlab.torch import runtime
    with pytest.raises(ValueError, match="'off', 'cuda' or 'all'"):
        runtime.stage_through_host("sometimes")
