"""Lab 13's lessons and exercises: each check says "shown" on numbers that show its claim
and "not shown", with the reason, on planted numbers that contradict it; the functions
that read the runs are checked on real runs of 4 ranks (a small model); the exercises'
checks say what is wrong with a wrong answer."""
import os
from pathlib import Path

import pytest

from parlab.course import lab13, lessons
from parlab.course.lab13_exercises import newest_complete, reads
from parlab.torch.checkpoint import Config

SMALL = Config(sizes=(64, 32, 32, 10), batch_size=32)


def test_a_real_stop_and_resume_reads_back(monkeypatch):
    monkeypatch.setattr(lab13, "config", lambda: SMALL)
    runs = lab13.resume_runs()
    crash = lab13.crash_while_saving(lab13.folder("crash-test"))
    m = lab13.numbers(runs, crash)
    assert lessons.evaluate("13.resumed_equals_uninterrupted", m).shown
    assert lessons.evaluate("13.crash_while_saving_loses_nothing", m).shown
    assert [r["start"] for r in m["rows"].values()] == [3, 3, 3]
    assert m["weights_only"]["weights"] > 1e-4
    assert [r["step"] for r in m["bytes"]] == [3] * 4
    assert sorted(p.name for p in runs["whole_folder"].iterdir()) == ["step-000003",
                                                                     "step-000006"]
    assert crash["latest"] == "step-000003" and crash["left"][0].startswith(".step-000006")
    assert "0.weight of shape (32, 64); this model's is (16, 64)" in lab13.refusal(
        runs["folder"], sizes=(64, 16, 32, 10))
    assert "the manifest recorded" in lab13.damaged_refusal(runs["folder"])
    assert lab13.manifest_of(runs["whole_folder"])["manifest"]["step"] == 6
    assert lab13.plot_losses(runs) is not None


def test_a_real_restart_loses_one_step(monkeypatch):
    monkeypatch.setattr(lab13, "config", lambda: SMALL)
    m = lab13.restart_run()
    assert lessons.evaluate("13.restart_loses_only_the_steps_since_the_checkpoint", m).shown
    assert (m["start"], m["lost"]) == (4, 1) and "rank 1 of 4" in m["attempts"][0]


def _numbers(**over):
    m = {"bytes": [{"rank": r, "bytes": 934_000, "formula": 903_198.0} for r in range(4)],
         "rows": {"resumed on 2 ranks": {"start": 3, "weights": 1.5e-8, "losses": 2e-7}},
         "weights_only": {"start": 3, "weights": 5.8e-3, "losses": 6.6e-2},
         "crash": {"error": "rank 1 of 4 failed", "left": [".step-000006.partial-1", "step-000003"],
                   "latest": "step-000003", "start": 3, "weights": 1.5e-8}}
    m.update(over)
    return m


def test_the_checks_show_their_claims_and_say_why_not():
    for name in ("13.bytes_per_rank_match_formula", "13.resumed_equals_uninterrupted",
                 "13.crash_while_saving_loses_nothing"):
        assert lessons.evaluate(name, _numbers()).shown, name
    big = [{"rank": r, "bytes": 1_100_000, "formula": 903_198.0} for r in range(4)]
    v = lessons.evaluate("13.bytes_per_rank_match_formula", _numbers(bytes=big))
    assert not v.shown and "21.8% off at most" in v.figures
    v = lessons.evaluate("13.resumed_equals_uninterrupted", _numbers(
        weights_only={"start": 3, "weights": 1e-8, "losses": 1e-8}))
    assert not v.shown and "weights alone were enough" in v.why
    v = lessons.evaluate("13.crash_while_saving_loses_nothing", _numbers(
        crash={**_numbers()["crash"], "latest": None, "start": 0}))
    assert not v.shown
    restart = {"attempts": ["rank 1 of 4: killed"], "start": 4, "killed_after": 5, "lost": 1,
               "steps": 6, "weights": 0.0}
    name = "13.restart_loses_only_the_steps_since_the_checkpoint"
    assert lessons.evaluate(name, restart).shown
    assert not lessons.evaluate(name, {**restart, "start": 0, "lost": 5}).shown
    assert {x.name for x in lessons.of_lab("13")} == {
        "13.bytes_per_rank_match_formula", "13.resumed_equals_uninterrupted",
        "13.crash_while_saving_loses_nothing",
        "13.restart_loses_only_the_steps_since_the_checkpoint"}


def test_the_exercise_checks_accept_the_reference_and_name_each_mistake(capsys, tmp_path):
    assert lab13.check_reads(reads) is reads
    lab13.check_reads(lambda rows, s, n, k: [(0, 0, rows)])
    assert "your slices cover rows 0-511; this rank's part is rows 0-255" in \
        capsys.readouterr().out
    lab13.check_reads(lambda rows, s, n, k: [(0, a, b) for _, a, b in reads(rows, s, n, k)])
    assert "the rows are right but the slices are not" in capsys.readouterr().out

    assert lab13.check_newest_complete(newest_complete) is newest_complete
    lab13.check_newest_complete(lambda f: max(Path(f).iterdir(), default=None))
    assert "step-000006, whose manifest is missing" in capsys.readouterr().out
    lab13.check_newest_complete(lambda f: max((p for p in Path(f).iterdir()
                                               if (p / "manifest.json").exists()),
                                              key=lambda p: p.name.lstrip("."), default=None))
    assert "a .partial folder" in capsys.readouterr().out
    assert not os.listdir(tmp_path)
