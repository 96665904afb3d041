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


def _collective_wait(compute_s):
    # a collective ends for nobody before its last member arrives (all start together)
    slowest = max(compute_s)
    return [slowest - c for c in compute_s]


register(Exercise(
    name="collective_wait",
    reference=_collective_wait,
    cases=[([1.0, 2.0, 3.0, 4.0],), ([5.0],), ([0.2, 0.2],), ([3.0, 1.0, 2.0],),
           ([0.004, 0.009, 0.013, 0.018],)],
    hint="every rank starts its computation at the same moment and then joins the same "
         "all-reduce, which cannot start moving data before every rank has joined. Who "
         "joins last, and how long has each of the others been there by then?",
    close=lambda got, want: len(got) == len(want) and all(
        math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-12) for g, w in zip(got, want)),
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

OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}   # tensors kept per parameter


def _training_state_bytes(sizes, optimizer):
    params = sum(i * o + o for i, o in zip(sizes[:-1], sizes[1:]))   # weights + biases
    return 4 * params * (2 + OPTIMIZER_SLOTS[optimizer])              # + gradients + slots


register(Exercise(
    name="training_state_bytes",
    reference=_training_state_bytes,
    cases=[((64, 256, 256, 128, 10), "adam"), ((64, 256, 256, 128, 10), "sgd"),
           ((64, 10), "momentum"), ((8, 32, 8), "adam"), ((3, 5, 7, 2), "sgd")],
    hint="a Linear(i, o) has a weight of i x o numbers and a bias of o. Training keeps the "
         "parameters, one gradient per parameter, and whatever the optimizer keeps per "
         "parameter: plain SGD nothing, SGD with momentum one running average, Adam two. "
         "A float32 is 4 bytes.",
))


# --------------------------------------------------------------------------- lab 02
def check_split(bounds, costs, n_devices: int, names=None) -> float:
    """Say how balanced a learner's split is, and which stage to lighten if it is not.

    bounds: the cut points, or a function returning them (an unfilled one raising
    ``NotImplementedError`` makes the lab go on with the best split, and it says so).
    costs: measured time (or any cost) per layer. Returns the busiest-over-mean ratio.
    The best split is never shown: only how far from the best ratio the learner is, and
    which stage carries too much.
    """
    from .splitting import balance, check_bounds, imbalance, stage_costs
    best = balance(costs, n_devices)
    best_ratio = imbalance(costs, best)
    if callable(bounds):
        try:
            bounds = bounds()
        except NotImplementedError:
            print(f"[split] not attempted yet: the lab goes on with the split by measured time "
                  f"(busiest / mean = {best_ratio:.2f}). Fill in your cut points and run this "
                  "cell again.")
            return best_ratio
    try:
        bounds = check_bounds(bounds, len(costs), n_devices)
    except ValueError as exc:
        print(f"[split] not a valid split: {exc}")
        return float("inf")
    ratio = imbalance(costs, bounds)
    stages = stage_costs(costs, bounds)
    share = ", ".join(f"{s / sum(stages):.0%}" for s in stages)
    print(f"[split] {bounds}: the stages get {share} of the work; busiest / mean = {ratio:.2f}")
    if ratio <= best_ratio * 1.02:
        print(f"[split] correct: as balanced as a split into {n_devices} contiguous stages of "
              "these layers can be.")
    else:
        edges = [0, *bounds, len(costs)]
        k = max(range(len(stages)), key=lambda i: stages[i])
        layers = (f"layers {names[edges[k]]} .. {names[edges[k + 1] - 1]}" if names
                  else f"layers {edges[k]} .. {edges[k + 1] - 1}")
        print(f"[split] not yet the best: stage {k} ({layers}) carries {stages[k] / sum(stages):.0%} "
              f"of the work, where 1/{n_devices} would be {1 / n_devices:.0%}. A better split "
              f"reaches busiest / mean = {best_ratio:.2f}. Move a cut next to stage {k} so that "
              "a neighbour takes some of its layers, and compare the measured times again.")
    return ratio


