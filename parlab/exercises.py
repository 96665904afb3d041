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


# --------------------------------------------------------------------------- lab 03
def _row_parallel_ranks(rank: int, world_size: int, fn) -> dict:
    """On each rank: the learner's row-parallel forward on its slice, and the dense layer."""
    import torch
    from torch import nn
    torch.manual_seed(3)
    full = nn.Linear(12, 6)
    x = torch.randn(5, 12)
    part = 12 // world_size
    cols = slice(rank * part, (rank + 1) * part)
    with torch.no_grad():
        got = fn(x[:, cols].clone(), full.weight[:, cols].clone(), full.bias.clone())
        want = full(x)
    return {"got": None if got is None else torch.as_tensor(got).numpy(), "want": want.numpy(),
            "bias": full.bias.detach().numpy()}


def check_row_parallel(fn, world_size: int = 2):
    """Run the learner's row-parallel forward on real ranks and compare with a dense layer.

    Returns the function to use next: the learner's if right, else the reference.
    """
    import numpy as np

    from .torch.tensor_parallel import row_parallel_forward
    results = run_on_ranks("row_parallel", _row_parallel_ranks, fn, world_size)
    if results is None:
        return row_parallel_forward
    for r, res in enumerate(results):
        if res["got"] is None or res["got"].shape != res["want"].shape:
            shape = None if res["got"] is None else res["got"].shape
            print(f"[row_parallel] rank {r} returned shape {shape}, expected {res['want'].shape}: "
                  "each rank must return the full output (every unit), not a slice.")
            return row_parallel_forward
        err = float(np.abs(res["got"] - res["want"]).max())
        if err > 1e-5:
            bias_counted_n_times = np.allclose(res["got"] - res["want"],
                                               (world_size - 1) * res["bias"], atol=1e-5)
            hint = (f"It looks like the bias was added on every rank before the all-reduce, so "
                    f"it is counted {world_size} times." if bias_counted_n_times else "")
            print(f"[row_parallel] rank {r} is off by up to {err:.3g} from the dense layer. "
                  "Each rank's product is a partial sum over its inputs: all ranks' partial sums "
                  f"must be added (all-reduce) before the bias is added once. {hint}\n"
                  "The lab goes on with the reference solution.")
            return row_parallel_forward
    print(f"[row_parallel] correct: on {world_size} ranks, every rank's output equals the dense layer's.")
    return fn


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


# --------------------------------------------------------------------------- lab 05
def _tiny_problem():
    """A small MLP and batch, the same on every rank (the averaging exercise's test)."""
    import torch

    from .torch import models
    torch.manual_seed(0)
    net = models.mlp((16, 8, 4))
    return net, torch.randn(8, 16), torch.randint(0, 4, (8,))


def _average_ranks(rank: int, world_size: int, fn) -> dict:
    """On each rank: the gradient of its half of the batch, averaged by the learner's fn."""
    from torch import nn
    net, x, y = _tiny_problem()
    b = 8 // world_size
    nn.functional.cross_entropy(net(x[rank * b:(rank + 1) * b]), y[rank * b:(rank + 1) * b]).backward()
    fn(net)
    return {n: p.grad.numpy().copy() for n, p in net.named_parameters()}


def check_average_gradients(fn, world_size: int = 2):
    """Run the learner's gradient averaging on real ranks; compare with one device."""
    import numpy as np
    from torch import nn

    from .torch.data_parallel import average_gradients
    results = run_on_ranks("average_gradients", _average_ranks, fn, world_size)
    if results is None:
        return average_gradients
    net, x, y = _tiny_problem()
    nn.functional.cross_entropy(net(x), y).backward()
    for name, p in net.named_parameters():
        got = [r[name] for r in results]
        if any(not np.allclose(g, got[0], atol=1e-7) for g in got):
            print(f"[average_gradients] the ranks disagree on {name}: every rank must end with "
                  "the same gradient. The lab goes on with the reference.")
            return average_gradients
        if not np.allclose(got[0], p.grad.numpy(), atol=1e-6):
            ratio = float(np.median(got[0] / np.where(p.grad.numpy() == 0, np.nan, p.grad.numpy())))
            hint = (f" (yours is about {ratio:.2g}x the right one: a sum needs dividing by the "
                    "number of ranks)" if np.isfinite(ratio) else "")
            print(f"[average_gradients] {name} differs from the whole-batch gradient{hint}. "
                  "The lab goes on with the reference.")
            return average_gradients
    print(f"[average_gradients] correct: on {world_size} ranks the averaged gradients equal "
          "the whole batch's on one device.")
    return fn


# --------------------------------------------------------------------------- lab 06
def _rule_problem(fn) -> str | None:
    """What is wrong with an update rule on small known tensors (None: nothing)."""
    import torch
    torch.manual_seed(1)
    for staleness in (0, 3):
        shard, grad = torch.randn(12), torch.randn(12)
        before = shard.clone()
        out = fn(shard, grad.clone(), 0.1, staleness)
        want = before - 0.1 * grad
        if torch.equal(shard, before):
            if isinstance(out, torch.Tensor) and torch.allclose(out, want, atol=1e-6):
                return ("it returns the new parameters but leaves `shard` unchanged: the server "
                        "sends `shard` itself to the workers, so change it in place "
                        "(`shard -= ...` or `shard.sub_(...)`).")
            return "`shard` is unchanged after the call: apply the gradient to it, in place."
        if not torch.allclose(shard, want, atol=1e-6):
            hint = (" (the gradient was added: a descent step subtracts it)"
                    if torch.allclose(shard, before + 0.1 * grad, atol=1e-6) else "")
            return (f"with lr 0.1 and staleness {staleness}, `shard` should become "
                    f"shard - lr * grad, applied as the push arrives{hint}.")
    return None


def _train_with_rule(rank: int, world_size: int, rule, steps: int = 40) -> dict:
    from .torch.parameter_server import train_parameter_server
    return train_parameter_server(rank, world_size, mode="async", num_servers=1, model="mlp",
                                  global_batch=64, steps=steps, lr=0.2, update=rule)


def check_update_rule(fn, steps: int = 40):
    """Check the learner's asynchronous update rule, then train with it on real ranks.

    Returns the rule the rest of the lab uses: the learner's when it is right, otherwise
    ``sgd_update`` (and it says why).
    """
    import functools

    import numpy as np

    from .torch.parameter_server import accuracy, sgd_update
    try:
        problem = _rule_problem(fn)
    except NotImplementedError:
        print("[async_update] not attempted yet: the lab goes on with the reference rule.")
        return sgd_update
    except Exception as exc:  # noqa: BLE001 - reported to the learner in words
        problem = f"it raised {type(exc).__name__}: {exc}"
    if problem:
        print(f"[async_update] not yet right: {problem}\nThe lab goes on with the reference rule.")
        return sgd_update
    results = run_on_ranks("async_update", functools.partial(_train_with_rule, steps=steps), fn, 3)
    if results is None:
        return sgd_update
    applied = results[0]["applied"]
    first = np.mean([a["loss"] for a in applied[:10]])
    last = np.mean([a["loss"] for a in applied[-10:]])
    print(f"[async_update] correct. An asynchronous server with your rule applied "
          f"{len(applied)} pushes from 2 workers: loss {first:.2f} -> {last:.2f}, test accuracy "
          f"{accuracy(results):.0%}.")
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
