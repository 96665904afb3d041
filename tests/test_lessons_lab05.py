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
def overlap(hits, late=None, lead_ms=0.8, wait_ms=0.1, core_wait=0.05):
    """Overlap numbers as ``lab05.overlap_numbers`` makes them: ``hits[r]`` says, step by
    step, whether rank r had a bucket transferring during its backward; ``late[k]``:
    the rank that handed its first bucket over last in step k (default: rank 1)."""
    late = late or [1] * len(hits[0])
    steps = [{"rank": r, "step": k, "backward_s": 2e-3, "overlap_s": 1e-3 if hit else 0.0,
              "handed_at": k + (1e-4 if late[k] == r else 0.0),
              "lead_s": lead_ms / 1e3, "bucket_wait_s": wait_ms / 1e3}
             for r, row in enumerate(hits) for k, hit in enumerate(row)]
    return {"steps": steps, "ranks": len(hits), "core_wait": core_wait}


def test_overlap_shown_when_the_later_rank_overlaps_in_half_the_steps():
    # rank 0 ran ahead in every step (its bucket waited for rank 1): no overlap there,
    # which the claim allows; rank 1, the later one, overlapped in 4 of 8
    v = lessons.evaluate("05.buckets_overlap_backward",
                         overlap([[False] * 8, [True] * 4 + [False] * 4]))
    assert v.shown and "overlap in 4 of 8 warm steps on the rank that handed" in v.figures
    assert "0 of 8 on rank 0, 4 of 8 on rank 1" in v.figures


def test_overlap_reads_the_later_rank_of_each_step():
    # every rank overlapped in half the steps, but never when it was the later one
    v = lessons.evaluate("05.buckets_overlap_backward",
                         overlap([[True, False] * 4, [False, True] * 4], late=[1, 0] * 4))
    assert not v.shown and "overlap in 0 of 8 warm steps" in v.figures


def test_overlap_not_shown_when_the_buckets_travel_after_the_backward():
    v = lessons.evaluate("05.buckets_overlap_backward",
                         overlap([[True] * 8, [False] * 6 + [True] * 2], lead_ms=-0.3,
                                 wait_ms=4.0, core_wait=0.3))
    assert not v.shown and "overlap in 2 of 8 warm steps" in v.figures
    assert "only 0.30 ms after its backward ended" in v.why
    assert "waited a median 4.00 ms" in v.why and "30% of their time waiting for a core" in v.why


def test_overlap_not_shown_without_warm_steps():
    v = lessons.evaluate("05.buckets_overlap_backward", {"steps": [], "ranks": 2, "core_wait": 0})
    assert not v.shown and v.why


def test_overlap_numbers_measure_transfer_inside_the_backward():
    ms = 1e-3
    spans = []
    for r in (0, 1):
        for k in range(3):                       # 3 steps of 10 ms; the first is skipped
            t = 10 * ms * k
            spans += [Span(r, "compute", "forward", t, t + 1 * ms),
                      Span(r, "compute", "backward", t + 1 * ms, t + 5 * ms),
                      Span(r, "wait", "wait for buckets", t + 5 * ms, t + 8 * ms),
                      # lane 2 + r: waits 1 ms, then transfers from 3 ms: 2 ms inside backward
                      Span(2 + r, "wait", "bucket all_reduce", t + 2 * ms, t + 3 * ms),
                      Span(2 + r, "comm", "bucket all_reduce", t + 3 * ms, t + 7 * ms, 100),
                      Span(2 + r, "comm", "bucket all_reduce", t + 4 * ms, t + 8 * ms, 100)]
    run = SimpleNamespace(results=[{}, {}], timeline=Timeline(spans))
    got = lab05.overlap_numbers(run, skip=1)
    assert got["ranks"] == 2 and len(got["steps"]) == 4
    for row in got["steps"]:
        assert row["backward_s"] == pytest.approx(4 * ms)
        assert row["overlap_s"] == pytest.approx(2 * ms)      # the union, not 2 + 1 ms
        assert row["lead_s"] == pytest.approx(3 * ms)
        assert row["handed_at"] == pytest.approx(row["step"] * 10 * ms + 2 * ms)
        assert row["bucket_wait_s"] == pytest.approx(1 * ms)
    assert sorted(row["step"] for row in got["steps"]) == [1, 1, 2, 2]


# ------------------------------------------------------------------ scaling
def scaling(step_ms, compute_ms=(20, 10, 6), wait_ms=(0.5, 2, 6), core_wait=(0, 0.02, 0.3),
            cores=2, load=2.1):
    return {"devices": {n: {"step_s": s / 1e3, "compute_s": c / 1e3, "wait_s": w / 1e3,
                            "core_wait": cw}
                        for n, s, c, w, cw in zip((1, 2, 4), step_ms, compute_ms, wait_ms,
                                                  core_wait)},
            "cores": cores, "load": load}


def test_scaling_shown_when_2_devices_take_a_step_1_25x_faster():
    v = lessons.evaluate("05.data_parallel_scales", scaling([22, 13, 15]))
    assert v.shown and v.figures == ("2 devices 1.69x, 4 devices 1.47x one device "
                                     "(median warm step)")


def test_scaling_not_shown_when_2_devices_are_no_faster():
    planted = scaling([22, 21, 18], compute_ms=(20, 14, 9), wait_ms=(0.5, 6, 8),
                      core_wait=(0.01, 0.25, 0.4), load=4.3)
    v = lessons.evaluate("05.data_parallel_scales", planted)
    assert not v.shown and "2 devices 1.05x" in v.figures
    assert "half batch in 70% of one device's time" in v.why
    assert "waited 6.0 ms a step" in v.why and "25% of their time waiting for a core" in v.why
    assert "load average was 4.3 on 2 cores" in v.why


def test_scaling_not_shown_just_under_the_claim():
    v = lessons.evaluate("05.data_parallel_scales", scaling([22, 17.7, 15]))
    assert not v.shown and "2 devices 1.24x" in v.figures


def test_scaling_not_shown_on_one_core_says_so():
    v = lessons.evaluate("05.data_parallel_scales", scaling([22, 21, 30], cores=1))
    assert not v.shown and v.why.startswith("this machine has 1 core, not one per device")


def test_every_lesson_of_lab05_is_registered_with_its_experiment():
    names = {x.name for x in lessons.of_lab("05")}
    assert names == {"05.ring_sends_2_n_minus_1_over_n", "05.buckets_overlap_backward",
                     "05.data_parallel_scales"}
