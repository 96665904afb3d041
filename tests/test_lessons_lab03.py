"""Lab 03's lessons: each check says "shown" on numbers that show its claim, and "not
shown", with the cause, on planted numbers that contradict it. No ranks are started."""
from parlab.course import lab03, lessons

MS = 1e-3


SOURCE = "replayed on 2 dedicated devices, this machine's idle link"


def sent(bytes_, formula=None, collectives=3):
    return {"bytes": float(bytes_), "formula": bytes_ if formula is None else formula,
            "collectives": float(collectives)}


def sends(**cr_overrides):
    cr = {"bytes_": 133_632, "collectives": 3}
    cr.update(cr_overrides)
    return {"naive": sent(247_040, collectives=7), "column_row": sent(**cr)}


def timed(step_ms, compute_ms=1.0, comm_ms=0.5, wait_ms=0.1):
    return {"step": step_ms * MS, "compute": compute_ms * MS, "comm": comm_ms * MS,
            "wait": wait_ms * MS}


def steps(cr_ms=1.5, nv_ms=3.0, **cr):
    return {"naive": timed(nv_ms, compute_ms=1.2, comm_ms=1.2), "column_row": timed(cr_ms, **cr),
            "source": SOURCE}


def test_every_lesson_of_lab03_is_registered_with_its_experiment():
    names = {x.name for x in lessons.of_lab("03")}
    assert names == {"03.column_row_sends_less", "03.column_row_steps_faster",
                     "03.slicing_pays_for_wide_layers"}
    assert all(callable(x.experiment) for x in lessons.of_lab("03"))


def test_column_row_sends_less_shown_when_the_traced_bytes_match_the_formula():
    v = lessons.evaluate("03.column_row_sends_less", sends())
    assert v.shown and "0.54x" in v.figures and v.why == ""


def test_column_row_sends_less_not_shown_when_a_traced_count_is_off_the_formula():
    m = sends(formula=133_632 - 2560)         # an exchange the formula does not count
    v = lessons.evaluate("03.column_row_sends_less", m)
    assert not v.shown and "column_row differ from the formula" in v.why


def test_column_row_sends_less_not_shown_when_it_sends_more():
    m = sends(bytes_=300_000)                 # planted: more than naive, and as the formula says
    v = lessons.evaluate("03.column_row_sends_less", m)
    assert not v.shown and "as many bytes as naive or more" in v.why


def test_column_row_sends_less_reads_the_measurement():
    v = lessons.evaluate("03.column_row_sends_less", sends())
    assert v.source == "" and "replayed" not in str(v)


def test_column_row_steps_faster_shown_with_half_the_step_and_says_it_read_the_replay():
    v = lessons.evaluate("03.column_row_steps_faster", steps(cr_ms=1.5, nv_ms=3.0))
    assert v.shown and "(0.50x)" in v.figures and "0.60 and 1.30 ms" in v.figures
    assert str(v).startswith("lesson 03.column_row_steps_faster: shown (replayed on 2 dedicated "
                             "devices, this machine's idle link)")


def test_column_row_steps_faster_not_shown_names_what_took_longer():
    v = lessons.evaluate("03.column_row_steps_faster", steps(cr_ms=3.3, nv_ms=3.0, comm_ms=2.0))
    assert not v.shown and "(1.10x)" in v.figures
    assert v.why == "column-then-row's step was more than 0.9x naive's: its collectives took " \
                    "as long as naive's"
    v = lessons.evaluate("03.column_row_steps_faster", steps(cr_ms=3.3, nv_ms=3.0, compute_ms=3.0))
    assert not v.shown and v.why.endswith(": it computed as long as naive")
    v = lessons.evaluate("03.column_row_steps_faster", steps(cr_ms=2.85, nv_ms=3.0))
    assert not v.shown and v.why == "column-then-row's step was more than 0.9x naive's"
    assert "not shown on this run (replayed on 2" in str(v)


def test_column_row_steps_faster_needs_ten_percent():
    assert not lessons.evaluate("03.column_row_steps_faster", steps(cr_ms=2.85, nv_ms=3.0)).shown
    assert lessons.evaluate("03.column_row_steps_faster", steps(cr_ms=2.7, nv_ms=3.0)).shown


def sweep(speed_ups, comm_share=0.3):
    out = {(2, w): {"comm_share": comm_share, "speed_up": u, "dense_step": 10 * MS * u,
                    "sliced_step": 10 * MS} for w, u in zip(lab03.SWEEP_WIDTHS, speed_ups)}
    return {**out, "source": SOURCE}


def test_slicing_pays_for_wide_layers_shown_when_narrow_lose_and_wide_win():
    v = lessons.evaluate("03.slicing_pays_for_wide_layers", sweep((0.18, 0.24, 0.7, 1.4)))
    assert v.shown and "0.18x at width 32" in v.figures and "1.40x at width 1024" in v.figures
    assert "sliced step 10.00 ms, one device 14.00 ms" in v.figures
    assert "(replayed on 2 dedicated devices" in str(v)


def test_slicing_pays_for_wide_layers_not_shown_when_wide_layers_still_lose():
    v = lessons.evaluate("03.slicing_pays_for_wide_layers", sweep((0.07, 0.07, 0.46, 0.82), 0.55))
    assert not v.shown
    assert "lost to one device even at width 1024, where collectives took 55%" in v.why


def test_slicing_pays_for_wide_layers_not_shown_when_narrow_layers_already_win():
    v = lessons.evaluate("03.slicing_pays_for_wide_layers", sweep((1.2, 1.5, 2.0, 3.0)))
    assert not v.shown and "beat one device even at width 32" in v.why


def test_slicing_pays_prints_a_speed_up_just_at_one_on_its_side():
    v = lessons.evaluate("03.slicing_pays_for_wide_layers", sweep((0.5, 0.6, 0.8, 0.998)))
    assert not v.shown and "1.00x at width 1024" in v.figures     # 1.00 is not above 1 either
    v = lessons.evaluate("03.slicing_pays_for_wide_layers", sweep((0.5, 0.6, 0.8, 1.004)))
    assert v.shown and "1.004x at width 1024" in v.figures


def test_share_text_says_which_way_the_collectives_share_moved():
    m = {(2, w): {"comm_share": c, "speed_up": 1.0}
         for w, c in zip(lab03.SWEEP_WIDTHS, (0.34, 0.07, 0.10, 0.35))}
    assert "34% of the sliced step at width 32 and 35% at width 1024: its share stayed " \
           "within 2 points" in lab03.share_text(m)
    m[2, 1024]["comm_share"] = 0.13
    assert "its share fell as the layers widened" in lab03.share_text(m)
