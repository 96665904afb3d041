"""Lab 15's lessons: each check says "shown" on numbers that show its claim and "not
shown", with the measured reason, on planted numbers that contradict it (no ranks start)."""
import copy

from parlab.course import lab15, lessons


def learned(disc=0.89, square=0.87):
    return {"iou": {1: disc, 2: square}, "iou_background": {1: 0.0, 2: 0.0},
            "iou_before": {1: 0.0, 2: 0.05}, "epochs": 30, "loss": (1.11, 0.03),
            "pixel_accuracy": 0.98, "background_share": 0.858}


def test_learning_shown_when_both_shapes_pass_half():
    v = lessons.evaluate("15.unet_learns_the_shapes", learned())
    assert v.shown and "disc IoU 0.89 (background everywhere: 0.00" in v.figures
    assert "square IoU 0.87" in v.figures


def test_learning_not_shown_when_a_shape_stays_below_half():
    v = lessons.evaluate("15.unet_learns_the_shapes", learned(square=0.31))
    assert not v.shown and "square below 0.5 after 30 epochs" in v.why
    assert "loss went from 1.110 to 0.030" in v.why


def equal(**off):
    eq = {p: {"loss": 1e-7, "grads": 9e-8, "params": 3e-6, "replicas_identical": True, "steps": 8}
          for p in ("dp", "pp", "dp_pp")}
    for plan, changes in off.items():
        eq[plan].update(changes)
    return {"equivalence": eq}


def test_equivalence_shown_within_the_tolerances():
    v = lessons.evaluate("15.strategies_equal_one_device", equal())
    assert v.shown and "dp 4: loss 1.0e-07, gradients 9.0e-08" in v.figures


def test_equivalence_not_shown_names_the_plan_and_what_is_off():
    v = lessons.evaluate("15.strategies_equal_one_device",
                         equal(dp_pp={"loss": 3e-3}, dp={"replicas_identical": False}))
    assert not v.shown
    assert "dp 2 × pp 2 its loss curve" in v.why and "dp 4 its replicas differ" in v.why


def cut(traced_b=32768.0, e1=131072.0):
    forward = {"e1": e1, "e2": 65536.0, "b": traced_b}
    return {"traced": {"forward": forward, "backward": dict(forward)}, "micro_batch": 4,
            "cut": 3, "formula": {"e1": 131072, "e2": 65536, "b": 32768},
            "cut_bytes": 229376.0, "skips": ["e1", "e2"]}


def test_skips_shown_when_the_traced_bytes_are_the_formula():
    v = lessons.evaluate("15.skips_cross_the_cut", cut())
    assert v.shown and "e1 131,072 B (formula 131,072)" in v.figures
    assert "the skips e1, e2: 86% of 229,376 B" in v.figures and "back the same" in v.figures


def test_skips_not_shown_when_a_tensor_was_not_sent():
    planted = cut()
    del planted["traced"]["forward"]["e2"], planted["traced"]["backward"]["e2"]
    v = lessons.evaluate("15.skips_cross_the_cut", planted)
    assert not v.shown and "forward e2: traced 0, formula 65,536" in v.why


def test_skips_not_shown_when_they_carry_less_than_three_quarters():
    planted = cut()
    planted["formula"] = {"e1": 32768, "e2": 32768, "b": 163840}
    planted["traced"]["forward"] = {"e1": 32768.0, "e2": 32768.0, "b": 163840.0}
    planted["traced"]["backward"] = dict(planted["traced"]["forward"])
    v = lessons.evaluate("15.skips_cross_the_cut", planted)
    assert not v.shown and "the skips carried only 29%" in v.why


def choice(dp_ms=38.8, dp_pp_ms=81.5, off=None, extra=None):
    plans = {
        "dp": {"replayed_s": dp_ms / 1e3, "predicted_s": 0.0222, "core_wait": 0.27,
               "devices": 4, "bytes": {r: {"dp": [117356.0, 117356.0]} for r in range(4)},
               "unexpected_axes": []},
        "pp": {"replayed_s": 0.0526, "predicted_s": 0.0265, "core_wait": 0.08, "devices": 2,
               "bytes": {r: {"pp": [1835008.0, 1835008.0]} for r in range(2)},
               "unexpected_axes": []},
        "dp_pp": {"replayed_s": dp_pp_ms / 1e3, "predicted_s": 0.0296, "core_wait": 0.24,
                  "devices": 4, "unexpected_axes": [],
                  "bytes": {r: {"pp": [917504.0, 917504.0],
                                "dp": [72160.0 if r % 2 == 0 else 45196.0] * 2}
                            for r in range(4)}}}
    if off:
        plan, rank, axis, value = off
        plans[plan]["bytes"][rank][axis][0] = value
    if extra:
        plans[extra[0]]["unexpected_axes"] = [extra[1]]
    return {"plans": plans, "pick": "dp", "cores": 2,
            "replay_source": "replayed on 4 dedicated devices, this machine's idle link"}


def test_axis_bytes_shown_when_every_count_matches():
    v = lessons.evaluate("15.axis_bytes_match_formula", choice())
    assert v.shown and "14 of 14" in v.figures and "dp 2 × pp 2: pp 917,504 B, dp 72,160 B" in v.figures


def test_axis_bytes_not_shown_names_the_rank_and_axis():
    v = lessons.evaluate("15.axis_bytes_match_formula", choice(off=("dp_pp", 3, "pp", 786432.0)))
    assert not v.shown and "13 of 14" in v.figures
    assert "dp 2 × pp 2 rank 3 pp: traced 786,432, formula 917,504" in v.why
    v = lessons.evaluate("15.axis_bytes_match_formula", choice(extra=("dp", "world")))
    assert not v.shown and "dp 4 moved bytes on ['world']" in v.why


def test_choice_shown_when_the_pick_is_quicker_by_the_margin():
    v = lessons.evaluate("15.the_choice_holds_here", choice())
    assert v.shown and "the model's pick dp 4: 38.8 ms replayed (PREDICTED 22.2 ms)" in v.figures
    assert "dp 2 × pp 2: 81.5 ms replayed (PREDICTED 29.6 ms): 2.10x" in v.figures
    assert str(v).startswith("lesson 15.the_choice_holds_here: shown (replayed on 4 dedicated")
    assert "replayed" not in str(lessons.evaluate("15.axis_bytes_match_formula", choice()))


def test_choice_not_shown_when_the_other_plan_comes_close():
    v = lessons.evaluate("15.the_choice_holds_here", choice(dp_ms=70.0, dp_pp_ms=80.0))
    assert not v.shown and "1.14x" in v.figures
    assert "the cost model gave dp 2 × pp 2 1.33x the pick's step (PREDICTED)" in v.why


def test_choice_compares_only_plans_on_as_many_devices():
    planted = choice()
    planted["plans"]["pp"]["replayed_s"] = 0.001          # quick, but on 2 of the 4 devices
    v = lessons.evaluate("15.the_choice_holds_here", planted)
    assert v.shown and "dp 2 × pp 2" in v.figures
    alone = copy.deepcopy(planted)
    del alone["plans"]["dp_pp"]
    v = lessons.evaluate("15.the_choice_holds_here", alone)
    assert not v.shown and "nothing to compare it with" in v.why


def test_the_lab_has_these_lessons():
    assert {x.name for x in lessons.of_lab("15")} == {
        "15.unet_learns_the_shapes", "15.strategies_equal_one_device", "15.skips_cross_the_cut",
        "15.axis_bytes_match_formula", "15.the_choice_holds_here"}
    assert lab15.CHOICE_MARGIN == 1.3 and lab15.MIN_IOU == 0.5
