"""Lab 04 (labs/04_rnn_pipelining.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

import math

from ..launcher import LaunchResult, launch
from ..split import SplitConfig
from . import lessons, replays
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
    machine and the MLP's per-layer costs as the lab fitted them (``sim.Measured``);
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
        rp = replays.replayed(run_pipeline(cfg, p, m, schedule))
        bounds = linear_bounds(pipeline.prepare(cfg, p, m, schedule)[0].bounds)
        return rp.window(*typical_step(rp, p, m)), predicted(p, m, schedule, cluster, bounds)

    clusters = cluster_choices(here if costs is not None else None)
    controls = {"p": slider("stages p", range(1, 5), 2),
                "m": slider("micro-batches m", range(1, 9), 4),
                "schedule": choice("schedule", ["1f1b", "gpipe", "interleaved"]),
                "chunks": slider("chunks per device v (interleaved)", [2, 3, 4], 2),
                "tp": slider("tensor parallel tp (GPUs)", [1, 2, 4], 1),
                "cluster": choice("cluster", clusters)}
    return explorer(predict, controls, measure=measure)


# ------------------------------------------------------------------ the LSTM wavefront
WAVE = dict(hidden=512, length=16, batch=128)    # 4 layers of 512 units, 16 time steps
WAVE_BUSY = 0.8     # the share of the middle with all layers but one computing, at least


def wavefront(devices=None, layers: int = 4, **kw) -> LaunchResult:
    """The LSTM stack, one layer per rank (``pipeline.lstm_wavefront``, ``WAVE`` unless
    told otherwise), launched on ``layers`` ranks."""
    from ..hardware import devices as find_devices
    from ..torch import pipeline
    return launch(pipeline.lstm_wavefront, layers, kwargs={**WAVE, **kw},
                  devices=devices or find_devices(layers))


def _time_steps(timeline) -> list:
    return [s for s in timeline if s.kind == "compute" and s.name[:1] == "t"
            and s.name[1:].isdigit()]


def wave_middle(timeline) -> tuple[float, float]:
    """The wavefront's middle: from the last layer's first time step to the first
    layer's last. Before it the stack fills, after it it drains."""
    steps = _time_steps(timeline)
    first, last = min(s.rank for s in steps), max(s.rank for s in steps)
    return (min(s.start for s in steps if s.rank == last),
            max(s.end for s in steps if s.rank == first))


def wave_numbers(rp) -> dict:
    """What lesson 04.wavefront_keeps_layers_busy reads from a wavefront's replay: the
    middle's length and, in it, the share of time with k layers computing at once and
    each layer's compute share; each layer's median time step, and the median
    hand-over (a receive's transfer)."""
    import statistics
    a, b = wave_middle(rp)
    middle = rp.window(a, b) if b > a else None
    steps = _time_steps(rp)
    ranks = sorted({s.rank for s in steps})
    transfers = [s.duration for s in rp if s.kind == "comm" and s.name.startswith("recv")]
    out = {"layers": len(ranks), "run_s": rp.duration, "middle_s": max(b - a, 0.0),
           "busy": middle.concurrency() if middle else {},
           "compute": [middle.seconds_by_kind(r)["compute"] / (b - a) if middle else 0.0
                       for r in ranks],
           "step_s": [statistics.median(s.duration for s in steps if s.rank == r) for r in ranks],
           "transfer_s": statistics.median(transfers) if transfers else 0.0}
    if getattr(rp, "replayed", False):
        out["source"] = replays.source(rp)
    return out


def _wave_experiment() -> dict:
    return wave_numbers(replays.replayed(wavefront()))


@lessons.lesson("04.wavefront_keeps_layers_busy",
                "once an LSTM stack's wavefront has filled (from the last layer's first time "
                "step to the first layer's last), at least 3 of its 4 layers, one per device, "
                f"compute at once {WAVE_BUSY:.0%} of the time or more",
                _wave_experiment)
def wavefront_keeps_layers_busy(n: dict):
    layers, busy = n["layers"], n["busy"]
    most = sum(v for k, v in busy.items() if k >= layers - 1)
    figures = (f"in the middle ({n['middle_s'] * 1e3:.1f} ms of {n['run_s'] * 1e3:.1f} ms), "
               f"{layers - 1} or more of {layers} layers computed "
               f"{lessons.beside(most, WAVE_BUSY)} of the time, all {layers} "
               f"{busy.get(layers, 0.0):.2f}")
    if n["middle_s"] <= 0:
        return False, figures, "the first layer finished before the last one started: no middle"
    why = ("each layer computed " + ", ".join(f"{c:.0%}" for c in n["compute"])
           + " of the middle; a time step took " + ", ".join(f"{t * 1e3:.1f}" for t in n["step_s"])
           + f" ms per layer, a hand-over {n['transfer_s'] * 1e3:.2f} ms: a layer slower than "
           "the one before it leaves the next waiting, and time between steps (sends, "
           "receives) leaves it idle")
    return most >= WAVE_BUSY, figures, why