def _split_bytes_per_step(batch_size, cut_widths):
    # every cut: the activation goes forward and its gradient (same shape) comes back
    return sum(2 * 4 * batch_size * w for w in cut_widths)


register(Exercise(
    name="split_bytes_per_step",
    reference=_split_bytes_per_step,
    cases=[(64, [256]), (64, [128]), (32, [256, 128]), (1, [10]), (100, [64, 64, 64]), (8, [])],
    hint="at a cut, the first device hands on the activation it computed: batch x width "
         "float32 numbers (4 bytes each). Think about the backward pass too: what must come "
         "back across the same cut, and how big is it?",
))


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


def _column_row_bytes(sizes, batch_size, world_size):
    from .torch.tensor_parallel import expected_comm_bytes
    return expected_comm_bytes(sizes, batch_size, world_size, "column_row")["total"]


register(Exercise(
    name="column_row_bytes",
    reference=_column_row_bytes,
    cases=[((64, 256, 256, 128, 10), 64, 2), ((64, 256, 256, 128, 10), 64, 4),
           ((64, 10, 10), 32, 2), ((16, 8, 8, 8, 8, 4, 4), 5, 2), ((32, 64, 32), 100, 8)],
    hint="layers go in pairs (column-parallel, then row-parallel). Forward: one all-reduce "
         "per pair, of the pair's output. Backward: one all-reduce per pair, of the gradient "
         "of the pair's input, except where no gradient is needed at all. Count each rank's "
         "buffer (batch x width float32 numbers): does an all-reduce's buffer shrink with "
         "the number of ranks?",
))


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


def _pipeline_step_time(stages, micro_batches, forward_s, backward_s):
    from .schedules import one_f_one_b, simulate
    return simulate(one_f_one_b(stages, micro_batches), stages, micro_batches,
                    forward_s, backward_s).duration


register(Exercise(
    name="pipeline_step_time",
    reference=_pipeline_step_time,
    cases=[(2, 4, 1.0, 2.0), (2, 1, 1.0, 2.0), (4, 8, 0.5, 1.0), (3, 5, 0.3, 0.7),
           (1, 6, 1.0, 2.0), (4, 3, 2.0, 1.0)],
    hint="follow micro-batch 0's forward down the stages and the last micro-batch's "
         "backward back up: how many forward-and-backward slots does the step last? "
         "Equal stages, free messages: every stage does m forwards and m backwards, and "
         "the pipeline needs time to fill and to drain.",
    close=lambda got, want: math.isclose(got, want, rel_tol=1e-6),
))


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


def _ring_chunk(position, step, world_size, phase):
    # as parlab.torch.data_parallel.ring_all_reduce: position r of n, step k
    if phase == "reduce-scatter":
        return (position - step) % world_size
    return (position + 1 - step) % world_size


register(Exercise(
    name="ring_chunk",
    reference=_ring_chunk,
    cases=[(r, k, n, ph) for n in (2, 3, 4, 5) for ph in ("reduce-scatter", "all-gather")
           for r in range(n) for k in range(n - 1)],
    hint="in the reduce-scatter, position r starts by sending its own chunk r, and each step "
         "it sends on the chunk it has just added to. After n-1 steps position r holds the "
         "finished sum of one chunk (which one?): the all-gather starts by sending that one, "
         "and then sends on whatever finished chunk just arrived.",
))


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
            step = shard - before
            where = f"with lr 0.1 and staleness {staleness}"
            if torch.allclose(step, 0.1 * grad, atol=1e-6):
                return (f"{where}, the parameters moved along the gradient, uphill: the loss "
                        "would grow. Gradient descent goes the other way.")
            scale = float((step @ -grad) / (grad @ grad))
            if torch.allclose(step, -scale * grad, atol=1e-6):
                return (f"{where}, the parameters moved the right way, but by {scale:.3g} times "
                        "the gradient: how far should one step go? (Plain SGD does not use "
                        "the staleness.)")
            return (f"{where}, the parameters did not move against their gradient: each "
                    "number of `shard` should move against its own number of `grad`.")
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


