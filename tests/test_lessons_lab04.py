"""Lab 04's lessons: each check says "shown" on numbers that show its claim and "not
shown", with the measured reason, on planted numbers that contradict it (no ranks start)."""
from types import SimpleNamespace

import pytest

from parlab import pipeline
from parlab.course import lab04, lessons
from parlab.trace import Span, Timeline


def row(m, step_ms, wait_idle, predicted=None, core_wait=0.02, comm=0.01, fb_ms=(20.0, 35.0)):
    """One m of ``lab04.bubble_numbers``; F and B per micro-batch shrink as 1/m."""
    f, b = fb_ms[0] / m / 1e3, fb_ms[1] / m / 1e3
    pred = 1 / (m + 1) if predicted is None else predicted
    return {"step": step_ms / 1e3, "wait_idle": wait_idle, "core_wait": core_wait, "comm": comm,
            "forward": [f, f], "backward": [b, b], "predicted_step": (m + 1) * (f + b),
            "predicted": pred, "formula": 1 / (m + 1), "work": 2 * m * (f + b)}


AS_PREDICTED = {"stages": 2, "by_m": {1: row(1, 110, 0.49), 2: row(2, 85, 0.33),
                                      4: row(4, 75, 0.22), 8: row(8, 78, 0.13)}}


def test_bubble_shown_when_wait_and_idle_are_the_predicted_bubble():
    v = lessons.evaluate("04.bubble_as_predicted", AS_PREDICTED)
    assert v.shown
    assert "m = 1 0.49/0.50" in v.figures and "m = 8 0.13/0.11" in v.figures
    assert "(formula 0.50, 0.33, 0.20, 0.11)" in v.figures


def test_bubble_not_shown_and_blames_the_cores_when_they_were_busy():
    planted = {"stages": 2, "by_m": dict(AS_PREDICTED["by_m"])}
    planted["by_m"][8] = row(8, 140, 0.30, core_wait=0.25)
    v = lessons.evaluate("04.bubble_as_predicted", planted)
    assert not v.shown and "m = 8 0.30/0.11" in v.figures
    assert "m = 8 off by more than 5 points" in v.why
    assert "19% of the step more than predicted; core contention" in v.why
    assert "waited for a core 25% of the step" in v.why


def test_bubble_not_shown_below_the_prediction_names_what_was_measured():
    planted = {"stages": 2, "by_m": dict(AS_PREDICTED["by_m"])}
    planted["by_m"][1] = row(1, 110, 0.30, core_wait=0.01, comm=0.01)
    v = lessons.evaluate("04.bubble_as_predicted", planted)
    assert not v.shown
    assert "20% of the step less than predicted" in v.why
    assert "neither core waits nor transfers" in v.why


def test_micro_batches_pay_shown_when_the_best_m_is_quicker():
    v = lessons.evaluate("04.micro_batches_pay", AS_PREDICTED)
    assert v.shown
    assert "m = 1 step 110 ms, quickest m = 4 75 ms: 1.47x" in v.figures
    assert "predicted from the measured F and B: 1.60x" in v.figures


def test_micro_batches_pay_not_shown_when_m_1_is_quickest_and_cores_were_busy():
    planted = {"stages": 2, "by_m": {1: row(1, 100, 0.49, core_wait=0.01),
                                     2: row(2, 105, 0.33, core_wait=0.20),
                                     4: row(4, 120, 0.22, core_wait=0.30),
                                     8: row(8, 130, 0.13, core_wait=0.35)}}
    v = lessons.evaluate("04.micro_batches_pay", planted)
    assert not v.shown and "quickest m = 2 105 ms: 0.95x" in v.figures
    assert v.why.startswith("core contention: at m = 2 the stages waited for a core 20%")
    assert "(m = 1: 1%)" in v.why


def test_micro_batches_pay_not_shown_names_the_cost_of_small_micro_batches():
    planted = {"stages": 2, "by_m": {1: row(1, 100, 0.49),
                                     2: row(2, 98, 0.33, fb_ms=(30.0, 50.0))}}
    v = lessons.evaluate("04.micro_batches_pay", planted)
    assert not v.shown and "core contention" not in v.why
    assert "F and B took 1.45x the time of m = 1's" in v.why


def memory(held_1f1b, held_gpipe, m=8):
    per = 1000
    return {"micro_batches": m, "held": {"gpipe": held_gpipe, "1f1b": held_1f1b},
            "bytes": {"gpipe": [h * per for h in held_gpipe], "1f1b": [h * per for h in held_1f1b]}}


def test_memory_shown_for_the_schedules_as_written():
    held = {k: pipeline.peak_in_flight(pipeline.make(k, 4, 8)) for k in ("1f1b", "gpipe")}
    v = lessons.evaluate("04.one_f_one_b_holds_less", memory(held["1f1b"], held["gpipe"]))
    assert v.shown
    assert "1F1B [4, 3, 2, 1] (p - s: [4, 3, 2, 1]), GPipe [8, 8, 8, 8]" in v.figures
    assert "0.50, 0.38, 0.25, 0.12 of GPipe's" in v.figures


def test_memory_not_shown_when_1f1b_holds_more_than_its_bound():
    v = lessons.evaluate("04.one_f_one_b_holds_less", memory([4, 5, 2, 1], [8, 8, 8, 8]))
    assert not v.shown and "1F1B held more than p - s on stage 1" in v.why
    v = lessons.evaluate("04.one_f_one_b_holds_less", memory([4, 3, 2, 1], [8, 8, 6, 8]))
    assert not v.shown and "GPipe did not hold all m on stage 2" in v.why


