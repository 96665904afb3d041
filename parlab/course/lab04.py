"""Lab 04 (labs/04_rnn_pipelining.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

import math

from ..launcher import LaunchResult, launch
from ..split import SplitConfig
from . import lessons
from .exercise import Exercise, check, fallback, register, whose  # noqa: F401 (labNN.check, labNN.whose)
from .explorer import (HERE, choice, cluster_choices, cluster_for, explorer,
                       refuse_unless_here, seconds_text, slider)


def run_pipeline(cfg, stages: int, micro_batches: int, schedule="1f1b", *,
                 timeout: float = 120.0, devices=None, pin_cores: bool = False) -> LaunchResult:
    """A micro-batch pipeline of ``stages`` ranks: validated first, then launched.

    schedule: "gpipe", "1f1b" or explicit per-stage lists of ("F" | "B", i). A batch
    that does not divide into the micro-batches, a schedule that deadlocks or more stages
    than layers are refused before any rank starts.
    """
    from ..torch import pipeline
    cfg, ops = pipeline.prepare(cfg, stages, micro_batches, schedule)
    return launch(pipeline.train_pipeline, stages, args=(cfg, micro_batches, ops),
                  timeout=timeout, devices=devices, pin_cores=pin_cores)


def check_schedule(fn, cases=((2, 4), (3, 5), (4, 8))):
    """Check a learner's 1F1B schedule builder ``fn(stages, micro_batches)``.

    It must be valid and deadlock-free, each stage s may hold at most p - s
    micro-batches at once (the memory bound that distinguishes 1F1B from GPipe), and a
    step must be as quick on paper as 1F1B's (F and B in turn, without the warm-up,
    meets the bound but does not pipeline).
    Returns the function to use next.
    """
    from ..pipeline import check as check_valid, one_f_one_b, peak_in_flight, simulate
    for stages, micro_batches in cases:
        try:
            schedule = fn(stages, micro_batches)
        except NotImplementedError:
            print("[1f1b] not attempted yet: the lab goes on with the reference schedule.")
            return fallback(one_f_one_b)
        try:
            check_valid(schedule, stages, micro_batches)
        except ValueError as exc:
            print(f"[1f1b] for {stages} stages and {micro_batches} micro-batches: {exc}\n"
                  "The lab goes on with the reference schedule.")
            return fallback(one_f_one_b)
        peaks = peak_in_flight(schedule)
        bound = [min(stages - s, micro_batches) for s in range(stages)]
        if any(p > b for p, b in zip(peaks, bound)):
            print(f"[1f1b] valid and deadlock-free for {stages} stages and {micro_batches} "
                  f"micro-batches, but the stages hold {peaks} micro-batches at once; 1F1B "
                  f"holds at most {bound}. Start each backward as soon as it is possible.\n"
                  "The lab goes on with the reference schedule.")
            return fallback(one_f_one_b)
        # within the bound is not enough: F_i, B_i in turn holds one micro-batch and
        # never overlaps the stages. On paper (F 1, B 2 time units), 1F1B's step is as
        # short as GPipe's; a schedule without the warm-up is longer.
        mine, ref = (simulate(s, stages, micro_batches, 1.0, 2.0).duration
                     for s in (schedule, one_f_one_b(stages, micro_batches)))
        if mine > ref + 1e-9:
            print(f"[1f1b] valid and within the memory bound for {stages} stages and "
                  f"{micro_batches} micro-batches, but a step takes {mine:g} time units on "
                  f"paper (forward 1, backward 2) where 1F1B takes {ref:g}: the stages wait "
                  "for each other. Begin stage s with p - s - 1 forward passes (the warm-up), "
                  "then alternate.\nThe lab goes on with the reference schedule.")
            return fallback(one_f_one_b)
    print(f"[1f1b] correct: valid, deadlock-free, within 1F1B's memory bound and as quick as "
          f"1F1B on {len(cases)} cases.")
    return fn


def typical_step(timeline, stages: int, micro_batches: int) -> tuple[float, float]:
    """(start, end) of the warm step (the first pays for start-up) nearest the median warm
    step: the step to draw, where the last one may be an outlier. Chosen by its F/B part;
    the window goes on to the end of the stages' updates that follow it (before the next
    step's first F), so a drawing of it shows every stage's whole step."""
    from ..torch.pipeline import step_windows
    windows = step_windows(timeline, stages, micro_batches)
    warm = windows[1:] or windows
    median = _median([b - a for a, b in warm])
    start, end = min(warm, key=lambda w: abs(w[1] - w[0] - median))
    later = [a for a, _ in windows if a > start]
    until = min(later) if later else float("inf")
    ends = [s.end for s in timeline if s.name == "update" and start <= s.start < until]
    return start, max([end, *ends])


def linear_bounds(bounds) -> list[int]:
    """The executor's cut (module indices; the MLP alternates Linear and ReLU) as the cost
    model's (Linear layer indices): a stage that ends with a Linear's ReLU holds that
    Linear, so module 7 (the ReLU after Linear 3) starts stage 1 at Linear 4."""
    return [(b + 1) // 2 for b in bounds]


def _pipeline_step_time(stages, micro_batches, forward_s, backward_s):
    from ..pipeline import one_f_one_b, simulate
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


def pipeline_explorer(cfg, here=None, costs=None):
    """Lab 04: choose p, m, a schedule, its chunks, tensor parallelism and a cluster: the
    PREDICTED step at once; one click measures it.

    cfg: the lab's pipeline (``SplitConfig``: an MLP and its batch). here, costs: this
    machine and the MLP's per-layer costs as the lab calibrated them (``sim.Measured``);
    without them only the GPU clusters are offered. The prediction is
    ``sim.pipeline``: GPipe and 1F1B cut where this lab's executor cuts
    (``pipeline.stage_bounds``), interleaved 1F1B with ``chunks`` model chunks per device
    balanced by cost; with tp > 1 (GPU clusters) every stage is also split over tp
    devices (``sim.hybrid``, Megatron-LM's pairs of layers). "measure it here" runs
    ``run_pipeline(cfg, p, m, schedule)`` on p ranks and draws its typical step
    (``typical_step``) next to the prediction for the same stages.
    """
    from .. import sim
    from ..metrics import pipeline_bubble
    net = sim.Network.mlp(cfg.sizes)

    def predicted(p, m, schedule, cluster, bounds=None, chunks=2, tp=1):
        if tp > 1:
            if cluster == HERE:
                raise ValueError("this machine's calibration is for whole layers: choose a "
                                 "GPU cluster for tp > 1")
            return sim.hybrid(net, cluster_for(cluster, p * tp, here), cfg.batch_size, dp=1,
                              tp=tp, pp=p, micro_batches=m, schedule=schedule, chunks=chunks,
                              bounds=bounds)
        return sim.pipeline(net, cluster_for(cluster, p, here), cfg.batch_size, stages=p,
                            micro_batches=m, schedule=schedule, bounds=bounds, chunks=chunks,
                            costs=costs if cluster == HERE else None)

    cuts = {}

    def executor_cut(p):
        """The stages this lab's executor runs (``pipeline.stage_bounds``), as Linear indices."""
        if p not in cuts:
            from ..torch import pipeline
            cuts[p] = linear_bounds(pipeline.stage_bounds(cfg, p))
        return cuts[p]

    def predict(p, m, schedule, chunks, tp, cluster):
        # gpipe and 1f1b: the executor's own cut, as lab 04 predicts it and "measure it here"
        # runs it; interleaved (not run here): chunks per device, balanced by cost
        tl = predicted(p, m, schedule, cluster,
                       executor_cut(p) if schedule in ("gpipe", "1f1b") else None, chunks, tp)
        lost = sum(tl.seconds_by_kind(r)["idle"] + tl.seconds_by_kind(r)["wait"]
                   for r in tl.ranks) / (len(tl.ranks) * tl.duration)
        if schedule == "interleaved":
            # Narayanan et al., 2021, section 2.2: the bubble is (p-1)/v slots against m
            formula = f"interleaved's (p-1)/v / (m + (p-1)/v) = {(p - 1) / chunks / (m + (p - 1) / chunks):.0%}"
        else:
            formula = f"GPipe's and 1F1B's (p-1)/(m+p-1) = {pipeline_bubble(p, m):.0%}"
        shape = f", tp = {tp}" if tp > 1 else ""
        chunk = f", v = {chunks}" if schedule == "interleaved" else ""
        return tl, (f"PREDICTED: one step {seconds_text(tl.step_s)}; the devices idle or wait "
                    f"{lost:.0%} of it (the bubble, {formula})"), \
            f"{schedule}, p = {p}{chunk}, m = {m}{shape}, {cluster_for(cluster, p * tp, here).name}"

    def measure(p, m, schedule, chunks, tp, cluster):
        from ..torch import pipeline
        refuse_unless_here(cluster, p)
        if schedule not in ("gpipe", "1f1b") or tp > 1:
            raise ValueError("this lab's executor runs gpipe and 1f1b on whole layers: choose "
                             "one of them, with tp = 1")
        res = run_pipeline(cfg, p, m, schedule)
        window = typical_step(res.timeline, p, m)
        bounds = linear_bounds(pipeline.prepare(cfg, p, m, schedule)[0].bounds)
        return res.timeline.window(*window), predicted(p, m, schedule, cluster, bounds)

    clusters = cluster_choices(here if costs is not None else None)
    controls = {"p": slider("stages p", range(1, 5), 2),
                "m": slider("micro-batches m", range(1, 9), 4),
                "schedule": choice("schedule", ["1f1b", "gpipe", "interleaved"]),
                "chunks": slider("chunks per device v (interleaved)", [2, 3, 4], 2),
                "tp": slider("tensor parallel tp (GPUs)", [1, 2, 4], 1),
                "cluster": choice("cluster", clusters)}
    return explorer(predict, controls, measure=measure)


# ------------------------------------------------------------------ lessons
# The notebook's two models: PIPE for time (16 hidden layers of 384, a batch of 840, which
# divides into any m from 1 to 8; 18 layers, enough for the explorer's 4 stages of 4
# interleaved chunks), LIGHT for memory (small: it is about counts, not time). PIPE was 32
# layers of 256: about the same arithmetic in twice as many operations, each
# micro-batch's work smaller against what every operation costs.
PIPE = SplitConfig(sizes=(64, *[384] * 16, 10), batch_size=840, steps=5, lr=0.01)
LIGHT = SplitConfig(sizes=(64, 64, 64, 64, 64, 10), batch_size=64, steps=1, lr=0.1)
MICRO_BATCHES = (1, 2, 4, 8)


def _median(xs) -> float:
    """The median, 0.0 for none (a stage without that phase)."""
    import statistics
    xs = list(xs)
    return float(statistics.median(xs)) if xs else 0.0


def bubble_runs(devices=None, micro_batches=MICRO_BATCHES, cfg: SplitConfig = PIPE,
                schedule: str = "1f1b") -> dict:
    """A pipeline of 2 stages taking its steps with each m in turn (m = 1, 2, 4, 8, then
    again, ``cfg.steps`` rounds; ``pipeline.train_pipeline_in_turn``), one launch:
    {m: LaunchResult whose timeline holds that m's steps only}.

    In turn, because one launch per m left each m to whatever else the machine ran in
    its own seconds: beside two busy loops, the quickest m against m = 1 ranged 0.86-1.42x
    over 20 runs, and lesson 04.micro_batches_pay showed 6 and 7 runs in 10 (in turn:
    9 and 10 in 10).
    Each stage is pinned to cores of its own: unpinned on 2 cores, a stage's threads
    and the other stage's sometimes land on one core, and at m = 8 the stages waited
    for a core up to 11 % of the step (pinned: 1-2 %), enough to push the measured
    bubble 9 points above the prediction in 2 runs of 10."""
    from ..hardware import devices as find_devices
    from ..torch import pipeline
    from ..trace import Timeline
    cfg, plan = pipeline.prepare_in_turn(cfg, 2, micro_batches, schedule)
    res = launch(pipeline.train_pipeline_in_turn, 2, args=(cfg, plan),
                 devices=devices or find_devices(2), pin_cores=True)
    tl = res.timeline
    steps = pipeline.steps_by_micro_batches(tl, 2, res.results[0]["order"])
    starts = sorted(a for windows in steps.values() for a, _ in windows)
    # each step from its first F to the next step's first F: its update and waits with it
    step_end = dict(zip(starts, [*starts[1:], tl.end]))
    return {m: LaunchResult(res.results, Timeline.merge(
                tl.window(a, step_end[a]) for a, _ in windows), res.devices, res.wall_time)
            for m, windows in steps.items()}


def _ops_of_step(window, stages: int, micro_batches: int) -> dict:
    """{"F": per stage, one time per micro-batch; "B": likewise} of one measured step: each
    F i or B i with the core wait carved out of it (``F3 (core wait)``), the time it held
    its stage, which is what the stage behind or before it waited for."""
    from ..pipeline import pass_of
    ops = {k: [[0.0] * micro_batches for _ in range(stages)] for k in "FB"}
    for s in window:
        op = pass_of(s.name.split(" (")[0])
        if s.rank < stages and op and op[1] < micro_batches:
            ops[op[0]][s.rank][op[1]] += s.duration
    return ops


def bubble_numbers(pipes: dict, stages: int = 2, schedule: str = "1f1b") -> dict:
    """What lessons 04.bubble_as_predicted and 04.micro_batches_pay read from
    ``bubble_runs``: per m, medians over the warm steps (the first pays for start-up) of
    the step and of the stages' wait + idle, core-wait and transfer shares of it; each
    stage's median F and B; and each warm step played on paper (``pipeline.simulate``,
    free messages) with the F and B of every micro-batch measured in that step: its
    length and idle share, the bubble the schedule makes of those times.

    Played with each stage's median F and B instead, the bubble at m = 8 came out 2-6
    points below wait + idle in 10 runs of 10 (3 of them beyond 5 points), with core
    waits and transfers 1-2 % each: micro-batches that are not equally fast leave the
    stage behind waiting for the slowest, which medians smooth away."""
    from .. import pipeline
    from ..pipeline import pass_kind
    from ..torch.pipeline import step_windows
    by_m = {}
    for m, res in pipes.items():
        order = pipeline.make(schedule, stages, m)
        tl = res.timeline
        per = {"step": [], "wait_idle": [], "core_wait": [], "comm": [], "predicted": [],
               "predicted_step": []}
        for a, b in step_windows(tl, stages, m)[1:]:
            window = tl.window(a, b)
            secs = [window.seconds_by_kind(r) for r in range(stages)]
            per["step"].append(b - a)
            for key, kinds in (("wait_idle", ("wait", "idle")), ("core_wait", ("core_wait",)),
                               ("comm", ("comm",))):
                per[key].append(sum(s[k] for s in secs for k in kinds) / (stages * (b - a)))
            ops = _ops_of_step(window, stages, m)
            paper = pipeline.simulate(order, stages, m, ops["F"], ops["B"])
            per["predicted"].append(pipeline.bubble_share(paper))
            per["predicted_step"].append(paper.duration)
        fb = {k: [_median(s.duration for s in tl if s.rank == r and pass_kind(s.name) == k)
                  for r in range(stages)] for k in "FB"}
        by_m[m] = {k: _median(v) for k, v in per.items()} | {
            "forward": fb["F"], "backward": fb["B"],
            "formula": (stages - 1) / (m + stages - 1),
            "work": m * sum(fb["F"]) + m * sum(fb["B"])}     # all stages' F and B of a step
    return {"stages": stages, "by_m": by_m}


def _bubble_experiment() -> dict:
    return bubble_numbers(bubble_runs())


@lessons.lesson("04.bubble_as_predicted",
                "in a micro-batch pipeline, the share of a step the stages spend neither "
                "computing nor transferring (wait + idle) is the bubble that the schedule "
                "makes of the F and B measured in that step (pipeline.simulate; "
                "(p-1)/(m+p-1) for equal stages): within 5 points of the step, for every m",
                _bubble_experiment)
def bubble_as_predicted(n: dict):
    rows = n["by_m"]
    figures = ("wait + idle against the schedule on paper: " + ", ".join(
        f"m = {m} {r['wait_idle']:.2f}/{r['predicted']:.2f}" for m, r in rows.items())
        + " (formula " + ", ".join(f"{r['formula']:.2f}" for r in rows.values()) + ")")
    gap = {m: r["wait_idle"] - r["predicted"] for m, r in rows.items()}
    off = [m for m in rows if abs(gap[m]) > 0.05]
    worst = max(rows, key=lambda m: abs(gap[m]))
    r, g = rows[worst], gap[worst]
    if r["core_wait"] >= abs(g) / 2:
        cause = "core contention"
    elif r["comm"] >= abs(g) / 2:
        cause = "the transfers"
    else:
        cause = "neither core waits nor transfers: the micro-batches' times varied"
    why = (f"m = {', '.join(map(str, off))} off by more than 5 points; at m = {worst} "
           f"{abs(g):.0%} of the step {'more' if g > 0 else 'less'} than predicted; {cause} "
           f"(the stages waited for a core {r['core_wait']:.0%} of the step and "
           f"transferred {r['comm']:.0%})")
    return not off, figures, why


# Measured, the quickest m against m = 1 (the m in turn, ``bubble_runs``): on the quiet
# 2-core machine 1.32-1.71x (12 runs); beside two busy loops 1.05-1.38x (28 runs, one of
# them 1.048x). Beside them the stages cannot have both cores at once: at m > 1 two
# stages and two loops share the 2 cores, at m = 1 one stage and two loops do, which caps
# the gain near 4/3 before the bubble and the costs of small micro-batches. The claim
# asks 1.05x.
MICRO_BATCH_GAIN = 1.05


@lessons.lesson("04.micro_batches_pay",
                "with p = 2 stages, splitting the batch into micro-batches shortens the "
                f"step: the quickest of m = 2, 4, 8 is at least {MICRO_BATCH_GAIN}x quicker "
                "than m = 1 "
                "(the bubble alone would allow 2m/(m+1), 1.8x at m = 8)",
                _bubble_experiment)
def micro_batches_pay(n: dict):
    rows = n["by_m"]
    one = rows[1]
    best = min((m for m in rows if m > 1), key=lambda m: rows[m]["step"])
    r = rows[best]
    gain = one["step"] / r["step"]
    figures = (f"m = 1 step {one['step'] * 1e3:.0f} ms, quickest m = {best} "
               f"{r['step'] * 1e3:.0f} ms: {lessons.beside(gain, MICRO_BATCH_GAIN)}x "
               f"(predicted from the measured F and B: "
               f"{one['predicted_step'] / r['predicted_step']:.2f}x)")
    why = [f"at m = {best} the stages waited for a core {r['core_wait']:.0%} of the step "
           f"(m = 1: {one['core_wait']:.0%})"]
    if r["core_wait"] - one["core_wait"] > 0.05:
        why[0] = "core contention: " + why[0]
    work = r["work"] / one["work"]
    why.append(f"a step's F and B took {work:.2f}x the time of m = 1's"
               + (" (smaller micro-batches used a core less well)" if work > 1.05 else
                  " (no dearer than m = 1's: not what held the step back)" if work <= 1.0
                  else ""))
    why.append(f"the stages transferred {r['comm']:.0%} of the step (m = 1: {one['comm']:.0%}; "
               f"{2 * best} hand-overs a step against 2)")
    why = "; ".join(why)
    return gain >= MICRO_BATCH_GAIN, figures, why


def memory_runs(devices=None, cfg: SplitConfig = LIGHT, stages: int = 4,
                micro_batches: int = 8) -> dict:
    """GPipe and 1F1B on ``stages`` ranks: {"gpipe": LaunchResult, "1f1b": LaunchResult}."""
    from ..hardware import devices as find_devices
    devices = devices or find_devices(stages)
    return {name: run_pipeline(cfg, stages, micro_batches, name, devices=devices)
            for name in ("gpipe", "1f1b")}


def memory_numbers(runs: dict, micro_batches: int = 8) -> dict:
    """What lesson 04.one_f_one_b_holds_less reads from ``memory_runs``: per schedule and
    stage, the most micro-batches held at once and their activation bytes (measured)."""
    return {"micro_batches": micro_batches,
            "held": {k: [r["peak_micro_batches"] for r in res.results] for k, res in runs.items()},
            "bytes": {k: [r["peak_activation_bytes"] for r in res.results]
                      for k, res in runs.items()}}


def _memory_experiment() -> dict:
    return memory_numbers(memory_runs())


@lessons.lesson("04.one_f_one_b_holds_less",
                "1F1B keeps the activations of at most p - s micro-batches on stage s, "
                "GPipe those of all m",
                _memory_experiment)
def one_f_one_b_holds_less(n: dict):
    m, held = n["micro_batches"], n["held"]
    p = len(held["1f1b"])
    bound = [min(p - s, m) for s in range(p)]
    ratio = [a / g if g else float("nan") for a, g in zip(n["bytes"]["1f1b"], n["bytes"]["gpipe"])]
    figures = (f"micro-batches held per stage: 1F1B {held['1f1b']} (p - s: {bound}), GPipe "
               f"{held['gpipe']} (m = {m}); 1F1B's activation bytes at peak "
               + ", ".join(f"{x:.2f}" for x in ratio) + " of GPipe's")
    over = [s for s in range(p) if held["1f1b"][s] > bound[s]]
    short = [s for s in range(p) if held["gpipe"][s] != m]
    why = "; ".join(
        [f"1F1B held more than p - s on stage {', '.join(map(str, over))}"] * bool(over)
        + [f"GPipe did not hold all m on stage {', '.join(map(str, short))}"] * bool(short)
        + ["the executor did not run the schedule as written (measured counts)"])
    return not over and not short, figures, why