def _push_staleness(events):
    # an asynchronous server: every push is applied at once (one more version); a pull
    # reads the current version; a push's staleness is the updates since its worker read
    version, read, out = 0, {}, []
    for action, worker in events:
        if action == "pull":
            read[worker] = version
        else:
            out.append(version - read[worker])
            version += 1
    return out


register(Exercise(
    name="push_staleness",
    reference=_push_staleness,
    cases=[([("pull", 1), ("pull", 2), ("push", 1), ("pull", 1), ("push", 2), ("pull", 2)],),
           ([("pull", 1), ("push", 1), ("pull", 1), ("push", 1)],),
           ([("pull", 1), ("pull", 2), ("pull", 3), ("push", 3), ("pull", 3), ("push", 3),
             ("push", 1), ("push", 2)],),
           ([("pull", 2), ("pull", 1), ("push", 1), ("pull", 1), ("push", 1), ("pull", 1),
             ("push", 1), ("pull", 1), ("push", 2), ("pull", 2)],)],
    hint="keep a version number that the server increases with every gradient it applies, "
         "and remember which version each worker last read. A worker's own earlier pushes "
         "do not make its next gradient stale if it pulled after them.",
    close=lambda got, want: list(got) == list(want),
))


# --------------------------------------------------------------------------- lab 07
MESH_CASES = ({"dp": 2, "tp": 2}, {"dp": 3, "tp": 2}, {"dp": 2, "pp": 2, "tp": 2},
              {"dp": 2, "pp": 3, "tp": 2})


def mesh_groups_reference(shape: dict) -> dict:
    """Every line of the mesh along each axis: ``parlab.grid.Grid(**shape).lines(axis)``."""
    from .grid import Grid
    grid = Grid(**shape)
    return {a: grid.lines(a) for a in grid.axes}


def _as_groups(groups):
    return [[int(r) for r in g] for g in groups]


def _mesh_problems(groups: dict, shape: dict) -> list[str]:
    """What is wrong with a learner's groups for one mesh shape, in words (none: [])."""
    from .grid import Grid
    grid = Grid(**shape)
    world, want = grid.world_size, mesh_groups_reference(shape)
    name = grid.describe()
    if not isinstance(groups, dict) or set(groups) != set(grid.axes):
        got = sorted(groups) if isinstance(groups, dict) else type(groups).__name__
        return [f"for {name}: return a dict with one list of groups per axis "
                f"{list(grid.axes)}; got {got}"]
    problems = []
    for axis in grid.axes:
        try:
            mine = _as_groups(groups[axis])
        except (TypeError, ValueError):
            problems.append(f"for {name}: {axis} must be a list of groups, each a list of "
                            f"ranks, e.g. {want[axis][0]}")
            continue
        if sorted(map(sorted, mine)) == sorted(map(sorted, want[axis])):
            unordered = [g for g in mine if g != sorted(g)]
            if unordered:
                problems.append(
                    f"for {name}: the {axis} group {unordered[0]} holds the right ranks in the "
                    f"wrong order: position i of a line is coordinate i along {axis} (a "
                    f"pipeline's stage i, a slice's index), so list it as {sorted(unordered[0])}")
            continue
        flat = [r for g in mine for r in g]
        outside = sorted({r for r in flat if not 0 <= r < world})
        missing = sorted(set(range(world)) - set(flat))
        twice = sorted({r for r in flat if flat.count(r) > 1})
        sizes = sorted({len(g) for g in mine})
        if outside:
            problems.append(f"for {name}: ranks {outside} do not exist; the mesh has ranks "
                            f"0 .. {world - 1}")
        elif missing or twice:
            what = [f"{missing} in no group" if missing else "",
                    f"{twice} in more than one" if twice else ""]
            problems.append(f"for {name}: the {axis} groups must share out all {world} ranks, "
                            f"each in exactly one group; yours have "
                            f"{' and '.join(w for w in what if w)}")
        elif sizes != [grid.shape[axis]]:
            problems.append(f"for {name}: each {axis} group has {axis} = {grid.shape[axis]} "
                            f"ranks, one per coordinate along {axis}; yours have {sizes}")
        else:
            same_as = [o for o in grid.axes if o != axis
                       and sorted(map(sorted, mine)) == sorted(map(sorted, want[o]))]
            if same_as:
                last = grid.axes[-1]
                problems.append(
                    f"for {name}: your {axis} groups are the {same_as[0]} groups: the last axis "
                    f"({last}) varies fastest, so neighbouring ranks differ in {last} "
                    f"(stride 1), and each axis before it strides over all the axes after it. "
                    f"The {axis} groups are {want[axis]}")
            else:
                problems.append(f"for {name}: {mine} are not lines along {axis}: a line varies "
                                f"the {axis} coordinate and keeps every other; expected "
                                f"{want[axis]}")
    return problems


