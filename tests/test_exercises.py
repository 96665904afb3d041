import json
from pathlib import Path

import pytest

from parlab import exercises

LABS = Path(__file__).resolve().parents[1] / "labs"


def test_a_right_answer_is_used_and_praised(capsys):
    def mine(s, n):
        return 2 * (n - 1) / n * s
    assert exercises.check("ring_allreduce_bytes", mine) is mine
    assert "correct on all" in capsys.readouterr().out


def test_a_wrong_answer_is_explained_and_replaced_by_the_reference(capsys):
    def wrong(s, n):
        return (n - 1) / n * s  # forgot the all-gather half
    used = exercises.check("ring_allreduce_bytes", wrong)
    out = capsys.readouterr().out
    assert used is exercises.EXERCISES["ring_allreduce_bytes"].reference
    assert "not yet right" in out and "expected" in out and "Hint" in out


def test_an_unfilled_exercise_falls_back_and_says_so(capsys):
    def todo(s, n):
        raise NotImplementedError
    used = exercises.check("ring_allreduce_bytes", todo)
    assert used is exercises.EXERCISES["ring_allreduce_bytes"].reference
    assert "not attempted yet" in capsys.readouterr().out
    with pytest.raises(KeyError, match="known"):
        exercises.check("no such exercise", todo)


def test_strip_solutions_keeps_indentation_and_the_rest():
    src = ("def f(x):\n"
           "    y = 1\n"
           "    # BEGIN SOLUTION\n"
           "    return x + y\n"
           "    # END SOLUTION\n"
           "print('after')\n")
    assert exercises.strip_solutions(src) == ("def f(x):\n    y = 1\n"
                                              '    raise NotImplementedError("your code here")\n'
                                              "print('after')\n")


def test_student_copy_of_the_labs_has_no_solutions(tmp_path):
    written = exercises.student_copy(LABS, tmp_path)
    assert written, "no notebooks found in labs/"
    stripped = 0
    for path in written:
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            text = "".join(cell["source"])
            assert "BEGIN SOLUTION" not in text
            stripped += "NotImplementedError" in text and cell["cell_type"] == "code"
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None
    assert stripped >= 1
