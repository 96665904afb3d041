"""Vertical slicing: sliced layers and MLPs equal their dense counterparts."""
import numpy as np
import pytest
import torch
import workers
from batched import launch_each
from conftest import rank_processes
from torch import nn

import parlab
from parlab.course import lab03
from parlab.torch import tensor_parallel as tp

TOL = 1e-5  # float32: sums of partial products in a different order
SLICED = [("column_row", 2, (64, 256, 256, 128, 10)), ("column_row", 4, (64, 256, 256, 128, 10)),
          ("naive", 2, (64, 256, 256, 128, 10)), ("naive", 4, (64, 128, 128, 64, 12))]
STEPS = 4


@pytest.fixture(scope="module")
def runs():
    """The layer and MLP runs of this module, one launch per world size."""
    calls = {n: {"layers": (workers.sliced_linear_layers, ())} for n in (2, 4)}
    for scheme, n, sizes in SLICED:
        calls[n][scheme] = (tp.train_sliced, (sizes, scheme, 64, STEPS))
    out = {n: launch_each(c, n) for n, c in calls.items()}
    assert not rank_processes(), "ranks left running"
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_column_and_row_parallel_layers_equal_the_dense_layer(world_size, runs):
    out = runs[world_size]["layers"].results
    torch.manual_seed(1)
    full = nn.Linear(16, 8)
    x = torch.randn(5, 16, requires_grad=True)
    y = full(x)
    (y * torch.arange(8.0)).sum().backward()
    o, i = 8 // world_size, 16 // world_size
    for r, res in enumerate(out):
        y_col, w_col, b_col, x_col = res["col"]
        np.testing.assert_allclose(y_col, y.detach(), atol=TOL)
        np.testing.assert_allclose(w_col, full.weight.grad[r * o:(r + 1) * o], atol=TOL)
        np.testing.assert_allclose(b_col, full.bias.grad[r * o:(r + 1) * o], atol=TOL)
        np.testing.assert_allclose(x_col, x.grad, atol=TOL)  # f all-reduced the input grad
        y_row, w_row, b_row, x_row = res["row"]
        np.testing.assert_allclose(y_row, y.detach(), atol=TOL)
        np.testing.assert_allclose(w_row, full.weight.grad[:, r * i:(r + 1) * i], atol=TOL)
        np.testing.assert_allclose(b_row, full.bias.grad, atol=TOL)
        np.testing.assert_allclose(x_row, x.grad[:, r * i:(r + 1) * i], atol=TOL)


@pytest.mark.parametrize("scheme,world_size,sizes", SLICED)
def test_sliced_mlp_trains_like_the_dense_mlp(scheme, world_size, sizes, runs):
    steps = STEPS
    ref = tp.dense_reference(sizes, steps=steps)
    out = runs[world_size][scheme]
    kinds = tp.layer_kinds(sizes, world_size, scheme)
    for r, res in enumerate(out.results):
        np.testing.assert_allclose(res["first_logits"], ref["first_logits"], atol=TOL)
        np.testing.assert_allclose(res["losses"], ref["losses"], atol=TOL)
        for name, g in res["first_grads"].items():
            want = tp.dense_slice(name, ref["first_grads"][name], kinds[name], r, world_size)
            np.testing.assert_allclose(g, want, atol=TOL, err_msg=name)
        for name, v in res["shards"].items():
            want = tp.dense_slice(name, ref["state"][name], kinds[name], r, world_size)
            np.testing.assert_allclose(v, want, atol=TOL, err_msg=name)
    # every exchange went through the traced layer: bytes match the formula exactly
    expected = tp.expected_comm_bytes(sizes, 64, world_size, scheme)["total"]
    for r in range(world_size):
        assert out.timeline.comm_bytes(r) == steps * expected


def test_column_then_row_needs_fewer_collectives_than_naive():
    sizes = (64, 256, 256, 128, 10)
    naive = tp.expected_comm_bytes(sizes, 64, 2, "naive")
    paired = tp.expected_comm_bytes(sizes, 64, 2, "column_row")
    assert paired["total"] < naive["total"]
    # Megatron pair: forward moves the pair's output, backward the pair's input gradient
    assert paired["forward"] == 64 * (256 + 10) * 4 and paired["backward"] == 64 * 256 * 4


def test_widths_that_do_not_divide_are_refused_with_what_to_change():
    with pytest.raises(ValueError, match=r"10 units.*over 4 devices.*\[1, 2, 5, 10\]"):
        tp.ColumnParallelLinear(nn.Linear(64, 10), tp.layout(4))
    with pytest.raises(ValueError, match="over 3 devices"):
        tp.RowParallelLinear(nn.Linear(64, 10), tp.layout(3))
    with pytest.raises(ValueError, match="scheme"):
        tp.slice_mlp(nn.Sequential(nn.Linear(4, 4)), "diagonal", tp.layout(2))


def test_grouped_layers_exchange_only_at_the_classifier(no_leftover_ranks):
    ref = tp.train_grouped(None, 2, steps=4)
    out = parlab.launch(tp.train_grouped, 2, args=((64, 256, 256, 10), 4))
    np.testing.assert_allclose(out.results[0]["losses"], ref["losses"], atol=TOL)
    comm = [s for s in out.timeline if s.kind == "comm" and s.rank == 0]
    assert [s.name for s in comm] == ["all_reduce"] * 4       # one per step, forward only
    assert all(s.bytes == 64 * 10 * 4 for s in comm)


def test_the_library_plan_gives_the_hand_written_gradients(no_leftover_ranks):
    sizes = (64, 256, 256, 128, 10)
    hand = parlab.launch(tp.train_sliced, 2, args=(sizes, "column_row", 64, 1)).results
    lib = parlab.launch(tp.library_sliced_step, 2, args=(sizes,)).results
    for h, lb in zip(hand, lib):
        np.testing.assert_allclose(lb["logits"], h["first_logits"], atol=TOL)
        assert lb["grads"].keys() == h["first_grads"].keys()
        for name in lb["grads"]:
            np.testing.assert_allclose(lb["grads"][name], h["first_grads"][name], atol=TOL, err_msg=name)


def _bias_on_every_rank(x, w, b):
    from parlab.torch import comm
    y = x @ w.T + b
    comm.all_reduce(y)
    return y


def _not_done(x, w, b):
    raise NotImplementedError


def _right(x, w, b):
    from parlab.torch import comm
    y = x @ w.T
    comm.all_reduce(y)
    return y + b


def test_the_row_parallel_exercise_check_runs_the_learners_code_on_ranks(capsys, no_leftover_ranks):
    assert lab03.check_row_parallel(_right) is _right
    assert "correct" in capsys.readouterr().out
    assert lab03.check_row_parallel(_bias_on_every_rank) is tp.row_parallel_forward
    assert "counted 2 times" in capsys.readouterr().out
    assert lab03.check_row_parallel(_not_done) is tp.row_parallel_forward
    assert "not attempted" in capsys.readouterr().out
