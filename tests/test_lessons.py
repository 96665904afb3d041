"""Lessons as checks: the verdict lines, the registry, the count over runs, the command line,
and the checks of labs 06 and 08 on numbers that show them and on planted ones that do not.
(Each other lab's checks: tests/test_lessons_labNN.py.)"""
import subprocess
import sys

import pytest

from parlab.course import lab06, lab08, lessons  # noqa: F401 (a lab registers its lessons)


def test_a_verdict_prints_one_line_with_the_figures_and_why_it_failed():
    assert str(lessons.Verdict("06.x", True, "async 1.90x sync")) == \
        "lesson 06.x: shown — async 1.90x sync"
    assert str(lessons.Verdict("06.x", False, "async 0.64x sync", "31 % waiting for a core")) == \
        "lesson 06.x: not shown on this run — async 0.64x sync; 31 % waiting for a core"


def test_a_lesson_name_must_start_with_its_lab_and_an_unknown_one_is_named():
    with pytest.raises(ValueError, match="'NN.what_it_shows'"):
        lessons.lesson("6.async", "claim", dict)
    with pytest.raises(KeyError, match="no lesson '06.nothing'"):
        lessons.evaluate("06.nothing", {})


def test_the_count_runs_each_shared_experiment_once_per_run(monkeypatch):
    calls = []

    def experiment():
        calls.append(1)
        return {"value": len(calls)}

    fake = {"00.odd": lessons.Lesson("00.odd", "odd", lambda m: (m["value"] % 2 == 1, f"v {m['value']}", "even"), experiment),
            "00.any": lessons.Lesson("00.any", "any", lambda m: (True, "always", ""), experiment)}
    monkeypatch.setattr(lessons, "_LESSONS", fake)
    monkeypatch.setattr(lessons, "of_lab", lambda lab: list(fake.values()))
    lines = []
    got = lessons.run(["00"], runs=3, out=lines.append)
    assert len(calls) == 3                                   # one experiment call per run
    assert [v.shown for v in got["00.odd"]] == [True, False, True]
    assert lines[0] == "lesson 00.odd: shown 2/3 (v 1; v 2 [not shown: even]; v 3)"
    assert lines[1] == "lesson 00.any: shown 3/3 (always; always; always)"
    # 2 of 3 is under 8 in 10: only the lesson shown every time counts for the targets
    assert lines[2].startswith("lessons: 1 of 2 shown in every run, 1 in at least 9 runs of "
                               "10, 1 in at least 8 of 10 (3 runs, load ")


def test_show_prints_the_verdict_and_the_summary_repeats_it_under_the_claim(capsys):
    numbers = {"held": {"zero3": 25.0, "ddp": 100.0}, "devices": 4}
    assert lessons.show("08.zero3_keeps_a_share", numbers) is None    # a cell prints it once
    assert capsys.readouterr().out.startswith("lesson 08.zero3_keeps_a_share: shown — ")
    lessons.summary("08")
    out = capsys.readouterr().out
    claim = out.index("* With N devices, ZeRO-3 keeps")
    assert out.index("lesson 08.zero3_keeps_a_share: shown — ZeRO-3 keeps 0.250") > claim


def _straggler(async_speed, slowdown):
    return {"speed": {"sync": 1000.0, "async": async_speed}, "slowdown": slowdown}


def test_async_beats_sync_shown_when_async_is_well_ahead():
    v = lessons.evaluate("06.async_beats_sync", _straggler(1900.0, 3.0))
    assert v.shown and "async 1.90x sync" in v.figures and "2.00x" in v.figures


def test_async_beats_sync_not_shown_says_how_slow_the_slow_worker_was():
    v = lessons.evaluate("06.async_beats_sync", _straggler(640.0, 1.8))
    assert not v.shown and "only 1.8x slower" in v.why
    v = lessons.evaluate("06.async_beats_sync", _straggler(1100.0, 3.0))
    assert not v.shown and "no-communication model leaves out" in v.why


