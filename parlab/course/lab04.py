"""Lab 04 (labs/04_rnn_pipelining.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

import math

from ..launcher import LaunchResult, launch
from .exercise import Exercise, check, register  # noqa: F401 (labNN.check)
from .explorer import (HERE, choice, cluster_choices, cluster_for, explorer,
                       refuse_unless_here, seconds_text, slider)


def run_pipeline(cfg, stages: int, micro_batches: int, schedule="1f1b", *,
                 timeout: float = 120.0, devices=None) -> LaunchResult:
    """A micro-batch pipeline of ``stages`` ranks: validated first, then launched.

    schedule: "gpipe", "1f1b" or explicit per-stage lists of ("F" | "B", i). A batch
    that does not divide into the micro-batches, a schedule that deadlocks or more stages
    than layers are refused before any rank starts.
    """
    from ..torch import pipeline
    cfg, ops = pipeline.prepare(cfg, stages, micro_batches, schedule)
    return launch(pipeline.train_pipeline, stages, args=(cfg, micro_batches, ops),
                  timeout=timeout, devices=devices)


def check_schedule(fn, cases=((2, 4), (3, 5), (4, 8))):
    """Check a learner's 1F1B schedule builder ``fn(stages, micro_batches)``.

    It must be valid and deadlock-free, and each stage s may hold at most p - s
    micro-batches at once (the memory bound that distinguishes 1F1B from GPipe).
    Returns the function to use next.
    """
    from ..pipeline import check as check_valid, one_f_one_b, peak_in_flight
    for stages, micro_batches in cases:
        try:
            schedule = fn(stages, micro_batches)
        except NotImplementedError:
            print("[1f1b] not attempted yet: the lab goes on with the reference schedule.")
            return one_f_one_b
        try:
            check_valid(schedule, stages, micro_batches)
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
    """Lab 04: choose p, m, a schedule and a cluster: the PREDICTED step at once; one
    click measures it.

    cfg: the lab's pipeline (``SplitConfig``: an MLP and its batch). here, costs: this
    machine and the MLP's per-layer costs as the lab calibrated them (``sim.Measured``);
    without them only the GPU clusters are offered. The prediction is
    ``sim.pipeline``: GPipe and 1F1B cut where this lab's executor cuts
    (``pipeline.stage_bounds``), interleaved balanced by cost; "measure it here" runs
    ``run_pipeline(cfg, p, m, schedule)`` on p ranks and draws its last step
    next to the prediction for the same stages.
    """
    from .. import sim
    from ..metrics import pipeline_bubble
    net = sim.Network.mlp(cfg.sizes)

    def predicted(p, m, schedule, cluster, bounds=None):
        return sim.pipeline(net, cluster_for(cluster, p, here), cfg.batch_size, stages=p,
                            micro_batches=m, schedule=schedule, bounds=bounds,
                            costs=costs if cluster == HERE else None)

    cuts = {}

    def executor_cut(p):
        """The stages this lab's executor runs (``pipeline.stage_bounds``), as Linear indices."""
        if p not in cuts:
            from ..torch import pipeline
            # module index -> Linear layer index (the MLP alternates Linear and ReLU)
            cuts[p] = [b // 2 for b in pipeline.stage_bounds(cfg, p)]
        return cuts[p]

    def predict(p, m, schedule, cluster):
        # gpipe and 1f1b: the executor's own cut, as lab 04 predicts it and "measure it here"
        # runs it; interleaved (not run here): two chunks per device, balanced by cost
        tl = predicted(p, m, schedule, cluster,
                       executor_cut(p) if schedule in ("gpipe", "1f1b") else None)
        lost = sum(tl.seconds_by_kind(r)["idle"] + tl.seconds_by_kind(r)["wait"]
                   for r in tl.ranks) / (len(tl.ranks) * tl.duration)
        return tl, (f"PREDICTED: one step {seconds_text(tl.step_s)}; the stages idle or wait {lost:.0%} "
                    f"of it (GPipe's and 1F1B's bubble (p-1)/(m+p-1) = {pipeline_bubble(p, m):.0%})"), \
            f"{schedule}, p = {p}, m = {m}, {cluster_for(cluster, p, here).name}"

    def measure(p, m, schedule, cluster):
        from ..torch import pipeline
        refuse_unless_here(cluster, p)
        if schedule not in ("gpipe", "1f1b"):
            raise ValueError("this lab's executor runs gpipe and 1f1b: choose one of them")
        res = run_pipeline(cfg, p, m, schedule)
        window = pipeline.step_windows(res.timeline, p, m)[-1]
        # module index -> Linear layer index (the MLP alternates Linear and ReLU)
        bounds = [b // 2 for b in pipeline.prepare(cfg, p, m, schedule)[0].bounds]
        return res.timeline.window(*window), predicted(p, m, schedule, cluster, bounds)

    clusters = cluster_choices(here if costs is not None else None)
    controls = {"p": slider("stages p", range(1, 5), 2),
                "m": slider("micro-batches m", range(1, 9), 4),
                "schedule": choice("schedule", ["1f1b", "gpipe", "interleaved"]),
                "cluster": choice("cluster", clusters)}
    return explorer(predict, controls, measure=measure)
