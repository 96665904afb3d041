"""The command line: bad settings are named as the flags a user typed, with no traceback,
and ``student-copy`` never overwrites the labs it copies.

Before: ``student-copy labs labs`` stripped the solutions from every lab in place (exit 0);
``run`` reported ``--nproc 0`` as ``world_size=`` inside an 18-line traceback and
``--args notjson`` as a bare JSONDecodeError; ``bench --only ''`` ran every benchmark;
an empty or missing folder or a broken notebook gave a traceback or silence.
"""
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
MARK = "# BEGIN SOLUTION"


def parlab_cli(*args, cwd=None, env=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
           **(env or {})}
    return subprocess.run([sys.executable, "-m", "parlab", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd or ROOT)


@pytest.fixture
def labs(tmp_path):
    """A copy of the labs to copy from (the repository's own are never put at risk)."""
    out = tmp_path / "labs"
    shutil.copytree(LABS, out, ignore=shutil.ignore_patterns("traces", ".ipynb_checkpoints"))
    return out


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(Path(folder).glob("*.ipynb"))}


def test_the_labs_hold_solutions_to_strip():
    assert sum(MARK in p.read_text() for p in LABS.glob("*.ipynb")) >= 8


@pytest.mark.parametrize("where", ["same", "same, spelled differently", "inside"])
def test_a_copy_onto_or_into_the_labs_is_refused_and_changes_nothing(labs, where):
    dst = {"same": str(labs), "same, spelled differently": f"{labs}/../labs/",
           "inside": str(labs / "student")}[where]
    before = _snapshot(labs)
    for extra in ([], ["--force"]):
        out = parlab_cli("student-copy", str(labs), dst, *extra)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "source folder" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert _snapshot(labs) == before
    assert not (labs / "student").exists()


def test_an_existing_copy_is_replaced_only_with_force_and_listed(labs, tmp_path):
    dst = tmp_path / "student"
    n = len(list(labs.glob("*.ipynb")))      # every lab, whatever their number
    first = parlab_cli("student-copy", str(labs), str(dst))
    assert first.returncode == 0 and first.stdout.count("wrote ") == n, first.stdout
    again = parlab_cli("student-copy", str(labs), str(dst))
    assert again.returncode == 2 and "--force" in again.stderr, again.stderr
    forced = parlab_cli("student-copy", "--force", str(labs), str(dst))
    assert forced.returncode == 0 and forced.stdout.count("replaced ") == n, forced.stdout
    assert not any(MARK in p.read_text() for p in dst.glob("*.ipynb"))


def test_an_empty_a_missing_folder_and_a_broken_notebook_are_named(labs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = parlab_cli("student-copy", str(empty), str(tmp_path / "s1"))
    assert out.returncode == 2 and "holds no notebooks" in out.stderr, out.stderr
    out = parlab_cli("student-copy", str(tmp_path / "nowhere"), str(tmp_path / "s2"))
    assert out.returncode == 2 and "no folder" in out.stderr and "Traceback" not in out.stderr
    (labs / "99_broken.ipynb").write_text('{"cells": [')
    out = parlab_cli("student-copy", str(labs), str(tmp_path / "s3"))
    assert out.returncode == 2 and "99_broken.ipynb is not a readable notebook" in out.stderr
    assert not (tmp_path / "s3").exists(), "a broken notebook must stop the copy before writing"


@pytest.mark.parametrize("flags,says", [
    (["--nproc", "0"], "--nproc must be 1 or more"),
    (["--timeout", "inf"], "--timeout must be a number of seconds"),
    (["--timeout", "-5"], "--timeout must be a number of seconds"),
    (["--args", "notjson"], "--args must be a JSON list"),
    (["--args", "5"], "--args must be a JSON list, e.g. --args '[5]'"),
])
def test_run_names_the_flag_at_fault(flags, says):
    out = parlab_cli("run", "plain_workers:no_torch", *flags)
    assert out.returncode == 2, out.stdout + out.stderr
    assert says in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "world_size=" not in out.stderr and "args=(" not in out.stderr


def test_run_names_a_target_it_cannot_find():
    for target, says in (("nomodule_here:f", "cannot import 'nomodule_here'"),
                         ("plain_workers:missing", "has no function 'missing'"),
                         ("plain_workers", "MODULE:FUNCTION")):
        out = parlab_cli("run", target)
        assert out.returncode == 2 and says in out.stderr, out.stderr


def test_run_reports_a_failing_rank_without_a_local_traceback():
    out = parlab_cli("run", "plain_workers:no_torch_raises", "--nproc", "2", "--timeout", "60")
    assert out.returncode == 1
    assert "rank 1 of 2 failed: RuntimeError: plain failure" in out.stderr, out.stderr
    assert not out.stderr.startswith("Traceback")


def test_bench_only_an_empty_name_is_refused():
    out = parlab_cli("bench", "--only", "")
    assert out.returncode == 2 and "unknown benchmark ''" in out.stdout, out.stdout


def _one_line_refusal(out, *says):
    """Exit 2, one line on stderr naming what to change, nothing written to stdout."""
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "wrote" not in out.stdout and "replaced" not in out.stdout, out.stdout
    for text in says:
        assert text in out.stderr, out.stderr


def test_a_notebook_with_unbalanced_markers_is_refused_by_name(labs, tmp_path):
    # before: exit 0, "wrote" for each lab, and `answer = 42` in the copy
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": ["#BEGIN SOLUTION\n", "answer = 42\n", "#END SOLUTION\n"]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (labs / "99_marked.ipynb").write_text(json.dumps(nb))
    out = parlab_cli("student-copy", str(labs), str(tmp_path / "student"))
    _one_line_refusal(out, "99_marked.ipynb, cell 0", "'#BEGIN SOLUTION'")
    assert not (tmp_path / "student").exists()


@contextmanager
def _immutable(path):
    """chattr +i (refused even to root, unlike permission bits), undone afterwards."""
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and a filesystem with it)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.parametrize("where", ["a file", "under a file", "a folder named like a notebook",
                                   "an immutable folder", "an immutable notebook"])