def test_zero_lessons_on_the_papers_counts_and_on_planted_ones():
    exact = {"sent": {"ddp": 100.0, "zero1": 100.0, "zero2": 100.0, "zero3": 150.0},
             "held": {"ddp": 100.0, "zero3": 25.5}, "devices": 4}
    assert lessons.evaluate("08.zero3_sends_half_again", exact).shown
    assert lessons.evaluate("08.zero3_keeps_a_share", exact).shown
    planted = {"sent": {"ddp": 100.0, "zero1": 100.0, "zero2": 130.0, "zero3": 200.0},
               "held": {"ddp": 100.0, "zero3": 50.0}, "devices": 4}
    v = lessons.evaluate("08.zero3_sends_half_again", planted)
    assert not v.shown and v.why.startswith("zero2, zero3 off the paper's count")
    v = lessons.evaluate("08.zero3_keeps_a_share", planted)
    assert not v.shown and "0.500" in v.figures and "more than 1/N" in v.why


@pytest.mark.parametrize("args, message", [
    (["--lab", "99"], f"--lab must be one of {', '.join(lessons.LABS)} (e.g. --lab 06), got '99'"),
    (["--runs", "0"], "--runs must be 1 or more")])
def test_the_command_refuses_bad_settings_by_name(args, message):
    out = subprocess.run([sys.executable, "-m", "parlab", "lessons", *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr


def test_the_command_runs_a_labs_experiments_and_counts_what_showed(no_leftover_ranks):
    out = subprocess.run([sys.executable, "-m", "parlab", "lessons", "--lab", "08"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("lesson 08.zero3_sends_half_again: shown 1/1 (zero1 1.00x")
    assert lines[-1].startswith("lessons: 2 of 2 shown in every run, 2 in at least 9 runs of "
                                "10, 2 in at least 8 of 10 (1 run, load ")


def test_throughput_counts_the_gradients_that_came_while_every_worker_pushed():
    from parlab.course import lab06
    from parlab.trace import Span, Timeline
    ms = 1e-3
    # worker 1 pushes at 1, 2, 3, 4 ms, worker 2 at 2.5 and 5 ms; the server starts at 0
    spans = [Span(0, "wait", "wait for push", 0.0, 0.5 * ms)]
    spans += [Span(0, "comm", "receive gradients", (t - 0.1) * ms, t * ms, 100, peer=w)
              for t, w in ((1, 1), (2, 1), (2.5, 2), (3, 1), (4, 1), (5, 2))]
    part = lab06.while_all_push(Timeline(spans))
    assert part["until"] == pytest.approx(4 * ms)          # worker 1's last gradient
    assert part["pushes"] == {1: 4, 2: 1}                   # the one at 5 ms came alone
    assert lab06.samples_per_s(Timeline(spans), 64, 2) == pytest.approx(5 * 32 / (4 * ms))


def test_the_loss_history_on_a_replay_keeps_each_workers_own_order():
    from types import SimpleNamespace

    from parlab.course import lab06
    from parlab.trace import Span, Timeline
    ms = 1e-3
    # the run applied worker 2's gradient first; on the replay worker 1's arrives first
    applied = [{"time": 5.0, "worker": 2, "loss": 2.0}, {"time": 6.0, "worker": 1, "loss": 1.0},
               {"time": 7.0, "worker": 1, "loss": 0.5}]
    run = SimpleNamespace(results=[{"applied": applied, "start": 4.0}])
    spans = [Span(0, "wait", "wait for push", 0.0, 0.5 * ms)]
    spans += [Span(0, "comm", "receive gradients", (t - 0.1) * ms, t * ms, 100, peer=w)
              for t, w in ((1, 1), (2, 2), (3, 1))]
    got = [(h["worker"], h["loss"], round(h["time"] / ms, 6)) for h in lab06.history_on(Timeline(spans), run)]
    assert got == [(1, 1.0, 1.0), (2, 2.0, 2.0), (1, 0.5, 3.0)]
