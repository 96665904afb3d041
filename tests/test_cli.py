"""The command line: bad settings are named as the flags a user typed, with no traceback,
and ``student-copy`` never overwrites the labs it copies.

Before: ``student-copy labs labs`` stripped the solutions from every lab in place (exit 0);
``run`` reported ``--nproc 0`` as ``world_size=`` inside an 18-line traceback and
``--args notjson`` as a bare JSONDecodeError; ``bench --only ''`` ran every benchmark;
an empty or missing folder or a broken notebook gave a traceback or silence.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
MARK = "# BEGIN SOLUTION"


def parlab_cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
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
