import json
from pathlib import Path

import pytest

from parlab import exercises
from parlab.course import exercise, lab02, lab06, student

LABS = Path(__file__).resolve().parents[1] / "labs"


def test_a_right_answer_is_used_and_praised(capsys):
    def mine(s, n):
        return 2 * (n - 1) / n * s
    assert exercise.check("ring_allreduce_bytes", mine) is mine
    assert "correct on all" in capsys.readouterr().out


def test_a_wrong_answer_is_explained_and_replaced_by_the_reference(capsys):
    def wrong(s, n):
        return (n - 1) / n * s  # forgot the all-gather half
    used = exercise.check("ring_allreduce_bytes", wrong)
    out = capsys.readouterr().out
    assert used is exercise.EXERCISES["ring_allreduce_bytes"].reference
    assert "not yet right" in out and "expected" in out and "Hint" in out


def test_an_unfilled_exercise_falls_back_and_says_so(capsys):
    def todo(s, n):
        raise NotImplementedError
    used = exercise.check("ring_allreduce_bytes", todo)
    assert used is exercise.EXERCISES["ring_allreduce_bytes"].reference
    assert "not attempted yet" in capsys.readouterr().out
    with pytest.raises(KeyError, match="known"):
        exercise.check("no such exercise", todo)


def test_strip_solutions_keeps_indentation_and_the_rest():
    src = ("def f(x):\n"
           "    y = 1\n"
           "    # BEGIN SOLUTION\n"
           "    return x + y\n"
           "    # END SOLUTION\n"
           "print('after')\n")
    assert student.strip_solutions(src) == ("def f(x):\n    y = 1\n"
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


def test_every_exercise_accepts_its_reference_and_falls_back_when_unfilled(capsys):
    assert len(exercise.EXERCISES) >= 8
    for name, ex in exercise.EXERCISES.items():
        assert exercise.check(name, ex.reference) is ex.reference
        assert "correct on all" in capsys.readouterr().out

        def todo(*args):
            raise NotImplementedError("your code here")
        assert exercise.check(name, todo) is ex.reference
        assert "not attempted yet" in capsys.readouterr().out, name


def test_second_exercises_catch_the_usual_mistakes(capsys):
    def all_wait(compute_s):                      # forgot that the slowest does not wait
        return [max(compute_s)] * len(compute_s)
    assert exercise.check("collective_wait", all_wait) is not all_wait
    def forgot_gradients(sizes, optimizer):
        params = sum(i * o + o for i, o in zip(sizes[:-1], sizes[1:]))
        return 4 * params * (1 + {"sgd": 0, "momentum": 1, "adam": 2}[optimizer])
    assert exercise.check("training_state_bytes", forgot_gradients) is not forgot_gradients
    def gpipe_without_fill(p, m, f, b):
        return m * (f + b)
    assert exercise.check("pipeline_step_time", gpipe_without_fill) is not gpipe_without_fill
    def pushes_count(events):                     # every push counted, pulls ignored
        return list(range(sum(a == "push" for a, _ in events)))
    assert exercise.check("push_staleness", pushes_count) is not pushes_count
    out = capsys.readouterr().out
    assert out.count("not yet right") == 4 and "Hint" in out


def test_check_split_says_which_stage_to_lighten_but_never_the_answer(capsys):
    from parlab.split import balance
    costs = [5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 2.0]
    best = balance(costs, 3)
    wrong = [1, 2] if best != [1, 2] else [6, 7]
    lab02.check_split(wrong, costs, 3)
    out = capsys.readouterr().out
    assert "not yet the best" in out and "stage" in out and str(best) not in out
    lab02.check_split(lambda: best, costs, 3)
    assert "correct" in capsys.readouterr().out

    def todo():
        raise NotImplementedError
    ratio = lab02.check_split(todo, costs, 3)
    assert "not attempted yet" in capsys.readouterr().out and ratio < 2


def test_update_rule_hints_do_not_state_the_rule():
    def uphill(shard, grad, lr, staleness):
        shard += lr * grad
    def unscaled(shard, grad, lr, staleness):
        shard -= grad
    for rule in (uphill, unscaled):
        problem = lab06._rule_problem(rule)
        assert problem and "lr * grad" not in problem and "- lr" not in problem
    assert "uphill" in lab06._rule_problem(uphill)
    assert "by 1 times the gradient" in lab06._rule_problem(unscaled)
    def right(shard, grad, lr, staleness):
        shard -= lr * grad
    assert lab06._rule_problem(right) is None


def test_a_staleness_rule_that_counts_the_others_pushes_and_ignores_pulls_is_caught(capsys):
    def others_pushes(events):                    # right on every case but a late pull
        out, pushed = [], []
        for action, worker in events:
            if action == "push":
                out.append(sum(w != worker for w in pushed))
                pushed.append(worker)
        return out
    assert exercise.check("push_staleness", others_pushes) is not others_pushes
    assert "1 of 5 cases wrong" in capsys.readouterr().out


def test_f_and_b_in_turn_meets_1f1bs_memory_bound_but_is_not_1f1b(capsys):
    from parlab.course import lab04

    def no_warmup(p, m):
        return [[op for i in range(m) for op in (("F", i), ("B", i))] for _ in range(p)]
    used = lab04.check_schedule(no_warmup)
    out = capsys.readouterr().out
    assert used is not no_warmup and "where 1F1B takes" in out and "warm-up" in out
    assert lab04.whose(used) == "the reference" and lab04.whose(no_warmup) == "your"


def test_a_printout_names_the_reference_when_the_lab_went_on_with_it():
    def todo(*args):
        raise NotImplementedError
    assert lab02.whose(lab02.check("split_bytes_per_step", todo, verbose=False)) == "the reference"
    assert lab02.whose(todo) == "your"
