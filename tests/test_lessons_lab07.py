"""Lab 07's lessons: each check says "shown" on numbers that show its claim and "not
shown", with the measured reason, on planted numbers that contradict it (no ranks start)."""
import pytest

from parlab import metrics
from parlab.course import lab07, lessons

SHAPES = ("dp 1 × tp 4", "dp 4 × tp 1", "dp 2 × tp 2", "dp 1 × pp 4", "dp 4 × pp 1",
          "dp 2 × pp 2")


def numbers(replayed_ms, predicted_ms, off=None, core_wait=None):
    """Survey numbers as ``lab07.survey_numbers`` makes them; ``off``: (shape, axis, bytes)
    planted as the measured count of one axis."""
    shapes = []
    for label, t, p in zip(SHAPES, replayed_ms, predicted_ms):
        model = label.split()[3]
        formula = {"dp": 233768.0, model: 66816.0}
        got = {a: [b, b] for a, b in formula.items()}
        if off and off[0] == label:
            got[off[1]][0] = off[2]
        shapes.append({"label": label, "measured_s": 2 * t / 1e3, "replayed_s": t / 1e3,
                       "predicted_s": p / 1e3,
                       "bytes": got, "core_wait": (core_wait or {}).get(label, 0.4)})
    return {"shapes": shapes, "ranks": 4, "cores": 2,
            "replay_source": "replayed on 4 dedicated devices, this machine's idle link"}


SAME_ORDER = numbers([17, 9, 12, 20, 8.7, 15], [11, 4.8, 5.5, 13, 4.7, 8])


def test_bytes_shown_when_every_axis_matches_its_formula():
    v = lessons.evaluate("07.axis_bytes_match_formula", SAME_ORDER)
    assert v.shown and "12 of 12" in v.figures


def test_bytes_not_shown_when_an_axis_is_off():
    planted = numbers([17, 9, 10, 20, 8.7, 15], [11, 4.8, 5.5, 13, 4.7, 8],
                      off=("dp 2 × pp 2", "pp", 65536.0))
    v = lessons.evaluate("07.axis_bytes_match_formula", planted)
    assert not v.shown and "11 of 12" in v.figures
    assert "dp 2 × pp 2 pp: measured 65,536, formula 66,816" in v.why


def test_data_parallel_shown_when_dp_4_is_quickest_and_full_splits_are_slower():
    v = lessons.evaluate("07.data_parallel_quickest_here", SAME_ORDER)
    assert v.shown and "dp 4 8.8 ms a step (mean of its 2 runs)" in v.figures
    assert "the quickest split shape, dp 2 × tp 2, 12.0 ms: 1.36x" in v.figures
    assert "the quicker fully split one, dp 1 × tp 4: 1.92x" in v.figures
    assert "rho 1.00" in v.figures
    assert str(v).startswith("lesson 07.data_parallel_quickest_here: shown (replayed on 4 ")


def test_the_bytes_lesson_reads_the_measurement_not_the_replay():
    assert "replayed" not in str(lessons.evaluate("07.axis_bytes_match_formula", SAME_ORDER))


def test_data_parallel_shown_when_a_split_shape_is_within_what_two_runs_differ():
    planted = numbers([17, 9, 8.6, 20, 8.7, 15], [11, 4.8, 5.5, 13, 4.7, 8])
    v = lessons.evaluate("07.data_parallel_quickest_here", planted)
    assert v.shown and "dp 2 × tp 2, 8.6 ms: 0.97x" in v.figures


def test_data_parallel_not_shown_when_a_split_shape_is_clearly_quicker():
    planted = numbers([17, 9, 8.0, 20, 8.7, 15], [5, 12, 11, 4, 13, 8])
    v = lessons.evaluate("07.data_parallel_quickest_here", planted)
    assert not v.shown and "dp 2 × tp 2, 8.0 ms: 0.90x" in v.figures
    assert "the cost model gives dp 2 × tp 2 0.88x dp 4's step (PREDICTED)" in v.why
    assert "the two runs of dp 4 differed 1.03x" in v.why


def test_data_parallel_not_shown_when_a_full_split_comes_close():
    planted = numbers([10.5, 9, 12, 20, 8.7, 15], [11, 4.8, 5.5, 13, 4.7, 8])
    v = lessons.evaluate("07.data_parallel_quickest_here", planted)
    assert not v.shown and "the quicker fully split one, dp 1 × tp 4: 1.19x" in v.figures
    assert v.why.count("the cost model gives dp 1 × tp 4 2.32x dp 4's step (PREDICTED)") == 1


def test_data_parallel_prints_a_margin_just_below_its_threshold_as_below():
    planted = numbers([17, 10, 9.4998, 20, 10, 15], [11, 4.8, 5.5, 13, 4.7, 8])
    v = lessons.evaluate("07.data_parallel_quickest_here", planted)
    assert not v.shown and ": 0.94998x" in v.figures


def test_spearman_gives_ties_their_mean_rank():
    assert metrics.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert metrics.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert metrics.ranks_with_ties([5.0, 1.0, 5.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    # a tie on one side: 1 - 6 * sum(d^2) / (n (n^2 - 1)) no longer holds; Pearson on ranks
    assert metrics.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.866, abs=1e-3)


def _held_out(errors):
    return {"errors": {f"run{i}": e for i, e in enumerate(errors)},
            "missing": {"opt-175b": "its FLOP count is not stated"}, "target": 0.15}


def test_held_out_runs_shown_when_four_in_five_land_within_15_percent():
    v = lessons.evaluate("07.model_holds_on_held_out_runs",
                         _held_out([0.01, -0.05, 0.14, -0.12, 0.3]))
    assert v.shown and "4 of 5 expressible held-out runs within 15% (80%)" in v.figures
    assert "median error 12.0%" in v.figures and "furthest: run4 +30%" in v.figures
    assert "1 not expressible (opt-175b)" in v.figures


def test_held_out_runs_not_shown_when_fewer_land_within():
    v = lessons.evaluate("07.model_holds_on_held_out_runs",
                         _held_out([0.01, -0.2, 0.14, -0.3, 0.3]))
    assert not v.shown and "2 of 5" in v.figures and "misses more" in v.why


def test_the_lab_has_these_lessons():
    assert {x.name for x in lessons.of_lab("07")} == {"07.axis_bytes_match_formula",
                                                      "07.data_parallel_quickest_here",
                                                      "07.model_holds_on_held_out_runs"}
