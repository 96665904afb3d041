"""Lab 14's lessons and exercises: each check says "shown" on numbers that show its claim
and "not shown", with the reason, on planted numbers that contradict it; the functions
that read the runs are checked on real runs of 4 ranks in 2 nodes (a few steps); the
exercises' checks say what is wrong with a wrong answer."""
import copy

import numpy as np
import pytest

from parlab import nodes
from parlab.course import lab14, lessons
from parlab.course.lab14_exercises import outer_step, slow_link_bytes


@pytest.fixture(scope="module")
def real():
    """The lab's runs, shortened: 4 ranks in 2 nodes, flat and hierarchical 3 steps,
    synchronous and local SGD 32 steps (two averagings across)."""
    devs = lab14.devices()
    sync = lab14.sync_runs(devs)
    local = lab14.local_runs(devs, steps=32)
    return {"sync_runs": sync, "local_runs": local,
            "numbers": {"sync": lab14.sync_numbers(sync), "local": lab14.local_numbers(local)}}


def test_real_runs_read_back_as_the_lessons_need(real):
    m = real["numbers"]
    assert lessons.evaluate("14.hierarchical_equals_one_device_and_sends_less_across", m).shown
    assert lessons.evaluate("14.local_sgd_sends_H_times_fewer_bytes", m).shown
    S = lab14.param_bytes(real["sync_runs"]["flat"])
    rows = {r["how"]: r for r in m["sync"]["bytes"]}
    assert rows["flat"]["handed"] == S and rows["hierarchical"]["handed"] == S / 2
    assert rows["flat"]["crossing"] == nodes.slow_link_bytes("flat", S, 4, 2)
    local = {r["how"]: r for r in m["local"]["bytes"]}
    assert local["local_sgd"]["handed"] * lab14.H == local["hierarchical"]["handed"]
    assert set(m["sync"]["replayed_s"]) == {"flat", "hierarchical"}
    assert m["local"]["samples"] == 32 * lab14.BATCH
    tl = lab14.quickest_steps(real["sync_runs"])
    assert tl.replayed and len(tl.ranks) == 8
    assert {s.axis for s in tl.spans if s.kind == "comm"} <= {"inside", "across"}
    c = lab14.curves(real["local_runs"]["local_sgd"])
    assert len(c["loss"]) == 32 - 15 and np.all(np.diff(c["seconds"]) > 0)
    assert lab14.plot_curves(real["local_runs"]) is not None


def _numbers():
    S = 1000
    sync = {"differences": {"flat": 1e-8, "hierarchical": 1e-8}, "between": "a link",
            "replayed_s": {"flat": 0.06, "hierarchical": 0.02},
            "bytes": [{"how": "flat", "S": S, "handed": S, "handed_formula": S,
                       "crossing": nodes.slow_link_bytes("flat", S, 4, 2),
                       "busiest": nodes.bytes_per_rank("flat", S, 4, 2)},
                      {"how": "hierarchical", "S": S, "handed": S / 2, "handed_formula": S / 2,
                       "crossing": nodes.slow_link_bytes("hierarchical", S, 4, 2),
                       "busiest": nodes.bytes_per_rank("hierarchical", S, 4, 2)}]}
    local = {"bytes": [{"how": "hierarchical", "handed": S / 2, "crossing": 2 * S},
                       {"how": "local_sgd", "handed": S / 2 / lab14.H, "crossing": 2 * S / lab14.H}],
             "H": lab14.H, "samples": 16384, "between": "a link",
             "hierarchical": {"loss": 0.058, "seconds": 6.0},
             "local_sgd": {"loss": 0.056, "seconds": 1.0}}
    return {"sync": sync, "local": local}


@pytest.mark.parametrize("name, plant", [
    ("14.hierarchical_equals_one_device_and_sends_less_across",
     lambda m: m["sync"]["differences"].update(hierarchical=1e-3)),
    ("14.hierarchical_equals_one_device_and_sends_less_across",
     lambda m: m["sync"]["bytes"][1].update(handed=600)),
    ("14.hierarchical_quicker_over_a_slow_link",
     lambda m: m["sync"]["replayed_s"].update(hierarchical=0.05)),
    ("14.local_sgd_sends_H_times_fewer_bytes",
     lambda m: m["local"]["bytes"][1].update(handed=500 / 8)),
    ("14.local_sgd_loss_close_to_synchronous",
     lambda m: m["local"]["local_sgd"].update(loss=0.09)),
    ("14.local_sgd_quicker_over_a_slow_link",
     lambda m: m["local"]["local_sgd"].update(seconds=3.0)),
])
def test_each_lesson_is_shown_on_numbers_that_show_it_and_not_on_planted_ones(name, plant):
    good = _numbers()
    assert lessons.evaluate(name, good).shown
    bad = copy.deepcopy(good)
    plant(bad)
    verdict = lessons.evaluate(name, bad)
    assert not verdict.shown and "not shown" in str(verdict)


def test_a_lesson_reads_its_part_alone_as_the_notebook_passes_it():
    m = _numbers()
    assert lessons.evaluate("14.hierarchical_quicker_over_a_slow_link", m["sync"]).shown
    assert "replayed on 4 dedicated devices" in str(
        lessons.evaluate("14.local_sgd_quicker_over_a_slow_link", m["local"]))


def test_the_exercises_say_what_is_wrong(capsys):
    assert lab14.check_slow_link_bytes(lambda how, S, n, k: 2 * S) is slow_link_bytes
    assert "A ring over n ranks" in capsys.readouterr().out
    mine = lambda how, S, n, k: slow_link_bytes(how, S, n, k)      # noqa: E731
    assert lab14.check_slow_link_bytes(mine) is mine
    assert lab14.check_outer_step(lambda s, d, v, lr, mu: (s, v)) is outer_step
    assert "Average the nodes' changes first" in capsys.readouterr().out
    start, models = np.zeros(2), [np.array([1.0, 2.0]), np.array([3.0, -2.0])]
    new, _ = outer_step(start, [start - m for m in models], np.zeros(2), 1.0, 0.0)
    assert np.allclose(new, [2.0, 0.0])