def _measured(schedule, stages, m, f, b, steps=3, gap=0.01):
    """A launch's result whose timeline is the schedule played ``steps`` times."""
    one = pipeline.simulate(pipeline.make(schedule, stages, m), stages, m, f, b)
    spans = [Span(s.rank, s.kind, s.name, s.start + k * (one.duration + gap),
                  s.end + k * (one.duration + gap)) for k in range(steps) for s in one]
    return SimpleNamespace(timeline=Timeline(spans))


def test_bubble_numbers_read_a_pipeline_played_on_paper_as_its_bubble():
    pipes = {m: _measured("1f1b", 2, m, 0.02 / m, 0.04 / m) for m in (1, 4)}
    got = lab04.bubble_numbers(pipes)["by_m"]
    for m in (1, 4):
        assert got[m]["wait_idle"] == pytest.approx(1 / (m + 1))
        assert got[m]["predicted"] == pytest.approx(1 / (m + 1))
        assert got[m]["step"] == pytest.approx((m + 1) * 0.06 / m)
        assert got[m]["core_wait"] == 0.0 and got[m]["comm"] == 0.0
    assert lessons.evaluate("04.bubble_as_predicted", {"stages": 2, "by_m": got}).shown


def test_bubble_numbers_play_each_step_with_its_own_micro_batches():
    # micro-batches alternately quick and slow, on both stages: the stage behind waits for
    # the slow ones, a bubble above what each stage's median F and B would make
    f = [[0.004, 0.012] * 4, [0.004, 0.012] * 4]
    b = [[0.008, 0.024] * 4, [0.008, 0.024] * 4]
    spans = []
    for s in pipeline.simulate(pipeline.make("1f1b", 2, 8), 2, 8, f, b):
        spans.append(s)
        if s.name == "F3":                     # a core wait carved out of F3: still F3's time
            spans[-1] = Span(s.rank, s.kind, s.name, s.start, s.end - 0.002)
            spans.append(Span(s.rank, "core_wait", "F3 (core wait)", s.end - 0.002, s.end))
    one = Timeline(spans)
    steps = [Span(x.rank, x.kind, x.name, x.start + k * (one.duration + 0.01),
                  x.end + k * (one.duration + 0.01)) for k in range(3) for x in one]
    got = lab04.bubble_numbers({8: SimpleNamespace(timeline=Timeline(steps))})["by_m"][8]
    assert got["core_wait"] > 0 and got["predicted"] == pytest.approx(got["wait_idle"], abs=1e-9)
    assert got["predicted_step"] == pytest.approx(one.duration)
    medians = pipeline.bubble_share(pipeline.simulate(pipeline.make("1f1b", 2, 8), 2, 8,
                                                      [0.008, 0.008], [0.016, 0.016]))
    assert got["predicted"] > medians + 0.01
    with pytest.raises(ValueError, match="one time per micro-batch"):
        pipeline.simulate(pipeline.make("1f1b", 2, 8), 2, 8, [[0.1] * 7, 0.1], 0.2)


def test_typical_step_is_the_warm_step_nearest_the_median():
    one = pipeline.simulate(pipeline.make("gpipe", 2, 2), 2, 2, 1.0, 2.0)
    stretch = [1.0, 1.0, 1.1, 2.0]             # the last step is a 2x outlier
    spans, t0 = [], 0.0
    for k in stretch:
        spans += [Span(s.rank, s.kind, s.name, t0 + s.start * k, t0 + s.end * k) for s in one]
        t0 += one.duration * k + 1.0
    a, b = lab04.typical_step(Timeline(spans), 2, 2)
    assert b - a == pytest.approx(one.duration * 1.1)


def test_the_lab_has_these_lessons():
    assert {x.name for x in lessons.of_lab("04")} == {
        "04.bubble_as_predicted", "04.micro_batches_pay", "04.one_f_one_b_holds_less"}


def test_micro_batches_pay_prints_a_gain_just_below_its_threshold_as_below():
    planted = {"stages": 2, "by_m": {1: row(1, 120.0, 0.49), 2: row(2, 120.0 / 1.0496, 0.33)}}
    v = lessons.evaluate("04.micro_batches_pay", planted)
    assert not v.shown and ": 1.0496x (predicted" in v.figures


def test_micro_batches_pay_does_not_blame_small_micro_batches_that_cost_no_more():
    # the review's run: F and B at the quickest m took 0.98x m = 1's
    planted = {"stages": 2, "by_m": {1: row(1, 100, 0.49, comm=0.02),
                                     4: row(4, 98, 0.22, comm=0.12, fb_ms=(19.6, 34.3))}}
    v = lessons.evaluate("04.micro_batches_pay", planted)
    assert not v.shown and "F and B took 0.98x the time of m = 1's (no dearer" in v.why
    assert "less well" not in v.why and "core contention" not in v.why
    assert "transferred 12% of the step (m = 1: 2%; 8 hand-overs a step against 2)" in v.why


def test_the_typical_step_drawn_holds_the_updates_that_follow_its_last_backward():
    one = pipeline.simulate(pipeline.make("gpipe", 2, 2), 2, 2, 1.0, 2.0)
    spans, t0, starts = [], 0.0, []
    for _ in range(3):
        starts.append(t0)
        spans += [Span(s.rank, s.kind, s.name, t0 + s.start, t0 + s.end) for s in one]
        spans += [Span(r, "compute", "update", t0 + one.duration, t0 + one.duration + 0.5)
                  for r in range(2)]
        t0 += one.duration + 1.0
    a, b = lab04.typical_step(Timeline(spans), 2, 2)
    assert a in starts[1:]
    assert b == pytest.approx(a + one.duration + 0.5)      # the update, not the next step
