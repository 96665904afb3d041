"""Lab 04's lessons: each check says "shown" on numbers that show its claim and "not
shown", with the reason, on planted numbers that contradict it (no ranks start). The
lessons about time read the replay; the one about memory the measurement."""
import pytest

from parlab import pipeline
from parlab.course import lab04, lessons
from parlab.sim.replay import ReplayedTimeline
from parlab.trace import Span, Timeline


def row(m, step_ms, wait_idle, predicted=None, comm=0.01, fb_ms=(20.0, 35.0)):
    """One m of ``lab04.bubble_numbers``; F and B per micro-batch shrink as 1/m."""
    f, b = fb_ms[0] / m / 1e3, fb_ms[1] / m / 1e3
    pred = 1 / (m + 1) if predicted is None else predicted
    return {"step": step_ms / 1e3, "wait_idle": wait_idle, "comm": comm,
            "forward": [f, f], "backward": [b, b], "predicted_step": (m + 1) * (f + b),
            "predicted": pred, "formula": 1 / (m + 1), "work": 2 * m * (f + b)}


AS_PREDICTED = {"stages": 2, "by_m": {1: row(1, 110, 0.49), 2: row(2, 85, 0.33),
                                      4: row(4, 75, 0.22), 8: row(8, 78, 0.13)}}


def test_bubble_shown_when_wait_and_idle_are_the_predicted_bubble():
    v = lessons.evaluate("04.bubble_as_predicted", AS_PREDICTED)
    assert v.shown
    assert "m = 1 0.49/0.50" in v.figures and "m = 8 0.13/0.11" in v.figures
    assert "(formula 0.50, 0.33, 0.20, 0.11)" in v.figures


def test_bubble_not_shown_says_by_how_much_and_what_was_transferred():
    planted = {"stages": 2, "by_m": dict(AS_PREDICTED["by_m"])}
    planted["by_m"][8] = row(8, 140, 0.30, comm=0.04)
    v = lessons.evaluate("04.bubble_as_predicted", planted)
    assert not v.shown and "m = 8 0.30/0.11" in v.figures
    assert "m = 8 off by more than 5 points" in v.why
    assert "19% of the step more than the schedule on paper" in v.why
    assert "sent and received 4% of the step (16 hand-overs)" in v.why


def test_bubble_not_shown_below_the_prediction():
    planted = {"stages": 2, "by_m": dict(AS_PREDICTED["by_m"])}
    planted["by_m"][1] = row(1, 110, 0.30)
    v = lessons.evaluate("04.bubble_as_predicted", planted)
    assert not v.shown and "20% of the step less than the schedule on paper" in v.why


def test_micro_batches_pay_shown_when_m_4_is_quicker_enough():
    v = lessons.evaluate("04.micro_batches_pay", AS_PREDICTED)
    assert v.shown
    assert "m = 1 step 110 ms, m = 4 75 ms: 1.47x" in v.figures
    assert "the schedule on paper, from the same F and B: 1.60x" in v.figures


def test_micro_batches_pay_not_shown_names_the_cost_of_small_micro_batches():
    planted = {"stages": 2, "by_m": {1: row(1, 100, 0.49),
                                     4: row(4, 90, 0.22, fb_ms=(30.0, 50.0), comm=0.03)}}
    v = lessons.evaluate("04.micro_batches_pay", planted)
    assert not v.shown and ": 1.11x" in v.figures
    assert "F and B took 1.45x the time of m = 1's (smaller micro-batches" in v.why
    assert "sent and received 3% (m = 1: 1%; 8 hand-overs a step against 2)" in v.why


def test_micro_batches_pay_does_not_blame_small_micro_batches_that_cost_no_more():
    planted = {"stages": 2, "by_m": {1: row(1, 100, 0.49),
                                     4: row(4, 98, 0.40, fb_ms=(19.6, 34.3))}}
    v = lessons.evaluate("04.micro_batches_pay", planted)
    assert not v.shown and "F and B took 0.98x the time of m = 1's;" in v.why
    assert "less well" not in v.why
    assert "waited or idled 40% of the step (m = 1: 49%)" in v.why


def test_micro_batches_pay_prints_a_gain_just_below_its_threshold_as_below():
    planted = {"stages": 2, "by_m": {1: row(1, 130.0, 0.49), 4: row(4, 130.0 / 1.2996, 0.22)}}
    v = lessons.evaluate("04.micro_batches_pay", planted)
    assert not v.shown and ": 1.2996x (the schedule" in v.figures


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


def _in_turn(schedule, stages, order, f, b, gap=0.01, replayed=False):
    """A run whose steps take the micro-batch counts ``order`` in turn, each step its
    schedule played on paper with F ``f / m`` and B ``b / m`` per micro-batch."""
    spans, t0 = [], 0.0
    for m in order:
        one = pipeline.simulate(pipeline.make(schedule, stages, m), stages, m, f / m, b / m)
        spans += [Span(s.rank, s.kind, s.name, s.start + t0, s.end + t0) for s in one]
        t0 += one.duration + gap
    if replayed:
        return ReplayedTimeline(spans, notes={"devices": stages, "link": "a test link"})
    return Timeline(spans)


