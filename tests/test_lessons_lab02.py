"""Lab 02's lessons: each check says "shown" on numbers that show its claim and "not shown",
with the measured reason, on planted numbers that contradict it; and the numbers functions
read what they should from timelines built by hand (no ranks start)."""
from types import SimpleNamespace

import pytest

from parlab.course import lab02, lessons
from parlab.trace import Span, Timeline

MS = 1e-3


def _split_steps(steps=5, overlap=0.0, core_wait=0.0):
    """A 2-stage split by hand: rank 0 forward, rank 1 forward + backward, rank 0 backward;
    rank 1's update beside rank 0's backward. ``overlap``: rank 1's forward starts that
    much before rank 0's forward ends (planted). ``core_wait``: of rank 0's backward."""
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
    return SimpleNamespace(timeline=Timeline(spans))


def test_one_at_a_time_numbers_set_the_updates_aside():
    m = lab02.one_at_a_time_numbers(_split_steps())
    assert m["alone_outside_updates"] == pytest.approx(1.0)
    # per step 4.5 ms of compute time, 0.5 ms of it two ranks at once (rank 1's update)
    assert m["alone"] == pytest.approx(4.0 / 4.5)
    assert m["overlap"] == ""


def test_one_device_at_a_time_shown_when_only_updates_overlap():
    v = lessons.evaluate("02.one_device_at_a_time", lab02.one_at_a_time_numbers(_split_steps()))
    assert v.shown and "100.0% of the compute time outside the updates" in v.figures
    assert "88.9% with the updates counted" in v.figures


def test_one_device_at_a_time_not_shown_names_the_spans_that_overlapped():
    m = lab02.one_at_a_time_numbers(_split_steps(overlap=0.5 * MS))
    v = lessons.evaluate("02.one_device_at_a_time", m)
    assert not v.shown
    assert "two devices computed at once for" in v.why
    assert "forward on rank 0 beside forward on rank 1 (2.5 ms in all)" in v.why


def test_compute_per_step_is_each_ranks_median_without_its_core_wait():
    tl = _split_steps(steps=6, core_wait=0.4 * MS).timeline
    assert lab02.compute_per_step(tl) == pytest.approx([2.5 * MS - 0.4 * MS, 2.5 * MS])
    assert lab02.per_step(tl, "core_wait") == pytest.approx([0.4 * MS, 0.0])


def _steps(split_ms, one_ms, cw_one=0.0, cw_split=0.03):
    return {"split_step": split_ms * MS, "one_step": one_ms * MS, "core_wait_one": cw_one,
            "core_wait_split": cw_split, "update": 0.2 * MS}


def test_split_not_faster_shown_when_the_split_step_is_longer():
    v = lessons.evaluate("02.split_not_faster", _steps(1.46, 0.97))
    assert v.shown and "split step 1.46 ms = 1.51x one device's 0.97 ms" in v.figures


def test_split_not_faster_not_shown_says_the_core_waits_and_the_overlapped_update():
    v = lessons.evaluate("02.split_not_faster", _steps(0.9, 1.2, cw_one=0.25))
    assert not v.shown and "0.75x" in v.figures
    assert "the single device spent 25% of its time waiting for a core" in v.why
    assert "update (0.20 ms)" in v.why


def _balance(measured_params, measured_time, times=(1.2, 1.2, 1.2)):
    return {"predicted": {lab02.BY_PARAMS: 1.85, lab02.BY_TIME: 1.24},
            "measured": {lab02.BY_PARAMS: measured_params, lab02.BY_TIME: measured_time},
            "core_wait": {lab02.BY_PARAMS: 0.05, lab02.BY_TIME: 0.31},
            "identical": {"layer": "Conv2d", "times": [t * MS for t in times]}}


def test_split_by_time_balances_shown_when_the_measured_ratio_falls_as_predicted():
    v = lessons.evaluate("02.split_by_time_balances", _balance(1.76, 1.29))
    assert v.shown
    assert v.figures == ("busiest/mean compute 1.76 by parameters, 1.29 by measured time "
                         "(PREDICTED 1.85, 1.24)")


def test_split_by_time_balances_not_shown_names_contention_and_disagreeing_layer_times():
    v = lessons.evaluate("02.split_by_time_balances", _balance(1.70, 1.50, times=(6.6, 6.6, 2.4)))
    assert not v.shown
    assert "it fell by 0.20 where the layer times predict 0.61" in v.why
    assert "31% (split by time)" in v.why
    assert "3 identical Conv2d layers were timed 6.60, 6.60, 2.40 ms" in v.why


def test_balance_numbers_read_the_runs_and_the_identical_layers():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4),
                                torch.nn.ReLU())
    times = [1.0, 0.1, 3.0, 0.1]
    run = SimpleNamespace(timeline=_split_steps().timeline)
    m = lab02.balance_numbers(times, {lab02.BY_PARAMS: ([1], [3.0, 1.0], run),
                                      lab02.BY_TIME: ([2], [2.0, 2.0], run)}, model)
    assert m["predicted"] == {lab02.BY_PARAMS: pytest.approx(3.2 / 2.1),
                              lab02.BY_TIME: pytest.approx(3.1 / 2.1)}
    assert m["measured"] == {lab02.BY_PARAMS: 1.5, lab02.BY_TIME: 1.0}
    assert m["identical"] == {"layer": "Linear", "times": [1.0, 3.0]}
