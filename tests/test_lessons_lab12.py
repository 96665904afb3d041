"""Lab 12's lessons and exercises: each check says "shown" on numbers that show its claim
and "not shown", with the reason, on planted numbers that contradict it; the functions
that read a run are checked on a real run of 4 ranks (a small model); the exercises'
checks say what is wrong with a wrong answer."""
from dataclasses import replace

import pytest

from parlab.course import lab12, lessons
from parlab.course.lab12_exercises import split_backward, zb_h1
from parlab.split import SplitConfig

SMALL = SplitConfig(sizes=(64,) + (64,) * 9 + (10,), batch_size=64, steps=3, lr=0.05)


@pytest.fixture(scope="module")
def small():
    run = lab12.run(cfg=SMALL)
    return run, lab12.numbers(run, lab12.reference(SMALL), cfg=SMALL)


def test_a_real_run_of_every_schedule_equals_one_device_and_reads_back(small):
    run, m = small
    assert lessons.evaluate("12.schedules_equal_one_device", m).shown
    rows = {r["schedule"]: r for r in m["bubbles"]}
    assert set(rows) == set(lab12.SCHEDULES)
    for name, r in rows.items():
        assert 0 < r["replayed"] < 1 and 0 < r["predicted"] < 1 and 0 < r["measured"] < 1
        assert r["sent"] == r["hand_overs"] > 0, name
        assert r["step_s"] > 0 and r["predicted_step_s"] > 0
    assert rows["zb-h1"]["peak"] == rows["1f1b"]["peak"] == 4
    assert rows["interleaved"]["peak"] == 5.5 and rows["dualpipev"]["peak"] == 4.5
    assert lab12.plot_replayed(run, cfg=SMALL) is not None


def test_on_paper_each_schedule_has_its_formula_and_the_figure_draws():
    rows = {r["schedule"]: r for r in lab12.on_paper()}
    assert rows["1f1b"]["bubble"] == pytest.approx(3 / 11)
    assert rows["interleaved"]["bubble"] == pytest.approx(3 / 19)
    assert rows["zb-h1"]["bubble"] == pytest.approx(1 / 9)
    assert rows["dualpipev"]["bubble"] < rows["zb-h1"]["bubble"]
    assert [rows[n]["hand_overs"] for n in lab12.SCHEDULES] == [48, 112, 48, 96]
    assert lab12.plot_schedules(list(rows.values())) is not None


def _numbers(**over):
    rows = [{"schedule": "1f1b", "replayed": 0.31, "predicted": 0.30, "peak": 4.0, "sent": 48,
             "step_s": 0.147, "predicted_step_s": 0.144},
            {"schedule": "interleaved", "replayed": 0.23, "predicted": 0.19, "peak": 5.5,
             "sent": 112, "step_s": 0.135, "predicted_step_s": 0.125},
            {"schedule": "zb-h1", "replayed": 0.19, "predicted": 0.16, "peak": 4.0, "sent": 48,
             "step_s": 0.114, "predicted_step_s": 0.109},
            {"schedule": "dualpipev", "replayed": 0.15, "predicted": 0.11, "peak": 4.5,
             "sent": 96, "step_s": 0.118, "predicted_step_s": 0.113}]
    for name, changes in over.items():
        next(r for r in rows if r["schedule"] == name.replace("_", "-")).update(changes)
    eq = [{"schedule": n, "loss": 1e-7, "gradients": 1e-9, "weights": 1e-9,
           "library": None if n == "1f1b" else 1e-9} for n in lab12.SCHEDULES]
    return {"bubbles": rows, "equivalence": eq}


BUBBLE_LESSONS = ("12.interleaving_cuts_the_bubble", "12.zero_bubble_at_the_same_memory",
                  "12.dualpipev_idles_least", "12.prediction_matches_the_replay",
                  "12.schedules_equal_one_device")


def test_the_checks_show_their_claims_on_numbers_that_show_them():
    for name in BUBBLE_LESSONS:
        assert lessons.evaluate(name, _numbers()).shown, name
    assert {x.name for x in lessons.of_lab("12")} == set(BUBBLE_LESSONS)


def test_the_checks_say_why_on_numbers_that_contradict_them():
    v = lessons.evaluate("12.interleaving_cuts_the_bubble", _numbers(interleaved={"replayed": 0.29}))
    assert not v.shown and "(1.07x)" in v.figures
    v = lessons.evaluate("12.zero_bubble_at_the_same_memory", _numbers(zb_h1={"peak": 5.0}))
    assert not v.shown and "peak 4 against 5" in v.figures
    v = lessons.evaluate("12.dualpipev_idles_least", _numbers(dualpipev={"replayed": 0.2}))
    assert not v.shown and v.why == "zb-h1 idled least"
    v = lessons.evaluate("12.prediction_matches_the_replay",
                         _numbers(dualpipev={"predicted": 0.05}))
    assert not v.shown and v.why == "dualpipev off by 10.0 points"
    eq = _numbers()
    eq["equivalence"][2]["library"] = 1e-3
    assert not lessons.evaluate("12.schedules_equal_one_device", eq).shown


def test_the_exercise_checks_accept_the_reference_and_name_each_mistake(capsys):
    assert lab12.check_zb_h1(zb_h1) is zb_h1
    from parlab.pipeline import one_f_one_b
    assert lab12.check_zb_h1(one_f_one_b) is not one_f_one_b
    assert "must run W of every micro-batch" in capsys.readouterr().out

    def w_at_the_end(p, m):
        return [[op for op in s if op[0] != "W"] + [("W", i) for i in range(m)]
                for s in zb_h1(p, m)]
    lab12.check_zb_h1(w_at_the_end)
    assert "holds at most 2, 1F1B's peak" in capsys.readouterr().out

    def no_warm_up(p, m):
        return [[op for i in range(m) for op in (("F", i), ("B", i), ("W", i))] for _ in range(p)]
    lab12.check_zb_h1(no_warm_up)
    assert "the bubble is" in capsys.readouterr().out

    assert lab12.check_split_backward(split_backward) is split_backward
    lab12.check_split_backward(lambda x, dy, w: (dy @ w, x.T @ dy, dy.sum(0)))
    assert "dA has shape (3, 4), want (4, 3)" in capsys.readouterr().out
    lab12.check_split_backward(lambda x, dy, w: (dy @ w, dy.T @ x, dy.mean(0)))
    assert "db differs" in capsys.readouterr().out


def test_the_learner_s_order_runs_on_four_ranks_equal_to_one_device(monkeypatch):
    monkeypatch.setattr(lab12, "CONFIG", replace(SMALL, steps=2))
    assert lab12.run_order(zb_h1) < 1e-5
