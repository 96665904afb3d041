"""Lab 00's lessons: each check shows its lesson on numbers that show it, and says why not
on planted numbers that contradict it. No ranks are launched."""
from types import SimpleNamespace

from parlab.course import lab00, lessons
from parlab.spans import COMPUTE, WAIT, Span
from parlab.timeline import Timeline

MS = 1e-3


def pace(compute_ms, wait_ms, core_wait=0.3):
    return {"compute": [c * MS for c in compute_ms], "wait": [w * MS for w in wait_ms],
            "core_wait": core_wait}


def test_slowest_sets_the_pace_shown_when_the_fast_ranks_wait_for_the_slowest():
    v = lessons.evaluate("00.slowest_sets_the_pace", pace([15, 27, 42, 45], [35, 21, 9, 2]))
    assert v.shown, v
    assert "rank 0 waits 35.0 ms" in v.figures and "rank 3 2.0 ms" in v.figures


def test_slowest_sets_the_pace_not_shown_when_the_waits_do_not_follow_the_work():
    v = lessons.evaluate("00.slowest_sets_the_pace", pace([15, 27, 42, 45], [8, 6, 5, 4], 0.45))
    assert not v.shown
    assert "45% of their time waiting for a core" in v.why


def test_slowest_sets_the_pace_not_shown_when_the_last_rank_computed_least():
    v = lessons.evaluate("00.slowest_sets_the_pace", pace([30, 27, 22, 20], [0, 3, 8, 10], 0.6))
    assert not v.shown
    assert "rank 3 computed no longer than rank 0" in v.why and "60%" in v.why


def test_pace_numbers_reads_compute_and_wait_per_step_without_the_barrier():
    spans = [Span(0, WAIT, "barrier", 0.0, 0.5),
             Span(0, COMPUTE, "compute", 1.0, 2.0), Span(0, WAIT, "all_reduce", 2.0, 5.0),
             Span(1, COMPUTE, "compute", 1.0, 5.0), Span(1, WAIT, "all_reduce", 5.0, 5.0)]
    m = lab00.pace_numbers(SimpleNamespace(timeline=Timeline(spans)), steps=1)
    assert m["compute"] == [1.0, 4.0] and m["wait"] == [3.0, 0.0]


def sweep(seconds, sizes=None):
    sizes = sizes or [4 ** k for k in range(1, 13)]          # 4 B ... 16 MB
    return {"op": "send_recv", "world_size": 2, "bytes": sizes, "seconds": seconds,
            "core_wait": 0.2}


def alpha_beta(alpha=100e-6, beta=3e9):
    return [alpha + b / beta for b in [4 ** k for k in range(1, 13)]]


def test_latency_then_bandwidth_shown_on_an_alpha_beta_link():
    v = lessons.evaluate("00.latency_then_bandwidth", sweep(alpha_beta()))
    assert v.shown, v
    assert "16 MB take" in v.figures and "1 MB" in v.figures


def test_latency_then_bandwidth_not_shown_when_small_messages_grow_with_size():
    times = alpha_beta()
    times[1:5] = [5 * t for t in times[1:5]]                 # 16 B to 1 KB: 5x the 4 B time
    v = lessons.evaluate("00.latency_then_bandwidth", sweep(times))
    assert not v.shown
    assert "grew with size" in v.why and "20%" in v.why


def test_latency_then_bandwidth_not_shown_when_the_largest_is_still_latency_bound():
    v = lessons.evaluate("00.latency_then_bandwidth", sweep(alpha_beta(alpha=5e-3)))
    assert not v.shown
    assert "half-speed size" in v.why and "latency still counts" in v.why


def test_link_numbers_picks_one_curve_in_size_order():
    records = [{"op": "send_recv", "world_size": 2, "bytes": 16, "seconds": 2.0},
               {"op": "all_reduce", "world_size": 2, "bytes": 4, "seconds": 9.0},
               {"op": "send_recv", "world_size": 2, "bytes": 4, "seconds": 1.0}]
    m = lab00.link_numbers(records)
    assert m["bytes"] == [4, 16] and m["seconds"] == [1.0, 2.0]


def test_lab00_has_its_two_lessons():
    assert {x.name for x in lessons.of_lab("00")} == {"00.slowest_sets_the_pace",
                                                      "00.latency_then_bandwidth"}
