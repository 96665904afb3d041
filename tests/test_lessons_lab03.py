"""Lab 03's lessons: each check says "shown" on numbers that show its claim, and "not
shown", with the cause, on planted numbers that contradict it. No ranks are started."""
import pytest

from parlab.course import lab03, lessons

MS = 1e-3


def scheme(step_ms, bytes_, formula=None, quickest_ms=None, core_wait=0.05, collectives=3,
           comm_ms=0.5, wait_ms=0.1):
    return {"step": step_ms * MS, "compute": 1 * MS, "wait": wait_ms * MS, "comm": comm_ms * MS,
            "core_wait": core_wait * step_ms * MS, "quickest": (quickest_ms or step_ms) * MS,
            "bytes": float(bytes_), "formula": bytes_ if formula is None else formula,
            "collectives": float(collectives), "core_wait_share": core_wait}


def schemes(cr_ms=1.5, nv_ms=3.0, **cr_overrides):
    cr = {"step_ms": cr_ms, "bytes_": 133_632, "collectives": 3}
    cr.update(cr_overrides)
    return {"naive": scheme(nv_ms, 247_040, collectives=7, comm_ms=1.2),
            "column_row": scheme(**cr)}


def test_every_lesson_of_lab03_is_registered_with_its_experiment():
    names = {x.name for x in lessons.of_lab("03")}
    assert names == {"03.column_row_sends_less", "03.column_row_steps_faster",
                     "03.slicing_pays_for_wide_layers"}
    assert all(callable(x.experiment) for x in lessons.of_lab("03"))


def test_column_row_sends_less_shown_when_the_traced_bytes_match_the_formula():
    v = lessons.evaluate("03.column_row_sends_less", schemes())
    assert v.shown and "0.54x" in v.figures and v.why == ""


def test_column_row_sends_less_not_shown_when_a_traced_count_is_off_the_formula():
    m = schemes(formula=133_632 - 2560)         # an exchange the formula does not count
    v = lessons.evaluate("03.column_row_sends_less", m)
    assert not v.shown and "column_row differ from the formula" in v.why


def test_column_row_sends_less_not_shown_when_it_sends_more():
    m = schemes(bytes_=300_000)                 # planted: more than naive, and as the formula says
    v = lessons.evaluate("03.column_row_sends_less", m)
    assert not v.shown and "as many bytes as naive or more" in v.why


def test_column_row_steps_faster_shown_with_half_the_step():
    v = lessons.evaluate("03.column_row_steps_faster", schemes(cr_ms=1.5, nv_ms=3.0))
    assert v.shown and "(0.50x)" in v.figures and "3 and 7 collectives" in v.figures


def test_column_row_steps_faster_not_shown_names_the_core_wait_and_the_quickest_steps():
    m = schemes(cr_ms=3.3, nv_ms=3.0, quickest_ms=1.4, core_wait=0.47)   # swamped by contention
    v = lessons.evaluate("03.column_row_steps_faster", m)
    assert not v.shown and "(1.10x)" in v.figures
    assert "waited for a core 47% (column-then-row)" in v.why
    assert "quickest warm steps: 1.40 and 3.00 ms" in v.why
    assert "not shown on this run" in str(v)


def test_column_row_steps_faster_needs_ten_percent():
    assert not lessons.evaluate("03.column_row_steps_faster", schemes(cr_ms=2.85, nv_ms=3.0)).shown
    assert lessons.evaluate("03.column_row_steps_faster", schemes(cr_ms=2.7, nv_ms=3.0)).shown


def sweep(speed_ups, core_wait=0.2):
    return {(2, w): {"comm_share": 0.3, "core_wait_share": core_wait, "speed_up": s}
            for w, s in zip(lab03.SWEEP_WIDTHS, speed_ups)}


def test_slicing_pays_for_wide_layers_shown_when_the_speed_up_rises_from_below_one():
    v = lessons.evaluate("03.slicing_pays_for_wide_layers", sweep((0.06, 0.1, 0.4, 1.02)))
    assert v.shown and "0.06x at width 32" in v.figures and "1.02x at width 1024" in v.figures


def test_slicing_pays_for_wide_layers_not_shown_when_wide_layers_gain_too_little():
    v = lessons.evaluate("03.slicing_pays_for_wide_layers", sweep((0.5, 0.5, 0.6, 0.7), 0.55))
    assert not v.shown
    assert "width 1024 gained only 1.4x on width 32" in v.why and "core 55%" in v.why


def test_slicing_pays_for_wide_layers_not_shown_when_narrow_layers_already_win():
    v = lessons.evaluate("03.slicing_pays_for_wide_layers", sweep((1.2, 1.5, 2.0, 3.0)))
    assert not v.shown and "beat one device even at width 32" in v.why


def test_slicing_pays_says_whether_the_widest_layers_beat_one_device():
    v = lessons.evaluate("03.slicing_pays_for_wide_layers", sweep((0.07, 0.07, 0.46, 0.82)))
    assert v.shown and "0.82x at width 1024 (11.7 times as high; at width 1024 still no " \
                       "faster than one device)" in v.figures
    v = lessons.evaluate("03.slicing_pays_for_wide_layers", sweep((0.09, 0.66, 1.22, 1.12)))
    assert v.shown and "at width 1024 faster than one device" in v.figures
    assert "loss shrinks as the layers widen" in lessons.of_lab("03")[2].claim


def test_slicing_pays_prints_a_gain_just_below_twice_as_below():
    v = lessons.evaluate("03.slicing_pays_for_wide_layers", sweep((0.5, 0.6, 0.8, 0.998)))
    assert not v.shown and "(1.996 times as high" in v.figures


def test_share_text_says_which_way_the_collectives_share_moved():
    m = {(2, w): {"comm_share": c, "core_wait_share": 0.4, "speed_up": 1.0}
         for w, c in zip(lab03.SWEEP_WIDTHS, (0.34, 0.07, 0.10, 0.35))}
    assert "34% of the sliced step at width 32 and 35% at width 1024: its share stayed " \
           "within 2 points" in lab03.share_text(m)
    m[2, 1024]["comm_share"] = 0.13
    assert "its share fell as the layers widened" in lab03.share_text(m)


def test_collective_seconds_counts_the_waits_a_first_collective_hides_in():
    """A first step whose all-reduce is all waiting and core wait (0 ms of transfer, the
    review's "up to 0.00 ms") still counts in full."""
    from types import SimpleNamespace

    from parlab.trace import COMM, COMPUTE, CORE_WAIT, WAIT, Span, Timeline
    spans = []
    for k, (wait, transfer, core) in enumerate(((0.200, 0.0, 0.010), (0.0, 0.0004, 0.0),
                                                (0.0, 0.0004, 0.0001))):
        t = k * 1.0
        spans += [Span(0, COMPUTE, "forward", t, t + 0.001),
                  Span(0, WAIT, "all_reduce", t + 0.001, t + 0.001 + wait),
                  Span(0, COMM, "all_reduce", t + 0.001 + wait, t + 0.001 + wait + transfer),
                  Span(0, CORE_WAIT, "all_reduce (core wait)", t + 0.001 + wait + transfer,
                       t + 0.001 + wait + transfer + core),
                  Span(0, CORE_WAIT, "forward (core wait)", t + 0.5, t + 0.6)]
    run = SimpleNamespace(timeline=Timeline(spans))
    got = lab03.collective_seconds(run, 3)
    assert got == pytest.approx([0.210, 0.0004, 0.0005])
    assert "210.00 ms in the first step, 0.45 ms in a warm step (median), 466.7x" in \
        lab03.start_up_text(run, 3, warm=1)
