"""Lab 09's lessons: each check says "shown" on numbers that show its claim and "not
shown", with the reason, on planted numbers that contradict it; the functions that
read a run's numbers are checked on planted outcomes and timelines (no ranks start)."""
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from parlab import LaunchTimeout, WorkerError
from parlab.course import lab09, lessons, reports
from parlab.course import lab09_programs as programs
from parlab.trace import Span, Timeline

NOTEBOOK = Path(__file__).resolve().parents[1] / "labs" / "09_when_things_go_wrong.ipynb"


# ------------------------------------------------------------------ deadlock
def stack(fn, offset, call):
    line = fn.__code__.co_firstlineno + offset
    return (f"stack, most recent call first: {call} (distributed/distributed_c10d.py:1) <- "
            f"wrapper (distributed/c10d_logger.py:83) <- {call} (torch/comm.py:140) <- "
            f"{fn.__name__} (course/lab09_programs.py:{line})")


def outcome(stuck, ended_error=None):
    err = ended_error or LaunchTimeout(4.0, 2, stuck)
    return reports.Outcome("deadlock", programs.swap, 2, 4.1, error=err)


def test_deadlock_numbers_read_each_rank_s_line_and_call():
    m = lab09.deadlock_numbers(outcome({0: stack(programs.swap, 6, "send"),
                                        1: stack(programs.swap, 6, "send")}))
    assert m["sends"] == [7] and m["ended"] == "hung"
    assert m["stuck"] == {0: {"line": 7, "call": "send"}, 1: {"line": 7, "call": "send"}}
    v = lessons.evaluate("09.deadlock_named_at_the_sends", m)
    assert v.shown and v.figures == ("rank 0 in send() at line 7, rank 1 in send() at line 7 "
                                     "(the sends: line 7); the launch hung")


def test_deadlock_not_shown_when_a_rank_was_still_starting_up():
    m = lab09.deadlock_numbers(outcome({0: stack(programs.swap, 6, "send"),
                                        1: "still starting up: importing torch (for 4.0 s)"}))
    v = lessons.evaluate("09.deadlock_named_at_the_sends", m)
    assert not v.shown and v.why == "rank 1 was still starting up: importing torch (for 4.0 s)"


def test_deadlock_not_shown_when_a_rank_waits_elsewhere():
    m = lab09.deadlock_numbers(outcome({0: stack(programs.swap, 6, "send"),
                                        1: stack(programs.swap, 7, "recv")}))
    v = lessons.evaluate("09.deadlock_named_at_the_sends", m)
    assert not v.shown and v.why == "rank 1 was at line 8"


def test_deadlock_not_shown_when_the_launch_did_not_hang():
    m = lab09.deadlock_numbers(outcome({}, WorkerError(1, 2, "ValueError: no")))
    v = lessons.evaluate("09.deadlock_named_at_the_sends", m)
    assert not v.shown and v.why == "the launch failed after 4.1 s instead of hanging"


# ------------------------------------------------------------------ the bit flip
def flip_run(first, second=None):
    results = [{"first": first}, {"first": second if second is not None else first}]
    return lab09.drift_numbers(reports.Outcome("bit flip", programs.swap, 2, 0.5,
                                               result=SimpleNamespace(results=results)))


FOUND = {"step": 6, "tensor": "2.weight", "tensors": ["2.weight"], "ranks": [1],
         "max_difference": 7.46e-9}


def test_flip_shown_when_found_where_planted():
    v = lessons.evaluate("09.bit_flip_found_where_planted", flip_run(FOUND))
    assert v.shown and v.figures == ("first difference at step 6, in 2.weight, rank 1, by 7.5e-09 "
                                     "(planted: step 6, 2.weight, rank 1)")


