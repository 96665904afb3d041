"""Pipelines: schedules on paper, and on ranks against the sequential model."""
import time

import numpy as np
import pytest
from batched import launch_each
from conftest import rank_processes

import parlab
from parlab import pipeline as schedules
from parlab.course import lab04
from parlab.course.lab04 import run_pipeline
from parlab.metrics import pipeline_bubble
from parlab.split import SplitConfig
from parlab.torch import pipeline as pl
from parlab.torch import split

TOL = 1e-5
LIGHT = SplitConfig(sizes=(64, 64, 64, 64, 64, 10), batch_size=48, steps=3, lr=0.1)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_schedules_are_valid_and_their_bubble_is_the_formula(name):
    for p in range(1, 6):
        for m in range(1, 10):
            ops = schedules.make(name, p, m)
            schedules.check(ops, p, m)
            predicted = schedules.simulate(ops, p, m, forward_s=1.0, backward_s=2.0)
            assert schedules.bubble_share(predicted) == pytest.approx(pipeline_bubble(p, m))
            assert all(s.endswith("(predicted)") for s in predicted.labels.values())


def test_memory_bounds_gpipe_holds_m_and_1f1b_at_most_p_minus_s():
    assert schedules.peak_in_flight(schedules.gpipe(4, 8)) == [8, 8, 8, 8]
    assert schedules.peak_in_flight(schedules.one_f_one_b(4, 8)) == [4, 3, 2, 1]
    assert schedules.peak_in_flight(schedules.one_f_one_b(4, 2)) == [2, 2, 2, 1]


def test_deadlocks_and_incomplete_schedules_are_explained():
    deadlock = [[("F", 0), ("F", 1), ("B", 1), ("B", 0)], [("B", 0), ("F", 0), ("F", 1), ("B", 1)]]
    with pytest.raises(ValueError, match="deadlocks: stage 0 waits at B1 for B1 on stage 1; "
                                         "stage 1 waits at B0 for its own F0"):
        schedules.check(deadlock, 2, 2)
    with pytest.raises(ValueError, match=r"stage 1 must run .* missing \[\('B', 0\)\]"):
        schedules.check([[("F", 0), ("B", 0)], [("F", 0)]], 2, 1)
    with pytest.raises(ValueError, match="schedule must be one of"):
        schedules.make("zero-bubble", 2, 2)


PIPELINES = [(2, 1, "gpipe"), (2, 3, "1f1b"), (2, 4, "gpipe"), (3, 4, "1f1b"), (3, 2, "gpipe"),
             (2, 6, "1f1b")]


IN_TURN = (1, 2, 4)          # lab04.bubble_runs' steps, m in turn (LIGHT's 3 steps = 3 rounds)


@pytest.fixture(scope="module")
def pipelines():
    """Every (stages, micro-batches, schedule) above: one launch per number of stages,
    each prepared (validated) as ``lab04.run_pipeline`` prepares it."""
    calls = {}
    for p, m, name in PIPELINES:
        cfg, ops = pl.prepare(LIGHT, p, m, name)
        calls.setdefault(p, {})[(m, name)] = (pl.train_pipeline, (cfg, m, ops))
    cfg, plan = pl.prepare_in_turn(LIGHT, 2, IN_TURN)
    calls[2]["in turn"] = (pl.train_pipeline_in_turn, (cfg, plan))
    out = {p: launch_each(c, p) for p, c in calls.items()}
    assert not rank_processes(), "ranks left running"
    return out


@pytest.mark.parametrize("p,m,name", PIPELINES)
def test_pipeline_training_equals_the_sequential_model(p, m, name, pipelines):
    ref = split.train_reference(LIGHT)
    out = pipelines[p][(m, name)]
    np.testing.assert_allclose(out.results[-1]["losses"], ref["losses"], atol=TOL)
    grads = {k: v for r in out.results for k, v in r["first_grads"].items()}
    assert grads.keys() == ref["first_grads"].keys()
    for k, v in ref["first_grads"].items():
        np.testing.assert_allclose(grads[k], v, atol=TOL, err_msg=k)
    state = {k: v for r in out.results for k, v in r["state"].items()}
    for k, v in ref["state"].items():
        np.testing.assert_allclose(state[k], v, atol=TOL, err_msg=k)
    peaks = [r["peak_micro_batches"] for r in out.results]
    assert peaks == schedules.peak_in_flight(schedules.make(name, p, m))


def test_bad_pipelines_are_refused_before_any_rank_starts():
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"batch of 48 does not divide into 5 micro-batches: use one of \[1, 2, 3, 4, 6"):
        run_pipeline(LIGHT, 2, 5)
    deadlock = [[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]]
    with pytest.raises(ValueError, match="deadlocks"):
        run_pipeline(LIGHT, 2, 1, deadlock)
    with pytest.raises(ValueError, match="at most 9"):
        run_pipeline(LIGHT, 10, 1, "gpipe")
    assert time.perf_counter() - started < 5 and not rank_processes()


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_the_library_schedules_give_the_hand_written_gradients(name, no_leftover_ranks):
    cfg, ops = pl.prepare(SplitConfig(**{**LIGHT.__dict__, "steps": 1}), 2, 4, name)
    hand = parlab.launch(pl.train_pipeline, 2, args=(cfg, 4, ops)).results
    lib = parlab.launch(pl.library_step, 2, args=(cfg, 4, name)).results
    for h, lb in zip(hand, lib):
        assert h["first_grads"].keys() == lb["grads"].keys()
        for k in h["first_grads"]:
            np.testing.assert_allclose(lb["grads"][k], h["first_grads"][k], atol=TOL, err_msg=k)


