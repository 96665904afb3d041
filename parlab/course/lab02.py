"""Lab 02 (labs/02_manual_split.ipynb): what its notebook runs (the MLP split, the
convolution splits), its exercises (a split's balance, the bytes it sends), its lessons."""
from __future__ import annotations

from ..launcher import launch
from ..split import SplitConfig
from . import lessons, replays
from .exercise import Exercise, check, register, whose  # noqa: F401 (labNN.check, labNN.whose)
from .replays import replayed  # noqa: F401 (lab02.replayed: a run on dedicated devices)

# the lab's two models: the MLP split after module 3, and the convolutions to balance
MLP = SplitConfig(sizes=(64, 256, 256, 128, 10), bounds=[4], batch_size=64, steps=150,
                  optimizer="adam", lr=1e-3)
CONV = SplitConfig(model="conv_stack", width=32, batch_size=64, steps=30)
BY_PARAMS, BY_TIME = "split by parameters", "split by measured time"


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


# ------------------------------------------------------------------ what the lab runs
def conv_layer_times(model, cfg: SplitConfig, passes: int = 5) -> list[float]:
    """Forward + backward seconds of each layer of ``model`` on one thread (like one
    simulated device), on a batch of ``cfg``'s shape: the median of ``passes`` passes over
    all the layers, so that a burst of other work stretches one pass, not every sample
    of one layer."""
    import numpy as np
    import torch

    from ..torch import split
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.zeros(split.input_shape(cfg))
        return [float(t) for t in np.median([split.layer_times(model, x)
                                             for _ in range(passes)], axis=0)]
    finally:
        torch.set_num_threads(threads)


def compute_per_step(timeline, skip: int = 2) -> list[float]:
    """Each rank's compute seconds in a step (waiting for a core not counted): the median
    over the steps after the first ``skip``. A rank's step runs from its ``forward``
    span to its next one."""
    return per_step(timeline, "compute", skip)


def per_step(timeline, kind: str, skip: int = 2) -> list[float]:
    """Each rank's seconds of ``kind`` (compute, comm, wait, core_wait) in a step: the
    median over the steps after the first ``skip``, a rank's step running from its
    ``forward`` span to its next one."""
    import bisect
    import statistics
    out = []
    for r in timeline.ranks:
        starts = sorted(s.start for s in timeline.spans if s.rank == r and s.name == "forward")
        steps = [0.0] * len(starts)
        for s in timeline.spans:
            if s.rank == r and s.kind == kind:
                k = bisect.bisect_right(starts, s.start) - 1
                if k >= 0:
                    steps[k] += s.duration
        out.append(statistics.median(steps[skip:] or steps or [0.0]))
    return out


def balance_runs(model, times, devices=None, cfg: SplitConfig = CONV) -> dict:
    """``cfg``'s model on 2 ranks, split by parameters and by the measured ``times``:
    {label: (bounds, compute per step of each rank, LaunchResult, its replay)}; the
    compute per step is read from the replay (each span's time on a core)."""
    from dataclasses import replace

    from ..hardware import devices as find_devices
    from ..torch import split
    devices = devices or find_devices(2)
    out = {}
    for label, bounds in ((BY_PARAMS, split.split_by_params(model, 2)),
                          (BY_TIME, split.balance(times, 2))):
        res = launch(split.train_split, 2, kwargs=dict(cfg=replace(cfg, bounds=bounds)),
                     devices=devices)
        rp = replays.replayed(res)
        out[label] = (bounds, compute_per_step(rp), res, rp)
    return out


# ------------------------------------------------------------------ lessons
def _overlaps(timeline, names) -> str:
    """Where two ranks computed at once (spans called ``names``): the pair that did most."""
    lanes = {r: [s for s in timeline.spans if s.rank == r and s.kind == "compute"
                 and s.name in names] for r in timeline.ranks}
    pairs: dict[tuple, float] = {}
    for a in timeline.ranks:
        for b in (r for r in timeline.ranks if r > a):
            for x in lanes[a]:
                for y in lanes[b]:
                    both = min(x.end, y.end) - max(x.start, y.start)
                    if both > 0:
                        key = (x.name, a, y.name, b)
                        pairs[key] = pairs.get(key, 0.0) + both
    if not pairs:
        return ""
    (na, a, nb, b), secs = max(pairs.items(), key=lambda kv: kv[1])
    return f"{na} on rank {a} beside {nb} on rank {b} ({secs * 1e3:.1f} ms in all)"


def one_at_a_time_numbers(tl) -> dict:
    """What lesson 02.one_device_at_a_time reads from the MLP split's replay ``tl``: the
    share of the time any rank computes during which exactly one does, with and without
    the optimizer updates, and where two computed at once outside the updates."""
    def alone(timeline):
        conc = timeline.concurrency("compute")
        return conc.get(1, 0.0) / (sum(v for k, v in conc.items() if k >= 1) or 1.0)
    work = {s.name for s in tl.spans if s.kind == "compute" and s.name != "update"}
    return {"alone": alone(tl), "alone_outside_updates": alone(tl.filter(names=work)),
            "overlap": _overlaps(tl, work), "source": replays.source(tl)}