def test_a_destination_that_cannot_take_every_copy_is_refused_before_any_is_written(
        labs, tmp_path, where):
    # before: a 17-24 line traceback, and with --force the notebooks before the failing one
    # already replaced
    dst = tmp_path / "student"
    names = sorted(p.name for p in labs.glob("*.ipynb"))
    if where in ("a file", "under a file"):
        dst.write_text("not a folder")
        target = dst if where == "a file" else dst / "copy"
        out = parlab_cli("student-copy", "--force", str(labs), str(target))
        _one_line_refusal(out, str(dst), "is a file")
        assert dst.read_text() == "not a folder"
        return
    dst.mkdir()
    for name in names:                   # an earlier copy, which --force would replace
        (dst / name).write_text("earlier copy")
    last = dst / names[-1]
    if where == "a folder named like a notebook":
        last.unlink()
        last.mkdir()
        out = parlab_cli("student-copy", "--force", str(labs), str(dst))
        _one_line_refusal(out, str(last), "is a folder")
    else:
        with _immutable(dst if where == "an immutable folder" else last):
            out = parlab_cli("student-copy", "--force", str(labs), str(dst))
        _one_line_refusal(out, str(dst if where == "an immutable folder" else last),
                          "nothing was changed")
    for name in names[:-1]:
        assert (dst / name).read_text() == "earlier copy", f"{name} was replaced"
    assert sorted(p.name for p in dst.iterdir()) == names, "a temporary file was left behind"


@pytest.mark.parametrize("flags,says", [
    (["--nproc", "33"], "--nproc 33"),
    (["--nproc", "1000"], "--nproc 1000"),
    (["--args", "[" * 50000 + "]" * 50000], "--args is nested too deeply"),
])
def test_run_names_the_flag_when_the_value_is_out_of_reach(flags, says):
    # before: an 18-line ValueError naming world size, never --nproc; a RecursionError
    out = parlab_cli("run", "plain_workers:no_torch", *flags)
    assert out.returncode == 2, out.stdout + out.stderr
    assert says in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("where", ["in a missing folder", "under a file", "a folder"])
def test_run_checks_the_trace_path_before_launching(tmp_path, where):
    # before: found only after the whole run, with a traceback, and the trace lost
    (tmp_path / "file").write_text("")
    trace = {"in a missing folder": tmp_path / "nowhere" / "t.json",
             "under a file": tmp_path / "file" / "t.json", "a folder": tmp_path}[where]
    out = parlab_cli("run", "plain_workers:no_torch", "--trace", str(trace))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert f"--trace {str(trace)!r}" in out.stderr, out.stderr
    assert "results" not in out.stdout, "the run was launched before the trace path was checked"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_run_writes_a_trace_where_it_was_asked(tmp_path):
    out = parlab_cli("run", "plain_workers:no_torch", "--trace", str(tmp_path / "t.json"))
    assert out.returncode == 0, out.stderr
    assert "traceEvents" in (tmp_path / "t.json").read_text()


@pytest.mark.parametrize("lab", ["", " ", "x", "6a", "99"])
def test_lessons_refuses_a_lab_that_is_not_one(lab):
    # before: --lab "" ran lab 00
    out = parlab_cli("lessons", "--lab", lab)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert "--lab must be one of 00" in out.stderr and f"got {lab!r}" in out.stderr, out.stderr
    assert "lesson" not in out.stdout, "a lab ran"


@pytest.mark.parametrize("command", [["info"], ["run", "plain_workers:no_torch"]])
@pytest.mark.parametrize("mode", ["gpu", "shared-gpu", "gpus"])
def test_a_device_mode_set_in_the_environment_is_named_without_a_traceback(command, mode):
    # before: a traceback saying "pass mode='auto'", never naming PARLAB_DEVICES
    env = {"PARLAB_DEVICES": mode, "CUDA_VISIBLE_DEVICES": ""}     # no GPU, on any machine
    out = parlab_cli(*command, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"PARLAB_DEVICES={mode}" in out.stderr or f"PARLAB_DEVICES={mode!r}" in out.stderr
    assert "Traceback" not in out.stderr and "mode='auto'" not in out.stderr, out.stderr