def _mesh_group_ranks(rank: int, world_size: int, groups: dict) -> dict:
    """On each rank: build the learner's groups as process groups, all-reduce the rank."""
    import torch
    import torch.distributed as dist

    from .torch import comm
    sums = {}
    for axis, lines in groups.items():
        mine = None
        for line in lines:              # collective: every rank builds every group, in order
            pg = dist.new_group(line)
            if rank in line:
                mine = (line, pg)
        x = torch.tensor([float(rank)])
        comm.all_reduce(x, group=mine[1], name=f"{axis} all_reduce")
        sums[axis] = {"group": mine[0], "sum": float(x)}
    return sums


def check_mesh_groups(fn, cases=MESH_CASES):
    """Check a learner's ``fn(shape) -> {axis: [[ranks], ...]}`` against ``parlab.grid``.

    First the arithmetic, for every shape of ``cases`` (2-D and 3-D meshes), in words.
    Then the first shape's groups are built as process groups on real ranks (when they
    share out the ranks), and an all-reduce of each rank's number on each group is
    compared with the sum over the rank's true line. Returns the function to use next.
    """
    from .grid import Grid
    problems, wrong_shapes = [], []
    for shape in cases:
        try:
            groups = fn(dict(shape))
        except NotImplementedError:
            print("[mesh_groups] not attempted yet: the lab goes on with the reference "
                  "(parlab.grid). Fill in the function and run this cell again.")
            return mesh_groups_reference
        except Exception as exc:  # noqa: BLE001 - reported to the learner in words
            found = [f"for {Grid(**shape).describe()}: {type(exc).__name__}: {exc}"]
        else:
            found = _mesh_problems(groups, shape)
        if found and not problems:
            problems = found                    # the first wrong mesh, every axis of it
        elif found:
            wrong_shapes.append(Grid(**shape).describe())
    if wrong_shapes:
        problems.append(f"also wrong for {', '.join(wrong_shapes)}")
    first, grid = cases[0], Grid(**cases[0])
    want = mesh_groups_reference(first)
    try:
        groups = {a: _as_groups(g) for a, g in fn(dict(first)).items()}
        runnable = all(sorted(r for g in groups[a] for r in g) == list(grid)
                       for a in grid.axes)
        same_sets = all(sorted(map(sorted, groups[a])) == sorted(map(sorted, want[a]))
                        for a in grid.axes)
    except Exception:  # noqa: BLE001 - already reported above
        runnable = same_sets = False
    if runnable and same_sets and problems:
        pass        # only the order within a group is wrong: sums cannot show that
    elif runnable:
        from .launcher import launch
        results = launch(_mesh_group_ranks, grid.world_size, args=(groups,), timeout=60).results
        for axis in grid.axes:        # the first rank whose sum is wrong, per axis
            for rank, res in enumerate(results):
                line = grid.line(rank, axis)
                if res[axis]["sum"] != sum(line):
                    problems.append(
                        f"on real ranks ({grid.describe()}): rank {rank}'s {axis} all-reduce "
                        f"summed ranks {res[axis]['group']} = {res[axis]['sum']:.0f}; its {axis} "
                        f"line {line} gives {sum(line)}")
                    break
    else:
        problems.append(f"not run on real ranks: the groups for {grid.describe()} do not share "
                        "out the ranks, so they cannot all be built")
    if problems:
        shown = "\n  ".join(problems)
        print(f"[mesh_groups] not yet right:\n  {shown}\n"
              "The lab goes on with the reference (parlab.grid).")
        return mesh_groups_reference
    print(f"[mesh_groups] correct for {len(cases)} meshes, "
          f"{', '.join(Grid(**c).describe() for c in cases)}; on {grid.world_size} real ranks "
          f"every all-reduce on your {grid.describe()} groups summed its rank's true line.")
    return fn