def step_numbers(split_tl, one_tl) -> dict:
    """What lesson 02.split_not_faster reads from the replays of the split (``split_tl``)
    and of one device (``one_tl``): their median warm steps, and the last stage's update
    (the one piece of work a split overlaps)."""
    import statistics

    from ..steps import step_seconds
    last = split_tl.ranks[-1]
    updates = [s.duration for s in split_tl.spans if s.rank == last and s.name == "update"]
    return {"split_step": step_seconds(split_tl, "forward"),
            "one_step": step_seconds(one_tl, "forward"),
            "update": statistics.median(updates[2:] or updates or [0.0]),
            "source": replays.source(split_tl)}


def _mlp_experiment() -> dict:
    from dataclasses import replace

    from ..hardware import devices
    from ..torch import split
    two = devices(2)
    run = replays.replayed(launch(split.train_split, 2, kwargs=dict(cfg=MLP), devices=two))
    one = replays.replayed(launch(split.train_split, 1, kwargs=dict(cfg=replace(MLP, bounds=[])),
                                  devices=two.like(1)))   # a GPU against CPU devices proves nothing
    return {**one_at_a_time_numbers(run), **step_numbers(run, one)}


@lessons.lesson("02.one_device_at_a_time",
                "in a manual split only one device computes at a time: outside the "
                "optimizer updates (which need no other stage's data), at least 95 % of the "
                "time any device computes has exactly one device computing",
                _mlp_experiment)
def one_device_at_a_time(m: dict):
    a = m["alone_outside_updates"]
    figures = (f"one device computing for {a:.1%} of the compute time outside the updates "
               f"({m['alone']:.1%} with the updates counted)")
    why = f"two devices computed at once for {1 - a:.1%} of it"
    if m["overlap"]:
        why += f", most of all {m['overlap']}"
    return a >= 0.95, figures, why


@lessons.lesson("02.split_not_faster",
                "a split step is no faster than one device's: the stages run one after "
                "another and only the last stage's update overlaps (the split's median step "
                "no shorter than one device's minus that update)",
                _mlp_experiment)
def split_not_faster(m: dict):
    ratio = m["split_step"] / m["one_step"]
    floor = m["one_step"] - m["update"]
    figures = (f"split step {m['split_step'] * 1e3:.2f} ms = {ratio:.2f}x one device's "
               f"{m['one_step'] * 1e3:.2f} ms (medians over warm steps)")
    why = (f"one device's step less the last stage's update ({m['update'] * 1e3:.2f} ms, the "
           f"overlapped work) is {floor * 1e3:.2f} ms; the rest of the split's step is the "
           "hand-overs between the stages")
    return m["split_step"] >= floor, figures, why


def _identical_layers(model, times):
    """The identical layers (same module, same input) that took the most time, and their
    measured times: a layer-time measurement is only as good as their agreement."""
    groups: dict[str, list[float]] = {}
    for m, t in zip(model, times):
        groups.setdefault(repr(m), []).append(t)
    same = [(name, ts) for name, ts in groups.items() if len(ts) > 1]
    if not same:
        return None
    name, ts = max(same, key=lambda g: sum(g[1]))
    return {"layer": name.split("(")[0], "times": ts}


def balance_numbers(times, runs: dict, model=None) -> dict:
    """What lesson 02.split_by_time_balances reads: per split (``balance_runs``' labels)
    the busiest-over-mean compute, predicted from the layer ``times`` and replayed (each
    rank's median step), and how far apart the times of ``model``'s identical layers
    were."""
    from ..split import imbalance
    first = next(iter(runs.values()))
    return {"predicted": {k: imbalance(times, r[0]) for k, r in runs.items()},
            "measured": {k: max(r[1]) / (sum(r[1]) / len(r[1])) for k, r in runs.items()},
            "identical": None if model is None else _identical_layers(model, times),
            "source": replays.source(first[3])}


def _balance_experiment() -> dict:
    from ..torch import split
    conv = split.build(CONV)
    times = conv_layer_times(conv, CONV)
    return balance_numbers(times, balance_runs(conv, times), conv)


@lessons.lesson("02.split_by_time_balances",
                "splitting by measured time balances the stages' compute better than "
                "splitting by parameters: the busiest stage over the mean, replayed, falls "
                "by at least half of what the layer times predict",
                _balance_experiment)
def split_by_time_balances(m: dict):
    p, got = m["predicted"], m["measured"]
    want, fell = p[BY_PARAMS] - p[BY_TIME], got[BY_PARAMS] - got[BY_TIME]
    figures = (f"busiest/mean compute {got[BY_PARAMS]:.2f} by parameters, {got[BY_TIME]:.2f} "
               f"by measured time (PREDICTED {p[BY_PARAMS]:.2f}, {p[BY_TIME]:.2f})")
    why = f"it fell by {fell:.2f} where the layer times predict {want:.2f}"
    same = m.get("identical")
    if same and max(same["times"]) > 1.25 * min(same["times"]):
        why += (f"; {len(same['times'])} identical {same['layer']} layers were timed "
                + ", ".join(f"{t * 1e3:.2f}" for t in same["times"]) + " ms")
    return want > 0 and fell >= want / 2, figures, why