# ------------------------------------------------------------------ micro-batch pipelines
# The notebook's two models: PIPE for time (16 hidden layers of 384, a batch of 840, which
# divides into any m from 1 to 8; 18 layers, enough for the explorer's 4 stages of 4
# interleaved chunks), LIGHT for memory (small: it is about counts, not time).
PIPE = SplitConfig(sizes=(64, *[384] * 16, 10), batch_size=840, steps=5, lr=0.01)
LIGHT = SplitConfig(sizes=(64, 64, 64, 64, 64, 10), batch_size=64, steps=1, lr=0.1)
MICRO_BATCHES = (1, 2, 4, 8)


def _median(xs) -> float:
    """The median, 0.0 for none (a stage without that phase)."""
    import statistics
    xs = list(xs)
    return float(statistics.median(xs)) if xs else 0.0


def bubble_runs(devices=None, micro_batches=MICRO_BATCHES, cfg: SplitConfig = PIPE,
                schedule: str = "1f1b", pin_cores: bool = False) -> LaunchResult:
    """A pipeline of 2 stages taking its steps with each m in turn (m = 1, 2, 4, 8, then
    again: ``cfg.steps`` rounds; ``pipeline.train_pipeline_in_turn``), one launch. Its
    results' "order" says the m of every step (``by_micro_batches`` cuts them apart).

    In turn, so that a step's measured work meets the same moments of this machine
    whatever its m; and one launch is quicker than four."""
    from ..hardware import devices as find_devices
    from ..torch import pipeline
    cfg, plan = pipeline.prepare_in_turn(cfg, 2, micro_batches, schedule)
    return launch(pipeline.train_pipeline_in_turn, 2, args=(cfg, plan),
                  devices=devices or find_devices(2), pin_cores=pin_cores)


def by_micro_batches(timeline, order, stages: int = 2) -> dict:
    """{m: the Timeline of its steps} of a run whose steps took the micro-batch counts
    ``order`` in turn (measured or replayed): each step from its first F to the next
    step's first F, its update and waits with it."""
    from ..timeline import Timeline
    from ..torch import pipeline
    steps = pipeline.steps_by_micro_batches(timeline, stages, order)
    starts = sorted(a for windows in steps.values() for a, _ in windows)
    step_end = dict(zip(starts, [*starts[1:], timeline.end]))
    return {m: Timeline.merge(timeline.window(a, step_end[a]) for a, _ in windows)
            for m, windows in steps.items()}


def _ops_of_step(window, stages: int, micro_batches: int) -> dict:
    """{"F": per stage, one time per micro-batch; "B": likewise} of one step."""
    from ..pipeline import pass_of
    ops = {k: [[0.0] * micro_batches for _ in range(stages)] for k in "FB"}
    for s in window:
        op = pass_of(s.name.split(" (")[0])
        if s.rank < stages and op and op[1] < micro_batches:
            ops[op[0]][s.rank][op[1]] += s.duration
    return ops


def bubble_numbers(timeline, order, stages: int = 2, schedule: str = "1f1b") -> dict:
    """What lessons 04.bubble_as_predicted and 04.micro_batches_pay read from a
    ``bubble_runs`` run's replay (``order``: its results' "order"): per m, medians over the
    warm steps (each m's first pays for start-up) of the step's F/B part and of the
    stages' wait + idle and transfer (comm) shares of it; each stage's median F and B; and
    each warm step played on paper (``pipeline.simulate``, free messages) with the F and
    B of every micro-batch in that step: its length and idle share, the bubble the
    schedule makes of those times. Uneven micro-batches leave the stage behind waiting
    for the slowest, which each stage's median F and B would smooth away."""
    from .. import pipeline
    from ..pipeline import pass_kind
    from ..torch.pipeline import steps_by_micro_batches
    by_m = {}
    for m, windows in steps_by_micro_batches(timeline, stages, order).items():
        paper_order = pipeline.make(schedule, stages, m)
        per = {"step": [], "wait_idle": [], "comm": [], "predicted": [], "predicted_step": []}
        fb = {k: [[] for _ in range(stages)] for k in "FB"}
        for a, b in windows[1:] or windows:
            window = timeline.window(a, b)
            secs = [window.seconds_by_kind(r) for r in range(stages)]
            per["step"].append(b - a)
            per["wait_idle"].append(sum(s["wait"] + s["idle"] for s in secs) / (stages * (b - a)))
            per["comm"].append(sum(s["comm"] for s in secs) / (stages * (b - a)))
            ops = _ops_of_step(window, stages, m)
            paper = pipeline.simulate(paper_order, stages, m, ops["F"], ops["B"])
            per["predicted"].append(pipeline.bubble_share(paper))
            per["predicted_step"].append(paper.duration)
            for s in window:
                if s.rank < stages and pass_kind(s.name) in fb:
                    fb[pass_kind(s.name)][s.rank].append(s.duration)
        med = {k: [_median(x) for x in v] for k, v in fb.items()}
        by_m[m] = {k: _median(v) for k, v in per.items()} | {
            "forward": med["F"], "backward": med["B"],
            "formula": (stages - 1) / (m + stages - 1),
            "work": m * sum(med["F"]) + m * sum(med["B"])}     # all stages' F and B of a step
    out = {"stages": stages, "by_m": by_m}
    if getattr(timeline, "replayed", False):
        out["source"] = replays.source(timeline)
    return out


