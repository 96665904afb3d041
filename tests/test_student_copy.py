"""The student copy (``make student``) must run top to bottom, like the labs themselves.

Executing every student copy would double the notebooks' share of CI (nbval already runs
each lab once, about 8 of the suite's minutes on 2 cores). What can break in a copy is
narrow: ``strip_solutions`` replaces each solution by ``raise NotImplementedError``, and
that raise must reach a checker that catches it and goes on with the reference. So:

1. statically, for every lab (milliseconds): each ``raise NotImplementedError`` left in a
   copy sits inside a function, and that function is handed, in the same or a later
   cell, to one of ``parlab.exercises``' checkers (a bare raise at the top level of a
   cell, as lab 02 once had, stops the notebook);
2. each of those checkers, given an unfilled function, says "not attempted yet" and
   returns the reference (the pure ones in test_exercises.py; the rest here, one launch);
3. end to end, the copy of the cheapest lab, 00, runs under nbval (lax), which proves
   that the pieces above add up in a real kernel. Lab 01's copy, run too until
   2026-11-28, added 25-30 s of the suite's 15 minutes and nothing lab 00's lacks: both
   hand their two exercises to ``exercise.check`` in the kernel.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parlab import exercises
from parlab.course import exercise, lab04, lab05, lab06, lab08

LABS = Path(__file__).resolve().parents[1] / "labs"
# a checker is exercise.check or check_<something>: each catches an unfilled
# exercise (NotImplementedError) and falls back (tested below and in test_exercises.py)
EXECUTED = ("00_devices.ipynb",)


def _code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _raising_functions(tree: ast.AST) -> tuple[set[str], int]:
    """Names of functions that raise NotImplementedError, and raises outside any function."""
    names, bare = set(), 0

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                target = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(target, ast.Name) and target.id == "NotImplementedError":
                    if function is None:
                        nonlocal bare
                        bare += 1
                    else:
                        names.add(function)
            visit(child, function)

    visit(tree, None)
    return names, bare


def _checked_names(tree: ast.AST) -> set[str]:
    """Names passed as the first argument to a lab module's checker, ``labNN.check(...)``
    or ``labNN.check_...(...)`` (or the older ``parlab.exercises.check(...)``)."""
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and (node.func.attr == "check" or node.func.attr.startswith("check_"))
                and re.search(r"\blab\d\d\b|exercises", ast.unparse(node.func.value))):
            for arg in node.args:
                if isinstance(arg, ast.Name):
                    out.add(arg.id)
    return out


@pytest.fixture(scope="module")
def student(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("student")
    exercises.student_copy(LABS, out)
    return out


def test_every_unfilled_exercise_reaches_a_checker_that_falls_back(student):
    copies = sorted(student.glob("*.ipynb"))
    assert len(copies) == len(list(LABS.glob("*.ipynb")))
    unfilled = 0
    for path in copies:
        cells = [ast.parse(src) for src in _code_cells(path)]
        for i, tree in enumerate(cells):
            names, bare = _raising_functions(tree)
            assert bare == 0, (f"{path.name}, code cell {i}: a `raise NotImplementedError` outside "
                               "any function stops the student's notebook; put the exercise in a "
                               "function handed to its lab module's checker")
            later = set().union(*(_checked_names(t) for t in cells[i:]))
            for name in names:
                assert name in later, (f"{path.name}, code cell {i}: `{name}` raises "
                                       "NotImplementedError in the student copy but is never "
                                       "handed to a exercise.check* function")
            unfilled += len(names)
    assert unfilled >= 14, f"only {unfilled} exercises found: every lab 00-06 has two"


def test_checkers_that_run_on_ranks_fall_back_when_unfilled(capsys):
    import parlab.pipeline
    from parlab.torch import data_parallel, parameter_server, zero

    def todo(*args):
        raise NotImplementedError("your code here")
    assert lab04.check_schedule(todo) is parlab.pipeline.one_f_one_b
    assert lab06.check_update_rule(todo) is parameter_server.sgd_update
    assert lab05.check_average_gradients(todo) is data_parallel.average_gradients
    assert lab08.check_zero2_step(todo) is zero.zero2_step      # found before any launch
    assert capsys.readouterr().out.count("not attempted yet") == 4


@pytest.mark.slow
def test_the_cheapest_student_copy_runs_top_to_bottom(student):
    paths = [str(student / name) for name in EXECUTED]
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=300",
                          *paths], cwd=student, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    for name in EXECUTED:     # the copies really were unfilled
        assert any("NotImplementedError" in src for src in _code_cells(student / name))


# --- solution markers the copy cannot strip safely -----------------------------------------
# Before: each of these exited 0 and handed `answer = 42` to students in every copy (nested
# markers also left a stray `# END SOLUTION`). A copy is refused, naming notebook, cell, line.

def _notebook(folder: Path, code: str, name: str = "07_marked.ipynb") -> Path:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# A lab\n"]},
             {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
              "source": ["def exercise(x):\n", *code.splitlines(keepends=True)]}]
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


@pytest.mark.parametrize("code,says", [
    ("    # BEGIN SOLUTION\n    answer = 42\n", "'# BEGIN SOLUTION' has no '# END SOLUTION'"),
    ("    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n    answer = 42\n    # END SOLUTION\n"
     "    # END SOLUTION\n", "nested"),
    ("    answer = 42\n    # END SOLUTION\n", "no '# BEGIN SOLUTION' before it"),
    ("    #BEGIN SOLUTION\n    answer = 42\n    #END SOLUTION\n", "'#BEGIN SOLUTION'"),
    ("    # begin solution\n    answer = 42\n    # end solution\n", "'# begin solution'"),
    ("    #  BEGIN  SOLUTION\n    answer = 42\n    #  END  SOLUTION\n", "'#  BEGIN  SOLUTION'"),
    ("    # BEGIN_SOLUTION\n    answer = 42\n    # END_SOLUTION\n", "'# BEGIN_SOLUTION'"),
    ("    answer = 42  # BEGIN SOLUTION\n", "'answer = 42  # BEGIN SOLUTION'"),
])
def test_a_marker_the_copy_cannot_strip_is_refused_before_anything_is_written(tmp_path, code,
                                                                               says):
    from parlab.course.student import StudentCopyError, student_copy
    _notebook(tmp_path / "labs", code)
    with pytest.raises(StudentCopyError) as caught:
        student_copy(tmp_path / "labs", tmp_path / "student")
    message = str(caught.value)
    assert "07_marked.ipynb" in message and "cell 1 (first line 'def exercise(x):')" in message
    assert says in message and "\n" not in message, message
    assert not (tmp_path / "student").exists()


def test_a_copy_that_still_says_solution_after_stripping_is_refused(tmp_path):
    from parlab.course.student import StudentCopyError, student_copy
    _notebook(tmp_path / "labs", "    # BEGIN SOLUTION\n    x = 1\n    # END SOLUTION\n"
                                 "    SOLUTION = 42   # the answer, left outside the markers\n")
    with pytest.raises(StudentCopyError, match=r"07_marked.ipynb, cell 1 .*line 5.*solution"):
        student_copy(tmp_path / "labs", tmp_path / "student")
    assert not (tmp_path / "student").exists()


def test_well_formed_markers_still_strip(tmp_path):
    from parlab.course.student import student_copy
    _notebook(tmp_path / "labs", "    # BEGIN SOLUTION (hint: one line)\n    return 42\n"
                                 "    # END SOLUTION\n")
    (written,), _ = student_copy(tmp_path / "labs", tmp_path / "student")
    text = "".join(json.loads(written.read_text())["cells"][1]["source"])
    assert text == 'def exercise(x):\n    raise NotImplementedError("your code here")\n'


def test_the_last_guard_refuses_a_copy_the_stripping_missed(tmp_path, monkeypatch):
    from parlab.course import student
    monkeypatch.setattr(student, "strip_solutions", lambda text: text)    # a stripping bug
    _notebook(tmp_path / "labs", "    # BEGIN SOLUTION\n    return 42\n    # END SOLUTION\n")
    with pytest.raises(student.StudentCopyError, match="line 2 of the copy still says solution"):
        student.student_copy(tmp_path / "labs", tmp_path / "student")
    assert not (tmp_path / "student").exists()