def _allreduce_seconds(nbytes, n, latency_s, bandwidth_Bps):
    from .sim import Link, all_reduce_s
    return all_reduce_s(nbytes, n, Link(latency_s, bandwidth_Bps))


register(Exercise(
    name="allreduce_seconds",
    reference=_allreduce_seconds,
    cases=[(s, n, a, b) for s in (4, 2**20, 2**30) for n in (1, 2, 4, 8)
           for a, b in ((5e-6, 25e9), (50e-6, 1.5e9))],
    hint="a ring all-reduce is a reduce-scatter then an all-gather. In each phase every rank "
         "sends n-1 messages in turn, each a chunk of 1/n of the buffer, and every message "
         "pays the link's latency once before its bytes flow at its bandwidth. One rank has "
         "nobody to talk to.",
))


# --------------------------------------------------------------------------- lab 08
def _zero_device_bytes(params, devices, stage):
    from .zero_memory import per_device_bytes
    return per_device_bytes(params, devices, stage)["total"]


register(Exercise(
    name="zero_device_bytes",
    reference=_zero_device_bytes,
    cases=[(p, n, s) for p in (1_000, 116_618, 1_500_000_000) for n in (1, 4, 64)
           for s in (0, 1, 2, 3)],
    hint="in float32 with Adam, each parameter costs 4 bytes of weight, 4 of gradient and 8 "
         "of optimizer state (two moments) on a plain data-parallel device. Stage 1 shares "
         "out one of the three parts over the devices, stage 2 two, stage 3 all three: which "
         "part goes first, and which last?",
    close=lambda got, want: math.isclose(got, want, rel_tol=1e-9),
))


def _zero2_problem_data(n: int, rank: int):
    import torch
    gen = torch.Generator().manual_seed(8)
    params = torch.randn(6 * n, generator=gen)
    grads = torch.randn(n, 6 * n, generator=gen)          # row r: rank r's gradient
    return params, grads, grads[rank].clone()


def _zero2_ranks(rank: int, world_size: int, fn) -> dict:
    """Run the learner's step twice: on the real parameters, and with every shard but
    this rank's replaced by NaN (a correct step never reads them)."""
    import torch

    from .trace import COMM, recorder
    params, _, grad = _zero2_problem_data(world_size, rank)
    rec = recorder()
    before = len(rec.spans())
    fn(params, grad.clone(), 0.1)
    ops = [s.name for s in rec.spans()[before:] if s.kind == COMM]
    s = params.numel() // world_size
    fresh, _, _ = _zero2_problem_data(world_size, rank)
    poisoned = torch.full_like(fresh, float("nan"))
    poisoned[rank * s:(rank + 1) * s] = fresh[rank * s:(rank + 1) * s]
    fn(poisoned, grad.clone(), 0.1)
    return {"params": params.numpy().copy(), "poisoned": poisoned.numpy().copy(), "ops": ops}