def test_flip_not_shown_when_found_at_another_step_or_not_at_all():
    v = lessons.evaluate("09.bit_flip_found_where_planted", flip_run({**FOUND, "step": 7}))
    assert not v.shown and "first difference at step 7" in v.figures and v.why == "found elsewhere"
    v = lessons.evaluate("09.bit_flip_found_where_planted",
                         {"ended": "finished", "planted": programs.FLIP, "first": None, "agree": True})
    assert not v.shown and v.why == "no check differed"


def test_flip_not_shown_when_the_ranks_disagree():
    v = lessons.evaluate("09.bit_flip_found_where_planted", flip_run(FOUND, {**FOUND, "step": 5}))
    assert not v.shown and v.why == "the ranks' checks disagree with each other"


# ------------------------------------------------------------------ NaN
def nan_run(first, losses):
    results = [{"first": first, "losses": row} for row in losses]
    return lab09.nan_numbers(reports.Outcome("NaN", programs.swap, 2, 0.5,
                                             result=SimpleNamespace(results=results)))


NAN = float("nan")
SPREAD = [[2.0] * 7 + [NAN] * 3, [2.0] * 6 + [NAN] * 4]
FIRST = {"step": 6, "rank": 1, "tensor": "batch", "ranks": {1: ["batch", "loss", "gradients"]}}


def test_nan_shown_when_traced_to_the_planted_rank_and_spread_within_a_step():
    m = nan_run(FIRST, SPREAD)
    assert m["first_nan_loss"] == {0: 7, 1: 6}
    v = lessons.evaluate("09.nan_traced_to_its_rank", m)
    assert v.shown and v.figures == ("first non-finite: rank 1 at step 6, in its batch; NaN "
                                     "losses: rank 0 from step 7, rank 1 from step 6 (planted: "
                                     "rank 1, step 6)")


def test_nan_not_shown_when_traced_elsewhere_or_not_spread():
    v = lessons.evaluate("09.nan_traced_to_its_rank", nan_run({**FIRST, "rank": 0}, SPREAD))
    assert not v.shown and v.why == "found elsewhere"
    v = lessons.evaluate("09.nan_traced_to_its_rank", nan_run(FIRST, [[2.0] * 10, SPREAD[1]]))
    assert not v.shown and "rank 0 from step None" in v.figures
    assert v.why == "the NaN did not reach every rank within a step"
    v = lessons.evaluate("09.nan_traced_to_its_rank", nan_run(None, [[2.0] * 10] * 2))
    assert not v.shown and v.figures.startswith("nothing non-finite found")


# ------------------------------------------------------------------ the straggler
def straggler_timeline(steps=8, slow=2, lag_ms=6.0):
    """3 ranks; each step: forward, backward, then the gradient all-reduce, which every
    rank but ``slow`` enters ``lag_ms`` early (waiting), and all leave together."""
    ms, spans = 1e-3, []
    for k in range(steps):
        t = 20 * ms * k
        for r in range(3):
            busy = (2 + (lag_ms if r == slow else 0)) * ms
            spans += [Span(r, "compute", "forward", t, t + 1 * ms),
                      Span(r, "compute", "backward", t + 1 * ms, t + 2 * ms)]
            if r == slow:
                spans.append(Span(r, "compute", "emulated slowdown", t + 2 * ms, t + busy))
            spans.append(Span(r, "comm", "gradient all_reduce", t + busy, t + 9 * ms, 100,
                              key=("coll", ("c", (0, 1, 2), k))))
    return SimpleNamespace(timeline=Timeline(spans),
                           results=[{"step_s": [0.02] * steps} for _ in range(3)])


def test_straggler_numbers_find_who_arrived_last_and_who_waited_on_the_replay():
    """Read on the replay: the ring all-reduce priced on the link, 2(n - 1) = 4 latencies of
    1 ms; the 11 ms between a step's all-reduce and the next forward is untraced work, kept.
    A step: 2 ms of passes + 6 ms of slowdown + 4 + 11 = 23 ms; ranks 0 and 1 wait 6."""
    from parlab import sim
    m = lab09.straggler_numbers(straggler_timeline(), link=sim.Link(1e-3, 1e12))
    assert m["planted"] == 2 and m["steps"] == 5          # 8 steps, 2 skipped, the last dropped
    assert m["last"] == {0: 0, 1: 0, 2: 5}
    assert m["shares"][0]["wait"] == pytest.approx(6 / 23) and m["shares"][2]["wait"] == 0
    assert m["shares"][2]["compute"] == pytest.approx(8 / 23)
    assert m["step_ms"] == pytest.approx(23) and m["source"].startswith("replayed on 3 dedicated")