def test_the_lstm_wavefront_computes_the_stack_and_fills_diagonally(no_leftover_ranks):
    out = parlab.launch(pl.lstm_wavefront, 3, args=(16, 12, 8))
    single = pl.lstm_single_device(3, hidden=16, length=12, batch=8, repeats=1)
    np.testing.assert_allclose(out.results[-1]["h"], single["stepped cells"]["h"], atol=TOL)
    np.testing.assert_allclose(single["fused nn.LSTM"]["h"], single["stepped cells"]["h"], atol=TOL)
    # layer k starts time step 0 only after layer k-1 has finished it
    first = {r: min(s.start for s in out.timeline if s.rank == r and s.name == "t0") for r in range(3)}
    done = {r: min(s.end for s in out.timeline if s.rank == r and s.name == "t0") for r in range(3)}
    assert first[1] >= done[0] and first[2] >= done[1]


def test_the_1f1b_exercise_check(capsys):
    assert lab04.check_schedule(schedules.one_f_one_b) is schedules.one_f_one_b
    assert "correct" in capsys.readouterr().out
    assert lab04.check_schedule(schedules.gpipe) is schedules.one_f_one_b
    assert "hold [4, 4]" in capsys.readouterr().out


def test_steps_taken_with_each_m_in_turn_train_as_the_sequential_model(pipelines):
    """lab04.bubble_runs: 3 rounds of m = 1, 2, 4 are 9 steps of the same training."""
    from dataclasses import replace
    out = pipelines[2]["in turn"]
    ref = split.train_reference(replace(LIGHT, steps=LIGHT.steps * len(IN_TURN)))
    assert out.results[0]["order"] == list(IN_TURN) * LIGHT.steps
    np.testing.assert_allclose(out.results[-1]["losses"], ref["losses"], atol=TOL)
    state = {k: v for r in out.results for k, v in r["state"].items()}
    assert state.keys() == ref["state"].keys()
    for k, v in ref["state"].items():
        np.testing.assert_allclose(state[k], v, atol=TOL, err_msg=k)


def test_steps_in_turn_are_told_apart_by_their_micro_batches(pipelines):
    out = pipelines[2]["in turn"]
    steps = pl.steps_by_micro_batches(out.timeline, 2, out.results[0]["order"])
    assert {m: len(w) for m, w in steps.items()} == {m: LIGHT.steps for m in IN_TURN}
    every = sorted(w for ws in steps.values() for w in ws)
    assert all(a < b <= c for (a, b), (c, _) in zip(every, every[1:]))    # one after another
    for m, windows in steps.items():           # each window holds exactly that m's F and B
        for a, b in windows:
            fb = [s for s in out.timeline.window(a, b) if s.name[:1] in "FB"
                  and s.name[1:].isdigit() and s.end - s.start > 0]
            assert len(fb) == 2 * 2 * m, (m, len(fb))


def test_steps_in_turn_refuse_an_optimizer_with_state():
    from dataclasses import replace
    with pytest.raises(ValueError, match="set optimizer='sgd'"):
        pl.prepare_in_turn(replace(LIGHT, optimizer="adam"), 2, IN_TURN)
    with pytest.raises(ValueError, match="at least one micro-batch count"):
        pl.prepare_in_turn(LIGHT, 2, ())
    with pytest.raises(ValueError, match="does not divide into 5"):
        pl.prepare_in_turn(LIGHT, 2, (1, 5))


@pytest.mark.parametrize("p", [2, 3, 4])
def test_the_cost_models_stages_hold_the_executors_layers(p):
    """lab04.linear_bounds: the executor's cut (module indices, a ReLU after each Linear)
    as Linear indices; each stage holds the same parameters on both sides."""
    from parlab import sim
    cfg = lab04.PIPE
    bounds = pl.prepare(cfg, p, 4)[0].bounds
    costs = split.param_costs(split.build(cfg))
    cut = lab04.linear_bounds(bounds)
    net = sim.Network.mlp(cfg.sizes)
    for a, b, x, y in zip([0, *bounds], [*bounds, len(costs)], [0, *cut], [*cut, len(net)]):
        assert sum(costs[a:b]) == sum(layer.params for layer in net.layers[x:y])
    assert lab04.linear_bounds([7, 8]) == [4, 4]


def test_a_pass_is_read_from_its_span_name():
    from parlab.pipeline import pass_kind, pass_of
    assert pass_of("F3") == ("F", 3) and pass_of("B12") == ("B", 12)
    assert [pass_of(n) for n in ("forward", "F", "Fx", "recv", "B-1", "")] == [None] * 6
    assert (pass_kind("B0"), pass_kind("backward")) == ("B", None)