def test_bubble_numbers_read_a_pipeline_played_on_paper_as_its_bubble():
    order = [1, 4] * 3
    got = lab04.bubble_numbers(_in_turn("1f1b", 2, order, 0.02, 0.04), order)
    for m in (1, 4):
        r = got["by_m"][m]
        assert r["wait_idle"] == pytest.approx(1 / (m + 1))
        assert r["predicted"] == pytest.approx(1 / (m + 1))
        assert r["step"] == pytest.approx((m + 1) * 0.06 / m)
        assert r["comm"] == 0.0
        assert r["forward"] == pytest.approx([0.02 / m] * 2)
    assert "source" not in got           # a measurement says nothing of where it came from
    assert lessons.evaluate("04.bubble_as_predicted", got).shown
    assert lessons.evaluate("04.micro_batches_pay", got).shown      # 1.6x: free messages


def test_the_time_lessons_say_they_read_a_replay():
    order = [1, 4] * 3
    got = lab04.bubble_numbers(_in_turn("1f1b", 2, order, 0.02, 0.04, replayed=True), order)
    assert got["source"] == "replayed on 2 dedicated devices, this machine's idle link"
    v = lessons.evaluate("04.micro_batches_pay", got)
    assert str(v).startswith("lesson 04.micro_batches_pay: shown (replayed on 2 dedicated devices")


def test_bubble_numbers_play_each_step_with_its_own_micro_batches():
    # micro-batches alternately quick and slow, on both stages: the stage behind waits for
    # the slow ones, a bubble above what each stage's median F and B would make
    f = [[0.004, 0.012] * 4, [0.004, 0.012] * 4]
    b = [[0.008, 0.024] * 4, [0.008, 0.024] * 4]
    one = pipeline.simulate(pipeline.make("1f1b", 2, 8), 2, 8, f, b)
    steps = [Span(x.rank, x.kind, x.name, x.start + k * (one.duration + 0.01),
                  x.end + k * (one.duration + 0.01)) for k in range(3) for x in one]
    got = lab04.bubble_numbers(Timeline(steps), [8, 8, 8])["by_m"][8]
    assert got["predicted"] == pytest.approx(got["wait_idle"], abs=1e-9)
    assert got["predicted_step"] == pytest.approx(one.duration)
    medians = pipeline.bubble_share(pipeline.simulate(pipeline.make("1f1b", 2, 8), 2, 8,
                                                      [0.008, 0.008], [0.016, 0.016]))
    assert got["predicted"] > medians + 0.01
    with pytest.raises(ValueError, match="one time per micro-batch"):
        pipeline.simulate(pipeline.make("1f1b", 2, 8), 2, 8, [[0.1] * 7, 0.1], 0.2)


def test_by_micro_batches_cuts_each_m_with_what_follows_its_steps():
    order = [1, 2, 4, 1, 2, 4]
    tl = _in_turn("1f1b", 2, order, 0.02, 0.04)
    pipes = lab04.by_micro_batches(tl, order)
    assert sorted(pipes) == [1, 2, 4]
    for m, part in pipes.items():
        assert sum(s.name == "F0" for s in part) == 2 * 2              # 2 steps, 2 stages
        assert {s.name for s in part if s.name[:1] == "F"} == {f"F{i}" for i in range(m)}


def wave(steps=8, layers=4, step_s=0.01, hand_over=0.0, slow=None, replayed=True):
    """A wavefront played by hand: layer k computes step t once layer k - 1 has (plus
    ``hand_over``); ``slow``: {layer: its step time}."""
    spans, done = [], {}
    for k in range(layers):
        free = 0.0
        for t in range(steps):
            start = max(free, done.get((k - 1, t), 0.0) + (hand_over if k else 0.0))
            end = start + (slow or {}).get(k, step_s)
            spans.append(Span(k, "compute", f"t{t}", start, end))
            done[(k, t)] = free = end
    if replayed:
        return ReplayedTimeline(spans, notes={"devices": layers, "link": "a test link"})
    return Timeline(spans)


def test_wavefront_shown_when_the_layers_overlap_in_the_middle():
    n = lab04.wave_numbers(wave())
    assert n["middle_s"] == pytest.approx(0.05)              # from t0 on layer 3 (0.03) to 0.08
    assert n["busy"] == pytest.approx({4: 1.0})
    assert n["source"] == "replayed on 4 dedicated devices, this machine's idle link"
    v = lessons.evaluate("04.wavefront_keeps_layers_busy", n)
    assert v.shown and "3 or more of 4 layers computed 1.00 of the time, all 4 1.00" in v.figures
    assert str(v).startswith("lesson 04.wavefront_keeps_layers_busy: shown (replayed on 4")


def test_wavefront_not_shown_when_two_layers_wait_for_a_slow_one():
    # layer 0 takes twice as long: the others wait half of every step, layers 1 and 3
    # in one half, layer 2 in the other
    n = lab04.wave_numbers(wave(steps=12, slow={0: 0.02}))
    assert n["busy"] == pytest.approx({2: 0.5, 3: 0.5})
    v = lessons.evaluate("04.wavefront_keeps_layers_busy", n)
    assert not v.shown and "3 or more of 4 layers computed 0.50 of the time" in v.figures
    assert "each layer computed 100%, 50%, 50%, 50% of the middle" in v.why
    assert "a time step took 20.0, 10.0, 10.0, 10.0 ms per layer" in v.why


def test_wavefront_not_shown_without_a_middle():
    n = lab04.wave_numbers(wave(steps=2, hand_over=0.005, replayed=False))
    assert n["middle_s"] == 0.0 and "source" not in n
    v = lessons.evaluate("04.wavefront_keeps_layers_busy", n)
    assert not v.shown and "no middle" in v.why


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
        "04.wavefront_keeps_layers_busy", "04.bubble_as_predicted", "04.micro_batches_pay",
        "04.one_f_one_b_holds_less"}


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