def _zero2_problem(results, world_size: int) -> str | None:
    import numpy as np
    params, grads, _ = _zero2_problem_data(world_size, 0)
    want = (params - 0.1 * grads.mean(0)).numpy()
    unscaled = (params - 0.1 * grads.sum(0)).numpy()
    ops = results[0]["ops"]
    if not ops:
        return ("no traced collective was called: use parlab.torch.comm's reduce_scatter and "
                "all_gather (torch.distributed's own calls are not seen by the check).")
    if not any("reduce_scatter" in op for op in ops):
        if any("all_reduce" in op for op in ops):
            return ("you used an all-reduce: every rank then receives the whole averaged "
                    "gradient. ZeRO-2 reduce-scatters it, so each rank receives (and keeps) "
                    "only its shard's.")
        return "no reduce-scatter was called: the ranks' gradients were never combined."
    if not any("all_gather" in op for op in ops):
        return ("no all-gather was called: each rank updated its shard, but the others never "
                "receive it.")
    got = [r["params"] for r in results]
    if any(not np.allclose(g, got[0], atol=1e-6) for g in got):
        return "the ranks end with different parameters: all-gather the updated shards."
    if np.allclose(got[0], unscaled, atol=1e-5) and not np.allclose(got[0], want, atol=1e-5):
        ratio = world_size
        return (f"the step is {ratio} times too large: a reduce-scatter sums the ranks' "
                "gradients; the average divides by the number of ranks.")
    start = params.numpy()
    if np.allclose(got[0], start, atol=1e-7):
        return ("the parameters did not change: update flat_params in place (copy_ or -=), "
                "do not rebind the name to a new tensor.")
    step, want_step = got[0] - start, want - start
    if np.allclose(step, want_step / world_size, atol=1e-6):
        return (f"the step is {world_size} times too small: the average was divided by the "
                "number of ranks twice.")
    if np.allclose(step, -want_step, atol=1e-6):
        return "the step goes uphill: subtract lr times the gradient."
    if not np.allclose(got[0], want, atol=1e-5):
        return ("the parameters after your step differ from plain SGD on the averaged "
                "gradient: does each rank update its own chunk, chunk(n)[get_rank(group)]?")
    if any(not np.allclose(r["poisoned"], want, atol=1e-5) for r in results):
        return ("the result is right, but each rank used the parameters of shards it does not "
                "own (they were replaced by NaN in a second run): update only your own shard "
                "and let the all-gather bring the others.")
    return None


def check_zero2_step(fn, world_size: int = 4):
    """Run the learner's ZeRO-2 step ``fn(flat_params, flat_grad, lr, group=None)`` on real
    ranks; say what is wrong (the collectives used, the scale, the ranks' agreement, whether
    a rank touched shards it does not own). Returns the step to use next."""
    import torch

    from .torch.zero import zero2_step
    try:                     # an unfilled exercise is found without starting any rank
        fn(torch.zeros(world_size), torch.zeros(world_size), 0.1)
    except NotImplementedError:
        print("[zero2_step] not attempted yet: the lab goes on with the reference solution.")
        return zero2_step
    except Exception:  # noqa: BLE001 - it needs the ranks: run it there
        pass
    results = run_on_ranks("zero2_step", _zero2_ranks, fn, world_size)
    if results is None:
        return zero2_step
    problem = _zero2_problem(results, world_size)
    if problem:
        print(f"[zero2_step] not yet right: {problem}\nThe lab goes on with the reference.")
        return zero2_step
    print(f"[zero2_step] correct: on {world_size} real ranks your step equals SGD on the "
          f"averaged gradient, with a reduce-scatter and an all-gather "
          f"({', '.join(results[0]['ops'])}), and each rank read only its own shard.")
    return fn


# --------------------------------------------------------------------------- student copy
_SOLUTION = re.compile(r"^([ \t]*)# BEGIN SOLUTION[^\n]*\n.*?^[ \t]*# END SOLUTION[^\n]*$",
                       re.S | re.M)


def strip_solutions(source: str) -> str:
    """Replace each marked solution with a ``raise NotImplementedError`` at its indent."""
    return _SOLUTION.sub(
        lambda m: f'{m.group(1)}raise NotImplementedError("your code here")', source)


def student_copy(src: str | Path = "labs", dst: str | Path = "student", *,
                 force: bool = False) -> list[Path]:
    """Copy every notebook in ``src`` to ``dst`` without solutions or outputs (the notebooks
    written); see ``parlab.student.student_copy``, which refuses a copy onto the labs."""
    from .student import student_copy as copy
    return copy(src, dst, force=force)[0]
