"""Exercises that check themselves.

In a lab, an exercise cell holds the learner's function with the reference solution
between ``# BEGIN SOLUTION`` and ``# END SOLUTION``; the next cell calls
``labNN.check("name", fn)``. The checker runs the learner's function on test cases, says
in words what is right or wrong, and returns the function the rest of the lab should use:
the learner's when it passes, the reference otherwise (and it says so), so a lab always
runs to the end. Each lab's module registers its exercises here when it is imported.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass
class Exercise:
    name: str
    reference: Callable
    cases: Sequence[tuple]                  # argument tuples to try
    hint: str                               # said when an answer is wrong
    close: Callable = field(default=lambda got, want: math.isclose(got, want, rel_tol=1e-9,
                                                                    abs_tol=1e-12))


EXERCISES: dict[str, Exercise] = {}


def register(exercise: Exercise) -> Exercise:
    EXERCISES[exercise.name] = exercise
    return exercise


_FALLBACKS: list[Callable] = []     # references a lab's own checker hands back (lab 04's 1F1B)


def fallback(reference: Callable) -> Callable:
    """Return ``reference`` as what a lab's own checker hands back in the learner's place,
    so that ``whose`` knows it."""
    if not any(reference is f for f in _FALLBACKS):
        _FALLBACKS.append(reference)
    return reference


def whose(fn: Callable) -> str:
    """"your" for the learner's function, "the reference" for one a check handed back
    instead (``f"{whose(fn)} function"``): what a cell's printout says it ran. A student
    copy, where the learner has not written the function yet, must not call the
    reference's answer theirs."""
    references = [ex.reference for ex in EXERCISES.values()] + _FALLBACKS
    return "the reference" if any(fn is r for r in references) else "your"


def check(name: str, fn: Callable, *, verbose: bool = True) -> Callable:
    """Check the learner's ``fn`` for exercise ``name``; return the function to use next."""
    try:
        ex = EXERCISES[name]
    except KeyError:
        raise KeyError(f"no exercise named {name!r}; known: {sorted(EXERCISES)}") from None
    problems = []
    for args in ex.cases:
        want = ex.reference(*args)
        try:
            got = fn(*args)
        except NotImplementedError:
            _say(verbose, f"[{name}] not attempted yet: the lab goes on with the reference "
                          "solution. Fill in the function and run this cell again.")
            return ex.reference
        except Exception as exc:  # noqa: BLE001 - reported to the learner in words
            problems.append(f"{name}{args} raised {type(exc).__name__}: {exc}")
            continue
        try:
            ok = bool(ex.close(got, want))
        except Exception:  # noqa: BLE001 - e.g. wrong type or shape
            ok = False
        if not ok:
            problems.append(f"{name}{args} returned {got!r}, expected {want!r}")
    if problems:
        shown = "\n  ".join(problems[:3])
        more = f"\n  (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        _say(verbose, f"[{name}] not yet right, {len(problems)} of {len(ex.cases)} cases "
                      f"wrong:\n  {shown}{more}\nHint: {ex.hint}\n"
                      "The lab goes on with the reference solution.")
        return ex.reference
    _say(verbose, f"[{name}] correct on all {len(ex.cases)} cases.")
    return fn


def check_with(name: str, fn: Callable, problem: Callable, reference: Callable,
               praise: str) -> Callable:
    """Check the learner's ``fn`` with ``problem(fn)``, which returns None when it is right
    and otherwise what is wrong, in words; say so, and return the function the lab goes
    on with: ``fn`` when right, ``reference`` otherwise (unfilled, wrong, or raising)."""
    reference = fallback(reference)
    try:
        found = problem(fn)
    except NotImplementedError:
        print(f"[{name}] not attempted yet: the lab goes on with the reference.")
        return reference
    except Exception as exc:  # noqa: BLE001 - told to the learner in words
        found = f"it raised {type(exc).__name__}: {exc}"
    if found:
        print(f"[{name}] not yet right: {found}\nThe lab goes on with the reference.")
        return reference
    print(f"[{name}] correct: {praise}")
    return fn


def run_on_ranks(name: str, worker, fn, world_size: int = 2):
    """Run the learner's ``fn`` on real ranks through ``worker(rank, world_size, fn)``.

    Returns the ranks' results, or None after saying why (not attempted yet, or which rank
    failed and how), in which case the caller goes on with its reference solution.
    """
    from ..errors import WorkerError
    from ..launcher import launch
    try:
        return launch(worker, world_size, args=(fn,), timeout=60).results
    except WorkerError as err:
        if "NotImplementedError" in err.summary:
            print(f"[{name}] not attempted yet: the lab goes on with the reference solution.")
        else:
            print(f"[{name}] your function failed on rank {err.rank}: {err.summary}\n"
                  "The lab goes on with the reference solution.")
        return None


def _say(verbose: bool, text: str) -> None:
    if verbose:
        print(text)
