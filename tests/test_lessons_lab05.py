"""Lab 05's lessons: each check says "shown" on numbers that show its claim and "not
shown", with the measured reason, on planted numbers that contradict it (no ranks start)."""
from types import SimpleNamespace

import numpy as np
import pytest

from parlab.course import lab05, lessons
from parlab.trace import Span, Timeline


# ------------------------------------------------------------------ the ring's bytes
def ring(sent, world_size=4, tensor_bytes=32):
    return {"world_size": world_size, "tensor_bytes": tensor_bytes, "sent": dict(enumerate(sent))}


def test_ring_shown_when_every_rank_sends_2_n_minus_1_over_n():
    v = lessons.evaluate("05.ring_sends_2_n_minus_1_over_n", ring([48, 48, 48, 48]))
    assert v.shown and "1.500, 1.500, 1.500, 1.500 of the 32-byte tensor" in v.figures


def test_ring_not_shown_when_a_rank_sends_the_whole_tensor_twice():
    v = lessons.evaluate("05.ring_sends_2_n_minus_1_over_n", ring([48, 64, 48, 48]))
    assert not v.shown and "2.000" in v.figures
    assert v.why == "rank 1 off the formula (traced isend bytes)"


def test_ring_numbers_count_the_traced_isend_bytes_of_each_rank():
    spans = [Span(r, "comm", name, 0.001 * k, 0.001 * k + 0.0005, 8)
             for r in range(4) for k in range(6) for name in ("isend", "recv")]
    demo = SimpleNamespace(results=[{"result": np.zeros(8, np.float32)}] * 4,
                           timeline=Timeline(spans))
    assert lab05.ring_numbers(demo) == ring([48, 48, 48, 48])


# ------------------------------------------------------------------ DDP's overlap
REPLAYED = "replayed on 2 dedicated devices, this machine's idle link"


def overlap(overlap_ms, after_ms, backward_ms=(9.5, 8.4), comm_ms=(1.9, 5.2), buckets=4):
    """Overlap numbers as ``lab05.overlap_numbers`` makes them from two replayed runs."""
    return {"source": REPLAYED, "buckets": buckets,
            "overlap": {"step_s": [x / 1e3 for x in overlap_ms], "backward_s": backward_ms[0] / 1e3,
                        "comm_s": comm_ms[0] / 1e3},
            "after": {"step_s": [x / 1e3 for x in after_ms], "backward_s": backward_ms[1] / 1e3,
                      "comm_s": comm_ms[1] / 1e3}}


def test_overlap_shown_when_a_step_is_quicker_with_overlap():
    v = lessons.evaluate("05.buckets_overlap_backward", overlap([17, 16, 18], [21, 22, 20]))
    assert v.shown and v.source == REPLAYED
    assert v.figures == ("a step took 17.00 ms with overlap, 21.00 ms with the same 4 buckets "
                         "after the backward (19% less)")
    assert str(v).startswith(f"lesson 05.buckets_overlap_backward: shown ({REPLAYED})")


def test_overlap_not_shown_when_the_backward_grows_by_more_than_it_hides():
    v = lessons.evaluate("05.buckets_overlap_backward",
                         overlap([22, 23, 21], [21, 22, 20], backward_ms=(14.0, 8.4)))
    assert not v.shown and v.figures == ("a step took 22.00 ms with overlap, 21.00 ms with the "
                                         "same 4 buckets after the backward (5% more)")
    assert v.why == ("after the backward the buckets took 5.20 ms a step; with overlap rank 0 "
                     "still waited 1.90 ms for them, and its backward took 14.00 ms against "
                     "8.40 ms")


def test_overlap_not_shown_on_equal_steps():
    v = lessons.evaluate("05.buckets_overlap_backward", overlap([20, 20], [20, 20]))
    assert not v.shown


def test_overlap_not_shown_without_warm_steps():
    v = lessons.evaluate("05.buckets_overlap_backward", overlap([], [20]))
    assert not v.shown and v.why


def _ddp_step(t, rank, after: bool):
    """One step on a main lane: forward 1 ms, backward 4, then 3 ms of waiting for the
    buckets (after) or 1 ms (overlap); the bucket's all-reduce on lane 2 + rank."""
    ms = 1e-3
    spans = [Span(rank, "compute", "forward", t, t + 1 * ms),
             Span(rank, "compute", "backward", t + 1 * ms, t + 5 * ms)]
    wait = 3 * ms if after else 1 * ms
    return spans + [Span(rank, "wait", "wait for buckets", t + 5 * ms, t + 5 * ms + wait),
                    Span(rank + 2, "comm", "bucket all_reduce 0", t + 4 * ms, t + 5 * ms + wait,
                         100)]


