"""Lab 02 (labs/02_manual_split.ipynb): its exercises (a split's balance, the bytes it sends)."""
from __future__ import annotations

from .exercise import Exercise, check, register  # noqa: F401 (labNN.check)


def check_split(bounds, costs, n_devices: int, names=None) -> float:
    """Say how balanced a learner's split is, and which stage to lighten if it is not.

    bounds: the cut points, or a function returning them (an unfilled one raising
    ``NotImplementedError`` makes the lab go on with the best split, and it says so).
    costs: measured time (or any cost) per layer. Returns the busiest-over-mean ratio.
    The best split is never shown: only how far from the best ratio the learner is, and
    which stage carries too much.
    """
    from ..split import balance, check_bounds, imbalance, stage_costs
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