def _bubble_experiment() -> dict:
    run = bubble_runs()
    return bubble_numbers(replays.replayed(run), run.results[0]["order"])


@lessons.lesson("04.bubble_as_predicted",
                "in a micro-batch pipeline, the share of a step the stages spend neither "
                "computing nor transferring (wait + idle) is the bubble that the schedule "
                "makes of that step's F and B (pipeline.simulate; (p-1)/(m+p-1) for equal "
                "stages): within 5 points of the step, for every m",
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
    why = (f"m = {', '.join(map(str, off))} off by more than 5 points; at m = {worst} "
           f"{abs(g):.0%} of the step {'more' if g > 0 else 'less'} than the schedule on "
           f"paper, with free messages; the stages sent and received {r['comm']:.0%} of "
           f"the step ({2 * worst} hand-overs)")
    return not off, figures, why


MICRO_BATCH_M = 4
MICRO_BATCH_GAIN = 1.3


@lessons.lesson("04.micro_batches_pay",
                f"with p = 2 stages, m = {MICRO_BATCH_M} micro-batches make a step at least "
                f"{MICRO_BATCH_GAIN}x quicker than m = 1 (the bubble alone would allow "
                f"2m/(m+1) = {2 * MICRO_BATCH_M / (MICRO_BATCH_M + 1):.1f}x)",
                _bubble_experiment)
def micro_batches_pay(n: dict):
    rows = n["by_m"]
    one, r = rows[1], rows[MICRO_BATCH_M]
    gain = one["step"] / r["step"]
    figures = (f"m = 1 step {one['step'] * 1e3:.0f} ms, m = {MICRO_BATCH_M} "
               f"{r['step'] * 1e3:.0f} ms: {lessons.beside(gain, MICRO_BATCH_GAIN)}x "
               f"(the schedule on paper, from the same F and B: "
               f"{one['predicted_step'] / r['predicted_step']:.2f}x)")
    work = r["work"] / one["work"]
    why = (f"a step's F and B took {work:.2f}x the time of m = 1's"
           + (" (smaller micro-batches used a core less well)" if work > 1.05 else "")
           + f"; the stages waited or idled {r['wait_idle']:.0%} of the step (m = 1: "
           f"{one['wait_idle']:.0%}) and sent and received {r['comm']:.0%} (m = 1: "
           f"{one['comm']:.0%}; {2 * MICRO_BATCH_M} hand-overs a step against 2)")
    return gain >= MICRO_BATCH_GAIN, figures, why


def model_from_replay(pipes: dict, link, batch: int = PIPE.batch_size, sizes=PIPE.sizes):
    """The cost model for this lab's MLP, from the replayed steps ``pipes`` ({m:
    Timeline}, two m or more): (costs per layer, the cluster: dedicated devices on
    ``link``). A straight line through F and B against the micro-batch size gives a fixed
    cost and a cost per row (``sim.calibrate.costs_from_pipeline``)."""
    from .. import sim
    net = sim.Network.mlp(sizes)
    costs = sim.calibrate.costs_from_pipeline(net, pipes, batch, stages=2)
    here = sim.calibrate.this_machine(link, flops=sim.calibrate.compute_rate(net, costs),
                                      devices=2)
    return costs, here


# ------------------------------------------------------------------ memory
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


def on_this_machine(wave, runs: dict):
    """The optional cell: the wavefront and each schedule's typical warm step as this
    machine's clock measured them, ranks sharing its cores."""
    from .. import plot
    from ..torch.pipeline import step_windows
    tl = wave.timeline
    start = min(s.start for s in tl if s.name == "t0")
    print(f"the wavefront took {(tl.end - start) * 1e3:.0f} ms here, waiting for a core "
          f"{lessons.core_wait_share(tl.window(start, tl.end), tl.ranks):.0%} of it")
    drawn = {"LSTM stack, one layer per device": tl.window(start, tl.end)}
    for name, res in runs.items():
        warm = step_windows(res.timeline, 2, 4)[1:]
        step = res.timeline.window(*typical_step(res.timeline, 2, 4))
        print(f"{name}: a warm step took {_median(b - a for a, b in warm) * 1e3:.0f} ms here, "
              f"waiting for a core {lessons.core_wait_share(step, step.ranks):.0%} of it")
        drawn[f"{name}, p = 2, m = 4: the warm step nearest the median"] = step
    fig, axes = plot.pyplot().subplots(len(drawn), 1, figsize=(14, 9.5))
    for ax, (title, part) in zip(axes, drawn.items()):
        plot.timeline(part, ax=ax, color_by="index" if ax is axes[0] else "name",
                      legend=ax is axes[0], title=f"{title} (measured on this machine's clock)")
    fig.tight_layout()
    return plot.finish(fig)