def test_overlap_numbers_read_each_replay_per_step():
    from parlab.sim.replay import ReplayedTimeline
    notes = {"devices": 2, "link": "alpha 150 us, beta 3 GB/s"}
    tls = {}
    for name in ("overlap", "after"):
        period = 8e-3 if name == "overlap" else 10e-3
        spans = [s for k in range(5) for r in (0, 1)
                 for s in _ddp_step(k * period, r, name == "after")]
        tls[name] = ReplayedTimeline(spans, notes=notes)
    runs = {"overlap": SimpleNamespace(results=[{"buckets_each_step": [1, 2, 2, 2, 2]}])}
    got = lab05.overlap_numbers(runs, replays=tls)
    assert got["source"] == REPLAYED and got["buckets"] == 2
    assert got["overlap"]["step_s"] == pytest.approx([8e-3, 8e-3])     # steps 2 and 3
    assert got["after"]["step_s"] == pytest.approx([10e-3, 10e-3])
    assert got["overlap"]["backward_s"] == pytest.approx(4e-3)
    assert got["overlap"]["comm_s"] == pytest.approx(1e-3)
    assert got["after"]["comm_s"] == pytest.approx(3e-3)


def test_overlap_runs_compare_the_same_buckets(monkeypatch):
    calls = []
    monkeypatch.setattr(lab05, "launch", lambda fn, n, **kw: calls.append(kw["kwargs"]) or kw)
    lab05.overlap_runs(devices=object())
    assert [c["mode"] for c in calls] == ["ddp", "ddp_no_overlap"]
    same = [{k: v for k, v in c.items() if k != "mode"} for c in calls]
    assert same[0] == same[1] and same[0]["bucket_view"]


# ------------------------------------------------------------------ scaling
def scaling(step_ms, compute_ms=(20, 10.5, 5.5), wait_ms=(0.3, 2, 3)):
    return {"source": "replayed on 1, 2, 4 dedicated devices, this machine's idle link",
            "devices": {n: {"step_s": s / 1e3, "compute_s": c / 1e3, "wait_s": w / 1e3}
                        for n, s, c, w in zip((1, 2, 4), step_ms, compute_ms, wait_ms)}}


def test_scaling_shown_when_2_devices_take_a_step_1_25x_faster():
    v = lessons.evaluate("05.data_parallel_scales", scaling([22, 13, 7]))
    assert v.shown and v.figures == ("2 devices 1.69x, 4 devices 3.14x one device "
                                     "(median warm step)")
    assert v.source.startswith("replayed on 1, 2, 4 dedicated devices")


def test_scaling_not_shown_when_2_devices_are_no_faster():
    planted = scaling([22, 21, 18], compute_ms=(20, 14, 9), wait_ms=(0.5, 6, 8))
    v = lessons.evaluate("05.data_parallel_scales", planted)
    assert not v.shown and "2 devices 1.05x" in v.figures
    assert v.why == ("on 2 devices rank 0 computed its half batch in 70% of one device's time "
                     "for the whole batch (ideal 50 %) and waited 6.0 ms a step for the "
                     "gradient buckets")


def test_scaling_not_shown_just_under_the_claim():
    v = lessons.evaluate("05.data_parallel_scales", scaling([22, 17.7, 8]))
    assert not v.shown and "2 devices 1.24x" in v.figures


def test_scaling_numbers_read_the_replays():
    from parlab.sim.replay import ReplayedTimeline
    ms = 1e-3
    tls = {}
    for n, (compute, wait) in {1: (8, 0), 2: (4, 1)}.items():
        spans = [s for k in range(6) for r in range(n) for s in (
            Span(r, "compute", "forward", k * 10 * ms, k * 10 * ms + compute * ms),
            Span(r, "wait", "wait for buckets", k * 10 * ms + compute * ms,
                 k * 10 * ms + (compute + wait) * ms))]
        tls[n] = ReplayedTimeline(spans, notes={"devices": n})
    got = lab05.scaling_numbers({1: None, 2: None}, replays=tls)
    assert got["source"] == "replayed on 1, 2 dedicated devices, this machine's idle link"
    assert got["devices"][2]["step_s"] == pytest.approx(10 * ms)
    assert got["devices"][2]["compute_s"] == pytest.approx(4 * ms)
    assert got["devices"][2]["wait_s"] == pytest.approx(1 * ms)


def test_every_lesson_of_lab05_is_registered_with_its_experiment():
    names = {x.name for x in lessons.of_lab("05")}
    assert names == {"05.ring_sends_2_n_minus_1_over_n", "05.buckets_overlap_backward",
                     "05.data_parallel_scales"}
