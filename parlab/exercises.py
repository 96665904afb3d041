"""Exercises that check themselves, and the student copy of the labs.

In a lab, an exercise cell holds the learner's function with the reference solution
between ``# BEGIN SOLUTION`` and ``# END SOLUTION``; the next cell calls
``parlab.exercises.check("name", fn)``. The checker runs the learner's function on test
cases, says in words what is right or wrong, and returns the function the rest of the lab
should use: the learner's when it passes, the reference otherwise (and it says so), so a
lab always runs to the end.

``python -m parlab student-copy`` writes the labs with every solution replaced by
``raise NotImplementedError``: the copy instructors hand out.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from . import metrics


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


def run_on_ranks(name: str, worker, fn, world_size: int = 2):
    """Run the learner's ``fn`` on real ranks through ``worker(rank, world_size, fn)``.

    Returns the ranks' results, or None after saying why (not attempted yet, or which rank
    failed and how), in which case the caller goes on with its reference solution.
    """
    from .errors import WorkerError
    from .launcher import launch
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


# --------------------------------------------------------------------------- lab 00
register(Exercise(
    name="ring_allreduce_bytes",
    reference=metrics.ring_allreduce_bytes_per_rank,
    cases=[(s, n) for s in (4, 1_000_000, 64 * 2**20) for n in (1, 2, 3, 4, 8)],
    hint="a ring all-reduce is a reduce-scatter then an all-gather; in each, a rank "
         "passes on n-1 of the n chunks, each 1/n of the message. With one rank nothing "
         "moves.",
))


# --------------------------------------------------------------------------- lab 01
def _mlp_activation_bytes(sizes, batch_size):
    # every Linear output, and the ReLU output after each hidden Linear, in float32
    return 4 * batch_size * (sum(sizes[1:]) + sum(sizes[1:-1]))


register(Exercise(
    name="mlp_activation_bytes",
    reference=_mlp_activation_bytes,
    cases=[((64, 256, 256, 128, 10), 64), ((64, 10), 1), ((8, 32, 8), 100), ((64, 512, 10), 7)],
    hint="count one output per layer: each Linear gives batch x out_features numbers, and "
         "each ReLU (after every Linear but the last) as many again; a float32 is 4 bytes.",
))


# --------------------------------------------------------------------------- lab 02
def check_split(bounds, costs, n_devices: int, names=None) -> float:
    """Say how balanced a learner's split is, compared with the best possible one.

    costs: measured time (or any cost) per layer. Returns the busiest-over-mean ratio.
    """
    from .splitting import balance, check_bounds, imbalance, stage_costs
    try:
        bounds = check_bounds(bounds, len(costs), n_devices)
    except ValueError as exc:
        print(f"[split] not a valid split: {exc}")
        return float("inf")
    ratio = imbalance(costs, bounds)
    best = balance(costs, n_devices)
    best_ratio = imbalance(costs, best)
    stages = stage_costs(costs, bounds)
    share = ", ".join(f"{s / sum(stages):.0%}" for s in stages)
    print(f"[split] {bounds}: the stages get {share} of the work; busiest / mean = {ratio:.2f}")
    if ratio <= best_ratio * 1.02:
        print(f"[split] as balanced as it gets (the best split, {best}, has {best_ratio:.2f}).")
    else:
        where = f" (cut before {', '.join(names[b] for b in best)})" if names else ""
        print(f"[split] the best split is {best}{where} with {best_ratio:.2f}: "
              f"look for the cut that brings the biggest stage closest to 1/{n_devices} of the total.")
    return ratio


# --------------------------------------------------------------------------- lab 04
def check_schedule(fn, cases=((2, 4), (3, 5), (4, 8))):
    """Check a learner's 1F1B schedule builder ``fn(stages, micro_batches)``.

    It must be valid and deadlock-free, and each stage s may hold at most p - s
    micro-batches at once (the memory bound that distinguishes 1F1B from GPipe).
    Returns the function to use next.
    """
    from .schedules import check, one_f_one_b, peak_in_flight
    for stages, micro_batches in cases:
        try:
            schedule = fn(stages, micro_batches)
        except NotImplementedError:
            print("[1f1b] not attempted yet: the lab goes on with the reference schedule.")
            return one_f_one_b
        try:
            check(schedule, stages, micro_batches)
        except ValueError as exc:
            print(f"[1f1b] for {stages} stages and {micro_batches} micro-batches: {exc}\n"
                  "The lab goes on with the reference schedule.")
            return one_f_one_b
        peaks = peak_in_flight(schedule)
        bound = [min(stages - s, micro_batches) for s in range(stages)]
        if any(p > b for p, b in zip(peaks, bound)):
            print(f"[1f1b] valid and deadlock-free for {stages} stages and {micro_batches} "
                  f"micro-batches, but the stages hold {peaks} micro-batches at once; 1F1B "
                  f"holds at most {bound}. Start each backward as soon as it is possible.\n"
                  "The lab goes on with the reference schedule.")
            return one_f_one_b
    print(f"[1f1b] correct: valid, deadlock-free and within 1F1B's memory bound on {len(cases)} cases.")
    return fn


# --------------------------------------------------------------------------- student copy
_SOLUTION = re.compile(r"^([ \t]*)# BEGIN SOLUTION[^\n]*\n.*?^[ \t]*# END SOLUTION[^\n]*$",
                       re.S | re.M)


def strip_solutions(source: str) -> str:
    """Replace each marked solution with a ``raise NotImplementedError`` at its indent."""
    return _SOLUTION.sub(
        lambda m: f'{m.group(1)}raise NotImplementedError("your code here")', source)


def student_copy(src: str | Path = "labs", dst: str | Path = "student") -> list[Path]:
    """Copy every notebook in ``src`` to ``dst`` without solutions or outputs."""
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise FileNotFoundError(f"no folder {src} to copy labs from")
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for nb_path in sorted(src.glob("*.ipynb")):
        nb = json.loads(nb_path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = strip_solutions(text)
            cell["outputs"], cell["execution_count"] = [], None
        out = dst / nb_path.name
        out.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        written.append(out)
    return written
