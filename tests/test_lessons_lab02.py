"""Lab 02's lessons: each check says "shown" on numbers that show its claim and "not shown",
with the measured reason, on planted numbers that contradict it; and the numbers functions
read what they should from timelines built by hand (no ranks start)."""
from dataclasses import replace
from types import SimpleNamespace

import pytest

from parlab.course import lab02, lessons
from parlab.sim import Link
from parlab.trace import Span, Timeline

MS = 1e-3


def _split_steps(steps=5, overlap=0.0, core_wait=0.0, clock=None):
    """A 2-stage split by hand: rank 0 forward, rank 1 forward + backward, rank 0 backward;
    rank 1's update beside rank 0's backward. ``overlap``: rank 1's forward starts that
    much before rank 0's forward ends (planted). ``core_wait``: of rank 0's backward.
    ``clock``: each span's thread counters, as a recorded run has them (for a replay)."""
    spans, t = [], 0.0
    for _ in range(steps):
        spans += [Span(0, "compute", "forward", t, t + 1 * MS),
                  Span(1, "compute", "forward", t + 1 * MS - overlap, t + 2 * MS),
                  Span(1, "compute", "backward", t + 2 * MS, t + 3 * MS),
                  Span(1, "compute", "update", t + 3 * MS, t + 3.5 * MS),
                  Span(0, "compute", "backward", t + 3 * MS, t + 4 * MS,
                       core_wait_s=core_wait),
                  Span(0, "compute", "update", t + 4 * MS, t + 4.5 * MS)]
        t += 5 * MS
    if clock is not None:
        spans = [replace(s, clock=clock) for s in spans]
    return SimpleNamespace(timeline=Timeline(spans))


def test_one_at_a_time_numbers_set_the_updates_aside():
    m = lab02.one_at_a_time_numbers(_split_steps().timeline)
    assert m["alone_outside_updates"] == pytest.approx(1.0)
    # per step 4.5 ms of compute time, 0.5 ms of it two ranks at once (rank 1's update)
    assert m["alone"] == pytest.approx(4.0 / 4.5)
    assert m["overlap"] == ""


def test_one_device_at_a_time_shown_when_only_updates_overlap():
    v = lessons.evaluate("02.one_device_at_a_time", lab02.one_at_a_time_numbers(_split_steps().timeline))
    assert v.shown and "100.0% of the compute time outside the updates" in v.figures
    assert "88.9% with the updates counted" in v.figures


def test_one_device_at_a_time_not_shown_names_the_spans_that_overlapped():
    m = lab02.one_at_a_time_numbers(_split_steps(overlap=0.5 * MS).timeline)
    v = lessons.evaluate("02.one_device_at_a_time", m)
    assert not v.shown
    assert "two devices computed at once for" in v.why
    assert "forward on rank 0 beside forward on rank 1 (2.5 ms in all)" in v.why


def test_compute_per_step_is_each_ranks_median_without_its_core_wait():
    tl = _split_steps(steps=6, core_wait=0.4 * MS).timeline
    assert lab02.compute_per_step(tl) == pytest.approx([2.5 * MS - 0.4 * MS, 2.5 * MS])
    assert lab02.per_step(tl, "core_wait") == pytest.approx([0.4 * MS, 0.0])


def _steps(split_ms, one_ms):
    return {"split_step": split_ms * MS, "one_step": one_ms * MS, "update": 0.2 * MS}


def test_split_not_faster_shown_when_the_split_step_is_longer():
    v = lessons.evaluate("02.split_not_faster", _steps(1.46, 0.97))
    assert v.shown and "split step 1.46 ms = 1.51x one device's 0.97 ms" in v.figures


def test_split_not_faster_allows_the_overlapped_update_and_no_more():
    assert lessons.evaluate("02.split_not_faster", _steps(0.81, 1.0)).shown   # 1.0 - 0.2 update
    v = lessons.evaluate("02.split_not_faster", _steps(0.75, 1.0))
    assert not v.shown and "0.75x" in v.figures
    assert "less the last stage's update (0.20 ms, the overlapped work) is 0.80 ms" in v.why


def test_the_lessons_read_a_replay_and_say_so():
    tl = _split_steps(steps=6, clock=(0.0, 0.0, 0.0, 0.0)).timeline
    rp = lab02.replayed(SimpleNamespace(timeline=tl), Link(10e-6, 1e9))
    m = lab02.step_numbers(rp, rp)
    assert m["source"].startswith("replayed on 2 dedicated devices")
    assert m["update"] == pytest.approx(0.5 * MS, rel=0.01)
    v = lessons.evaluate("02.split_not_faster", m)
    assert v.shown and "shown (replayed on 2 dedicated devices" in str(v)


def _balance(measured_params, measured_time, times=(1.2, 1.2, 1.2)):
    return {"predicted": {lab02.BY_PARAMS: 1.85, lab02.BY_TIME: 1.24},
            "measured": {lab02.BY_PARAMS: measured_params, lab02.BY_TIME: measured_time},
            "identical": {"layer": "Conv2d", "times": [t * MS for t in times]}}


def test_split_by_time_balances_shown_when_the_measured_ratio_falls_as_predicted():
    v = lessons.evaluate("02.split_by_time_balances", _balance(1.76, 1.29))
    assert v.shown
    assert v.figures == ("busiest/mean compute 1.76 by parameters, 1.29 by measured time "
                         "(PREDICTED 1.85, 1.24)")


def test_split_by_time_balances_not_shown_names_disagreeing_layer_times():
    v = lessons.evaluate("02.split_by_time_balances", _balance(1.70, 1.50, times=(6.6, 6.6, 2.4)))
    assert not v.shown
    assert "it fell by 0.20 where the layer times predict 0.61" in v.why
    assert "3 identical Conv2d layers were timed 6.60, 6.60, 2.40 ms" in v.why


def test_balance_numbers_read_the_runs_and_the_identical_layers():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4),
                                torch.nn.ReLU())
    times = [1.0, 0.1, 3.0, 0.1]
    run = SimpleNamespace(timeline=_split_steps().timeline)
    m = lab02.balance_numbers(times, {lab02.BY_PARAMS: ([1], [3.0, 1.0], run, run.timeline),
                                      lab02.BY_TIME: ([2], [2.0, 2.0], run, run.timeline)}, model)
    assert m["predicted"] == {lab02.BY_PARAMS: pytest.approx(3.2 / 2.1),
                              lab02.BY_TIME: pytest.approx(3.1 / 2.1)}
    assert m["measured"] == {lab02.BY_PARAMS: 1.5, lab02.BY_TIME: 1.0}
    assert m["identical"] == {"layer": "Linear", "times": [1.0, 3.0]}