def straggler(last, waits, compute=(0.4, 0.4, 0.9), steps=18):
    return {"planted": 2, "steps": steps, "last": dict(enumerate(last)),
            "shares": {r: {"wait": w, "compute": c} for r, (w, c) in enumerate(zip(waits, compute))},
            "step_ms": 40.0}


def test_straggler_shown_when_it_arrives_last_and_the_others_wait():
    v = lessons.evaluate("09.straggler_is_waited_for", straggler([1, 1, 16], [0.55, 0.6, 0.02]))
    assert v.shown and v.figures == ("rank 2 arrived last in 16 of 18 warm steps; waiting: rank 0 "
                                     "55%, rank 1 60%, rank 2 2%")


def test_straggler_not_shown_when_the_others_barely_wait_or_it_is_rarely_last():
    v = lessons.evaluate("09.straggler_is_waited_for",
                         straggler([2, 2, 14], [0.55, 0.6, 0.02]))
    assert not v.shown and v.why == "computing: rank 0 40%, rank 1 40%, rank 2 90%"
    v = lessons.evaluate("09.straggler_is_waited_for", straggler([1, 1, 16], [0.2, 0.6, 0.02]))
    assert not v.shown and "rank 0 20%" in v.figures


# ------------------------------------------------------------------ the lab as a whole
def test_every_lesson_of_lab09_is_registered_with_its_experiment():
    assert {x.name for x in lessons.of_lab("09")} == {
        "09.deadlock_named_at_the_sends", "09.bit_flip_found_where_planted",
        "09.nan_traced_to_its_rank", "09.straggler_is_waited_for"}


def test_the_closing_note_names_runs_the_notebook_makes():
    source = "\n".join("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"])
    named = set(re.findall(r'provoke\("([^"]+)"', source))
    made_by_lab = {"send buffering", "TensorFlow worker frozen", "straggler: straggler",
                   *(f"dies: {how}" for how in ("raise", "exit", "killed")),
                   *(f"mismatch {k}{d}" for k in programs.MISMATCHES for d in ("", " DETAIL"))}
    for mode, *_, runs in lab09.MODES:
        missing = [r for r in runs if r not in named | made_by_lab]
        assert not missing, f"{mode}: the notebook makes no run named {missing}"


def test_closing_note_says_what_was_not_run(capsys):
    lab09._SECONDS.clear()
    lab09._SECONDS["deadlock"] = 4.2
    lab09.closing_note()
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("deadlock by message order") and out[1].endswith("4.2")
    assert out[2].endswith("not run yet in this kernel")


def test_said_puts_a_run_in_one_line():
    finished = reports.Outcome("x", programs.mismatched, 2, 0.7,
                               result=SimpleNamespace(results=[[1.0, 1.0000001192092896],
                                                               [1065353216, 1065353217]]))
    assert lab09._said(finished) == ("finished in 0.7 s: rank 0 got [1, 1.00000012], rank 1 got "
                                     "[1065353216, 1065353217]")
    detail = WorkerError(1, 2, "RuntimeError: Detected mismatch between collectives on ranks. "
                         "Collectives differ in the following aspects: \t Tensor Tensor shapes: "
                         "8vs 4  Tensor Tensor dtypes: Floatvs Int")
    said = lab09._said(reports.Outcome("y", programs.mismatched, 2, 0.3, error=detail))
    assert said == "error after 0.3 s on rank 1: shapes: 8 vs 4; dtypes: Float vs Int"
