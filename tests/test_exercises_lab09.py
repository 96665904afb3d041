"""Lab 09's find-and-fix checkers on real ranks: a wrong answer gets the right message.

The ring shift: one that still deadlocks is told where every rank waits; one that finishes
with the wrong tensors is told which rank got what. The schedule: one that still drifts is
told the step and the tensors; one that no longer drifts but dropped the schedule is told
that it changed the result. Unfilled answers fall back; right ones are used.
"""
import sys

import cloudpickle
import pytest

from parlab.course import lab09, lab09_programs as programs

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(autouse=True)
def reports_in(tmp_path, monkeypatch):
    monkeypatch.setattr(programs, "FOLDER", str(tmp_path))


def unfilled_ring(rank, world_size, numel=4096):
    raise NotImplementedError("your code here")


def unfilled_schedule(rank, world_size, steps=12):
    raise NotImplementedError("your code here")


# ------------------------------------------------------------------ the ring
def ring_by_parity(rank, world_size, numel=4096):
    import torch
    from parlab.torch import comm
    mine, received = torch.full((numel,), float(rank)), torch.empty(numel)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    if rank % 2 == 0:
        comm.send(mine, right)
        comm.recv(received, left)
    else:
        comm.recv(received, left)
        comm.send(mine, right)
    return received[0].item()


def ring_the_wrong_way(rank, world_size, numel=4096):
    import torch
    from parlab.torch import comm
    mine, received = torch.full((numel,), float(rank)), torch.empty(numel)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    pending = comm.isend(mine, left)            # to the left, not to the right
    comm.recv(received, right)
    comm.wait_all([pending])
    return received[0].item()


def test_a_right_ring_is_used(capsys):
    lab09.warm_up()                # no retry: the fork server is up
    assert lab09.check_ring_shift(ring_by_parity) is ring_by_parity
    out = capsys.readouterr().out
    assert out.startswith("[ring_shift] correct") and "on 4 ranks" in out and "on 3 ranks" in out


def test_a_ring_with_the_wrong_neighbour_is_told_what_each_rank_got(capsys):
    assert lab09.check_ring_shift(ring_the_wrong_way) is programs.ring_shift
    out = capsys.readouterr().out
    assert ("[ring_shift] finished on 4 ranks, but rank 0 received 1.0 where its left neighbour, "
            "rank 3, sent 3.0 (and 3 more ranks wrong)") in out


def test_an_unfilled_ring_falls_back(capsys):
    assert lab09.check_ring_shift(unfilled_ring) is programs.ring_shift
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.slow
def test_a_ring_that_still_deadlocks_is_told_where_every_rank_waits(capsys, no_leftover_ranks):
    lab09.warm_up()
    assert lab09.check_ring_shift(programs.ring_shift_blocking) is programs.ring_shift
    out = capsys.readouterr().out
    assert out.startswith("[ring_shift] still deadlocks on 4 ranks:")
    for r in range(4):
        assert f"rank {r}: in send() at line 7: comm.send(mine, right)" in out
    assert "Hint: a blocking send returns only once" in out


# ------------------------------------------------------------------ the schedule
def schedule_dropped(rank, world_size, steps=12):
    """The drift is gone because the schedule is gone: the learning rate stays 0.4."""
    import torch
    from parlab.course.lab09_programs import SIZES, data_parallel_step, shards
    from parlab.torch import replicas, training
    net = training.build_model("mlp", sizes=SIZES, seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.4)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    watch = replicas.DriftWatch(net)
    for step, batch in zip(range(steps), shards(rank)):
        data_parallel_step(net, opt, batch)
        watch.check(step)
    return {"state": training.state_numpy(net), "first": watch.first,
            "lr": schedule.get_last_lr()[0]}


def test_a_right_schedule_is_used(capsys):
    assert lab09.check_schedule(programs.scheduled) is programs.scheduled
    out = capsys.readouterr().out
    assert out.startswith("[schedule] correct: the replicas agree after every one of 12 steps")


def test_a_schedule_that_still_drifts_is_told_where(capsys):
    assert lab09.check_schedule(programs.scheduled_on_rank_0) is programs.scheduled
    out = capsys.readouterr().out
    assert out.startswith("[schedule] still drifts: the replicas first differed after step 4, "
                          "on 0.weight, 0.bias, 2.weight, 2.bias (rank 1 by up to")


def test_a_schedule_fixed_by_dropping_it_is_told_that_it_changed_the_result(capsys):
    assert lab09.check_schedule(schedule_dropped) is programs.scheduled
    out = capsys.readouterr().out
    assert out.startswith("[schedule] fixed, but changed the result: the replicas agree")
    assert "The learning rate ended at 0.4; the schedule (halve every 4 steps) gives 0.05" in out


def schedule_that_raises(rank, world_size, steps=12):
    raise ValueError(f"shard {rank} is empty")


def test_a_schedule_that_fails_is_told_which_rank_and_why(capsys, no_leftover_ranks):
    assert lab09.check_schedule(schedule_that_raises) is programs.scheduled
    out = capsys.readouterr().out
    assert out.startswith("[schedule] fails on 2 ranks:\n")
    assert "ValueError: shard" in out and "The lab goes on with the reference." in out


def test_an_unfilled_schedule_falls_back(capsys):
    assert lab09.check_schedule(unfilled_schedule) is programs.scheduled
    assert "not attempted yet" in capsys.readouterr().out
