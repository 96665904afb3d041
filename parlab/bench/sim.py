"""The cost model's benchmark: its predictions against this machine, and against papers.

``python -m parlab bench --only sim``. One ROUND calibrates the model (one launch:
lab 00's link, how late a blocked rank resumes, lab 01's step) and then measures each
lab's configurations in their own launches, calibrating again before lab 04, before
lab 06 and after the last configuration, so that the calibrations sample the machine
all through the run. Nine rounds (``ROUNDS``) run one after another; then every
prediction comes from all the run's calibrations (predicted under each, their steps
pooled: ``calibrations_of_run``), never from the measurement itself, and each line gives
the median over the rounds, every round's own figure and how far the measured figure
moved between rounds: on this shared machine a configuration's step moves by 10-30 %
from one launch to the next, and some rounds run 1.5-2.5x slower (the cores' speed
drifts over seconds), so one round alone says little about the model, and a prediction
under one calibration moves further still.

A prediction is the median of many predicted steps, as a measured figure is the median
of many steps: the calibration keeps how far each message of its sweep strayed from the
price the model gives it, and every predicted message takes one of those strays, drawn
at random (``sim.engine``). A step of ten messages then meets the few slow ones about as
often as a measured step does, and a step of two seldom does.

Measuring (``measure``) and predicting (``compare``) are separate, so a round's
measurements can be kept and the model's predictions recomputed from them. A step time is
judged against 15 % only where the configuration's ranks fit the cores; where they
outnumber them the line gives the band the measured step covered across the rounds, and
the prediction against the measured step less its ranks' wait for a core (``report``).
Then the published runs (``sim.validate``: fitting and held-out sets, their summaries as
recorded before the changes of 2026-11-29 and as predicted now; the set sealed on 2026-11-29,
``sim.published_runs_sealed``, as first predicted and now) and the three in-sample figures
(``sim.published``).
"""
from __future__ import annotations

import statistics

from ..mesh import HybridShape
from ..steps import as_the_model_counts, step_seconds, warm_shares
from .registry import benchmark

SIM_SIZES = (64, 256, 256, 128, 10)       # the course's MLP (labs 02, 03, 05, 06, 07)
SIM_PIPELINE_SIZES = (64, 256, 256, 256, 256, 256, 256, 10)     # lab 04: deeper, same width
# Nine rounds, four calibrations each (2026-11-26: the run's verdict hangs on how many
# rounds the measured median has, not on how many calibrations the prediction pools;
# resampling 20 kept rounds of four runs, the share of runs with every 2-rank row within
# 15 % went 0.62 -> 0.87 from five rounds of eleven calibrations to nine of four, the
# same with nine of six, 0.76 with seven of six; a calibration takes 4-7 s, a launch 1 s.
# Since lab 03's operators are calibrated: 8 and 7 of 8 in two runs; with a one-pass
# collective's half wake-up too, 8 of 8 in seven runs of nine, 7 in the other two; with
# none where the ranks fit the cores, 8 of 8 in seven runs of ten, GPipe low in the other
# three; with an isend held by its sender's compute, 8 of 8 in ten runs of ten: README,
# "Against this machine")
ROUNDS = 9
STEP_TOLERANCE = 0.15                     # the targets: step time within 15 %,
SHARE_TOLERANCE = 0.05                    # bubble and wait shares within 0.05
# Predicted steps per configuration: each message meets a stray drawn from those measured
# (sim.engine), and the prediction is the median step, as the measured one is.
PREDICTED_STEPS = 41
AFTER_THE_LAST = "after the last configuration"     # a round's closing calibration


# ------------------------------------------------------------------ measuring
def measure(quick: bool = False) -> dict:
    """One round: calibrate, then run every configuration here: the calibration (with its
    raw timelines, so the costs can be fitted again), each configuration's figures, and
    under "calibrations" the round's calibrations in the order they ran: the first (before
    lab 02), before lab 04, before lab 06 and after the last configuration
    (``calibrations_of_run`` pools them all).

    Many steps per configuration: one step varies 2-4x on this machine, and the median
    of 10 steps moved by 2x between runs where the median of 60 moved by about 10 %.

    Each configuration runs as its lab runs it: labs 03, 04 and 07 pin each rank to cores
    of its own (``pin_cores=True``), labs 02, 05 and 06 leave the ranks free. Measured
    unpinned, as labs 03 and 04 are not, the four 2-rank rows of those labs came out
    0.86-1.35 of the prediction (medians of four rounds, 0.70-1.71 a round); pinned, in the
    same rounds, 0.98-1.07 (0.70-1.24 a round).
    """
    import numpy as np

    from ..course.calibrate import measure_this_machine
    from ..course.lab04 import linear_bounds, run_pipeline
    from ..course.lab07 import survey_hybrid
    from ..launcher import launch
    from ..split import SplitConfig
    from ..torch import data_parallel as dp
    from ..torch import parameter_server as ps
    from ..torch import pipeline as pl
    from ..torch import split
    from ..torch import tensor_parallel as tp

    steps = 20 if quick else 60
    out = {"load": _load(), "calibrations": {}}
    fitted = ("cluster", "costs", "costs_between_messages")     # what a prediction reads

    def calibrated(*keep: str) -> dict:
        here = measure_this_machine(SIM_SIZES, batches=(32, 64, 128), fit_batches=(32, 128),
                                    steps=20 if quick else 40)
        return {k: here[k] for k in keep}

    def calibrate(before: str) -> None:
        out["calibrations"][before] = calibrated(*fitted)

    out["calibration"] = calibrated(*fitted, "timelines", "timelines_between_messages",
                                    "links")
    lab01 = out["calibration"]["timelines"][64]       # batch 64: not used by the fit
    out["lab01"] = sum(float(np.median([s.duration for s in lab01 if s.name == p][2:]))
                       for p in ("forward", "backward", "update"))
    out["lab01 core_wait"] = core_wait_share(lab01, "forward")

    # the round's first calibration is the one just before lab 02: not run again
    out["calibrations"]["lab02"] = {k: out["calibration"][k] for k in fitted}
    res = launch(split.train_split, 2, args=(SplitConfig(sizes=SIM_SIZES, bounds=[4],
                                                         batch_size=64, steps=steps),))
    out["lab02"] = {"step": step_seconds(res.timeline, "forward", skip=0),
                    "idle": warm_shares(as_the_model_counts(res.timeline), "forward",
                                        skip=2)["idle"],
                    "core_wait": core_wait_share(res.timeline, "forward")}

    for scheme in ("naive", "column_row"):
        res = launch(tp.train_sliced, 2, args=(SIM_SIZES, scheme, 64, steps), pin_cores=True)
        m = warm_shares(as_the_model_counts(res.timeline), "forward", skip=2)
        out[f"lab03 {scheme}"] = {"step": step_seconds(res.timeline, "forward", skip=0),
                                  "comm": m["comm"] + m["idle"],
                                  "core_wait": core_wait_share(res.timeline, "forward")}

    cfg = SplitConfig(sizes=SIM_PIPELINE_SIZES, batch_size=256, steps=10 if quick else 30,
                      lr=0.01)
    out["lab04 bounds"] = linear_bounds(pl.stage_bounds(cfg, 2))
    calibrate("lab04")
    for schedule in ("gpipe", "1f1b"):
        res = run_pipeline(cfg, 2, 4, schedule, pin_cores=True)
        out[f"lab04 {schedule}"] = {"step": step_seconds(res.timeline, "F0", skip=0),
                                    "bubble": pl.measured_bubble(res.timeline, 2, 4),
                                    "core_wait": core_wait_share(res.timeline, "F0")}

    for mode in ("by_hand", "ddp"):
        res = launch(dp.train_data_parallel, 2, args=(mode, "mlp", 128, steps, 0.05))
        m = warm_shares(as_the_model_counts(res.timeline.filter(ranks=[0, 1])), "forward",
                        skip=2)
        out[f"lab05 {mode}"] = {"step": float(np.median(res.results[0]["step_s"][2:])),
                                "comm": m["comm"] + m["idle"],
                                "buckets": res.results[0].get("buckets_per_step"),
                                "core_wait": core_wait_share(res.timeline.filter(ranks=[0, 1]),
                                                             "forward")}

    calibrate("lab06")
    for mode in ("sync", "async"):
        res = launch(ps.train_parameter_server, 3,
                     args=(mode, 1, "mlp", 64, steps, 0.05, {2: 3}))
        fast = as_the_model_counts(res.timeline).summary()[1]
        out[f"lab06 {mode}"] = {"step": 64 / ps.throughput(res.results, 64), "steps": steps,
                                "wait": fast["wait_share"] + fast["idle_share"],
                                "core_wait": res.timeline.summary().mean("core_wait")}

    survey = survey_hybrid(steps=10 if quick else 30, pin_cores=True)
    out["lab07"] = [{"shape": row["shape"], "label": row["label"], "step": row["measured_s"],
                     "core_wait": row["core_wait"]} for row in survey["rows"]]
    calibrate(AFTER_THE_LAST)
    out["load"] += f" to {_load()}"
    return out


# ------------------------------------------------------------------ predicting
def compare(measured: dict, calibrations: list[dict], memo: dict | None = None) -> list[dict]:
    """The model's prediction for every measured figure of one round: under each of
    ``calibrations`` (the run's: ``calibrations_of_run``), their predicted steps pooled.
    ``memo`` keeps the predictions between the rounds of one run, where the calibrations,
    and so the predictions, are the same.

    Returns rows {label, what ("step" or a share's name), predicted, measured}.
    """
    import numpy as np

    from .. import sim

    cluster = measured["calibration"]["cluster"]
    alone = measured["calibration"]["costs"]          # lab 01: one device, back to back
    net = sim.Network.mlp(SIM_SIZES)
    rows = []
    memo = {} if memo is None else memo

    def predicted(key: str, predict, *settings) -> list:
        """``predict(cluster, costs between messages)`` under each calibration: a list of
        predicted timelines (or figures). ``settings``: what the prediction reads from the
        measured round."""
        if (key, settings) not in memo:
            memo[key, settings] = [predict(cal["cluster"], cal["costs_between_messages"])
                                   for cal in calibrations]
        return memo[key, settings]

    def row(label, what, predicted, value, ranks=1, core_wait=0.0):
        rows.append({"label": label, "what": what, "predicted": predicted, "measured": value,
                     "ranks": ranks, "core_wait": core_wait or 0.0})

    def step_of(tls, marker="forward"):
        """The median predicted step over every calibration's predicted steps."""
        return float(np.median([b - a for tl in tls for a, b in tl.step_windows(marker)]))

    def mean(figures):
        return statistics.fmean(figures)

    row("lab 01 single device, batch 64", "step",
        sim.single_device(net, cluster, 64, costs=alone).step_s, measured["lab01"], 1,
        measured.get("lab01 core_wait"))

    preds = predicted("lab02", lambda cluster, costs: sim.manual_split(
        net, cluster, 64, devices=2, bounds=[2], steps=PREDICTED_STEPS, costs=costs))
    m = measured["lab02"]
    row("lab 02 split over 2", "step", step_of(preds), m["step"], 2, m.get("core_wait"))
    row("lab 02 split over 2", "idle+wait share",
        mean(warm_shares(p, "forward")["idle"] for p in preds), m["idle"])

    for scheme in ("naive", "column_row"):
        preds = predicted(f"lab03 {scheme}", lambda cluster, costs: sim.tensor_parallel(
            net, cluster, 64, devices=2, scheme=scheme, steps=PREDICTED_STEPS, costs=costs))
        m, shares = measured[f"lab03 {scheme}"], [warm_shares(p, "forward") for p in preds]
        label = f"lab 03 tensor parallel {scheme}"
        row(label, "step", step_of(preds), m["step"], 2, m.get("core_wait"))
        row(label, "transfer+wait share", mean(p["comm"] + p["idle"] for p in shares), m["comm"])

    from ..torch.pipeline import measured_bubble  # a timeline reader: works on predictions too
    pnet = sim.Network.mlp(SIM_PIPELINE_SIZES)
    for schedule in ("gpipe", "1f1b"):
        preds = predicted(f"lab04 {schedule}", lambda cluster, costs: sim.pipeline(
            pnet, cluster, 256, stages=2, micro_batches=4, schedule=schedule,
            bounds=measured["lab04 bounds"], steps=PREDICTED_STEPS,
            costs=_rescaled(costs, net, pnet)), tuple(measured["lab04 bounds"]))
        m = measured[f"lab04 {schedule}"]
        label = f"lab 04 pipeline {schedule}, p=2 m=4"
        row(label, "step", step_of(preds, "F0"), m["step"], 2, m.get("core_wait"))
        row(label, "bubble", mean(measured_bubble(p, 2, 4, skip_steps=1) for p in preds),
            m["bubble"])

    for mode in ("by_hand", "ddp"):
        m = measured[f"lab05 {mode}"]
        buckets = "per_tensor" if mode == "by_hand" else max(round(m["buckets"] or 1), 1)
        preds = predicted(f"lab05 {mode}", lambda cluster, costs: sim.data_parallel(
            net, cluster, 128, devices=2, buckets=buckets, overlap=mode == "ddp",
            steps=PREDICTED_STEPS, costs=costs), buckets)
        shares = [warm_shares(p.filter(ranks=[0, 1]), "forward") for p in preds]
        label = f"lab 05 data parallel {mode} ({buckets} all-reduce(s) per step)"
        row(label, "step", step_of(preds), m["step"], 2, m.get("core_wait"))
        row(label, "main lanes' transfer+wait share", mean(p["comm"] + p["idle"] for p in shares),
            m["comm"])

    for mode in ("sync", "async"):
        m = measured[f"lab06 {mode}"]
        steps = m["steps"]
        preds = predicted(f"lab06 {mode}", lambda cluster, costs: sim.parameter_server(
            net, cluster, 64, workers=2, mode=mode, slow={2: 3}, steps=steps, costs=costs),
            steps)
        fast = [p.summary()[1] for p in preds]
        label = f"lab 06 parameter server {mode}, slow worker x3"
        row(label, "time per 64 samples", mean(p.duration / steps for p in preds), m["step"], 3,
            m.get("core_wait"))
        row(label, "fast worker's wait share",
            mean(f["wait_share"] + f["idle_share"] for f in fast), m["wait"])

    for entry in measured["lab07"]:
        shape = HybridShape.of(entry["shape"])
        preds = predicted("lab07", lambda cluster, costs: sim.hybrid(
            net, cluster, 64, dp=shape.dp, tp=shape.tp, pp=shape.pp,
            micro_batches=4 if shape.pp > 1 else 1, steps=PREDICTED_STEPS, costs=costs),
            shape.dp, shape.tp, shape.pp)
        marker = "F0" if shape.pp > 1 else "forward"
        row(f"lab 07 {entry['label']}", "step", step_of(preds, marker), entry["step"],
            shape.dp * shape.tp * shape.pp, entry.get("core_wait"))
    return rows


def calibrations_of_run(rounds: list[dict]) -> list[dict]:
    """Every calibration a run made, in the order they ran: each round's four (``measure``;
    for a round measured without them, its first).

    A prediction under one calibration moves far more than the machine does. Measured
    2026-11-26, each 2-rank configuration launched two to four times between the same
    two calibrations (nine rounds): in three of them lab 03's naive step was predicted
    at 9.5-17.0 ms under their 24 calibrations while its 12 launches measured 9.4-12.4
    ms (a calibration's all-reduces wait a scheduler tick, about 3.4 ms, in 30-40 % of
    its sweep, and a step of seven collectives meets two or three as that share moves).
    The log predicted step's standard deviation from calibration to calibration,
    0.04-0.25 by configuration, exceeded the measured step's from launch to launch,
    0.03-0.15, and the calibrations on either side of a measurement did not follow it.
    Pooled over the run, the share of five-round runs (drawn from those nine rounds)
    whose median ratio came within 15 % rose for every configuration (lab 03 naive
    0.80 -> 0.88, GPipe 0.78 -> 0.94, DDP 0.84 -> 0.89, ...), and ten bench rounds
    predicted both ways had 6 and 7 of 8 within from the calibrations around each
    configuration, 7 and 8 pooled."""
    pooled = []
    for measured in rounds:
        pooled += list(measured.get("calibrations", {}).values()) or [measured["calibration"]]
    return pooled


# ------------------------------------------------------------------ the report
def verdict(rows: list[dict]) -> dict:
    """Within its tolerance? Step times as a ratio (15 %), shares as a difference (0.05).

    ``steady``: whether the machine's own figure stayed inside the window the tolerance
    allows across the rounds (a ratio between rounds of at most 1.15 / 0.85, a share
    moving by at most 2 × 0.05): beyond it, no single prediction can be within tolerance
    of every round, and a miss says as much about the machine as about the model.
    """
    ratio = rows[0]["what"] in ("step", "time per 64 samples")
    values = [r["predicted"] / r["measured"] if ratio else r["predicted"] - r["measured"]
              for r in rows]
    mid = statistics.median(values)
    ok = abs(mid - 1) <= STEP_TOLERANCE if ratio else abs(mid) <= SHARE_TOLERANCE
    measured = [r["measured"] for r in rows]
    if ratio:
        spread = max(measured) / min(measured)
        steady = spread <= (1 + STEP_TOLERANCE) / (1 - STEP_TOLERANCE)
    else:
        spread = max(measured) - min(measured)
        steady = spread <= 2 * SHARE_TOLERANCE
    return {"ratio": ratio, "values": values, "median": mid, "within": ok,
            "spread": spread, "steady": steady}


def report(rounds: list[list[dict]], cores: int | None = None) -> list[str]:
    """One line per measured figure: the median over the rounds, then each round's, and how
    far the measured figure itself moved between rounds.

    A step time is printed as ``predicted/measured (ranks <= cores) NAME X`` where the
    configuration's ranks fit the machine's cores (``os.cpu_count()``), with its verdict
    against 15 %; as ``predicted/measured (oversubscribed) NAME X`` where they do not,
    with the band the measured step covered across the rounds instead of a verdict, and
    the prediction over the measured step less the time its ranks waited for a core
    (their mean ``core_wait`` share, read from the measured timelines)."""
    import os
    cores = cores or os.cpu_count() or 1
    lines, verdicts = [], []
    for k, first in enumerate(rounds[0]):
        rows = [r[k] for r in rounds]
        v = verdict(rows)
        v["fits"] = first.get("ranks", 1) <= cores
        verdicts.append(v)
        each = " / ".join(f"{x:.2f}" if v["ratio"] else f"{x:+.3f}" for x in v["values"])
        p = statistics.median(r["predicted"] for r in rows)
        m = statistics.median(r["measured"] for r in rows)
        if v["ratio"] and v["fits"]:
            lines.append(f"predicted/measured (ranks <= cores) {first['label']} {v['median']:.2f} "
                         f"({first['what']} PREDICTED {p * 1e3:.2f} ms, measured {m * 1e3:.2f} ms "
                         f"(medians); rounds: {each}; {'within' if v['within'] else 'OUTSIDE'} "
                         f"15 %; measured {v['spread']:.2f}x apart between rounds; "
                         f"{first.get('ranks', 1)} rank(s) on {cores} cores)")
        elif v["ratio"]:
            low, high = (min(r["measured"] for r in rows), max(r["measured"] for r in rows))
            less = statistics.median(r["predicted"] / (r["measured"] * (1 - r["core_wait"]))
                                     for r in rows)
            waited = statistics.median(r["core_wait"] for r in rows)
            lines.append(f"predicted/measured (oversubscribed) {first['label']} {v['median']:.2f} "
                         f"({first['what']} PREDICTED {p * 1e3:.2f} ms, measured "
                         f"{low * 1e3:.2f}-{high * 1e3:.2f} ms across rounds (median "
                         f"{m * 1e3:.2f}); rounds: {each}; against the measured step less its "
                         f"core wait ({waited:.0%} of it): {less:.2f}; {first['ranks']} ranks on "
                         f"{cores} cores: a band, no verdict)")
        else:
            lines.append(f"{first['label']}: {first['what']} PREDICTED {p:.3f}, measured {m:.3f} "
                         f"(medians), predicted - measured {v['median']:+.3f} (rounds: {each}; "
                         f"{'within' if v['within'] else 'OUTSIDE'} 0.05; measured "
                         f"{v['spread']:.3f} apart between rounds)")
    judged = [v for v in verdicts if v["fits"] or not v["ratio"]]
    n_ratio = sum(v["ratio"] for v in judged)
    misses = [v for v in judged if not v["within"]]
    lines.append(f"summary: step times within 15 % for "
                 f"{sum(v['within'] for v in judged if v['ratio'])} of {n_ratio} configurations "
                 f"whose ranks fit the {cores} cores ("
                 f"{sum(v['ratio'] and not v['fits'] for v in verdicts)} oversubscribed: bands "
                 f"above), shares within 0.05 for "
                 f"{sum(v['within'] for v in judged if not v['ratio'])} of "
                 f"{len(judged) - n_ratio} "
                 f"(medians over {len(rounds)} round(s)); of the {len(misses)} outside, "
                 f"{sum(not v['steady'] for v in misses)} moved between rounds by more than the "
                 f"tolerance allows (step {(1 + STEP_TOLERANCE) / (1 - STEP_TOLERANCE):.2f}x, "
                 f"share {2 * SHARE_TOLERANCE:.2f})")
    return lines


def _calibration_line(k: int, measured: dict) -> str:
    import os
    c, costs = measured["calibration"]["cluster"], measured["calibration"]["costs"]
    strays = sorted(c.message_spread_s + c.collective_spread_s)
    slow = (f", {sum(t > 1e-3 for t in strays)} of its {len(strays)} messages 1 ms or more "
            "over their price" if strays else "")
    between = measured["calibration"]["costs_between_messages"]
    calls = "/".join(f"{t * 1e6:.0f}" for t in between.call_s)
    short = "".join(f", {w * 1e3:.2f} ms after {b * 1e3:.0f} ms" for b, w in c.wake_curve[:-1])
    bucket = (f", a DDP bucket's all-reduce is posted {c.handoff_s[0] * 1e3:.2f} ms after its "
              f"last gradient and its rank resumes {c.handoff_s[1] * 1e3:.2f} ms after it"
              if c.handoff_s else "")
    wrapper = (f", DDP's wrapper adds {c.ddp_wrapper_s[0] * 1e3:.2f} ms to a forward and "
               f"{c.ddp_wrapper_s[1] * 1e3:.2f} ms to a backward" if c.ddp_wrapper_s else "")
    operators = (f", lab 03's operators cost {c.tp_operator_s * 1e3:.2f} ms around each "
                 "collective" if c.tp_operator_s else "")
    held = f", {c.held_send_share:.0%} of pinned isends held by their sender's compute"
    return (f"round {k + 1}: calibrated {len(measured['calibrations'])} times, the first "
            f"(fixed part {costs.fixed_s * 1e6:.0f} us per layer pass, each pass's call {calls} us "
            f"(forward/backward/update, between messages), link {c.intra}, collective "
            f"overhead {c.collective_overhead_s * 1e3:.2f} ms, a rank blocked 20 ms resumes "
            f"{c.wake_latency_s * 1e3:.2f} ms late{short}{bucket}{wrapper}{operators}{held}"
            f"{slow}); "
            f"{os.cpu_count()} cores, load average {measured['load']}")


@benchmark("sim")
def sim_bench(quick: bool = False) -> list[str]:
    """The cost model against this machine (labs 01-07), against the published runs of the
    validation set (fitting and held-out, ``sim.validate``) and against the three figures
    it was built on (``sim.published``)."""
    from .. import sim
    from ..sim import published_runs_sealed, validate
    measured = [measure(quick) for _ in range(1 if quick else ROUNDS)]
    lines = [_calibration_line(k, m) for k, m in enumerate(measured)]
    pooled, memo = calibrations_of_run(measured), {}
    lines.append(f"each prediction: under all {len(pooled)} calibrations of the run, their "
                 f"predicted steps pooled ({PREDICTED_STEPS} each)")
    rounds = [compare(m, pooled, memo) for m in measured]
    return lines + report(rounds) + [validate.BEFORE] + validate.lines() + \
        published_runs_sealed.lines() + [
        line.replace("sim vs published:", "sim vs published (in-sample):", 1)
        for line in sim.published.lines()]


# ------------------------------------------------------------------ helpers
def core_wait_share(timeline, marker: str, skip: int = 2) -> float:
    """The ranks' mean share of their warm steps (after the first ``skip``) spent waiting
    for a core (the measured ``core_wait`` spans)."""
    windows = timeline.step_windows(marker)[skip:]
    if not windows:
        return 0.0
    window = timeline.window(windows[0][0], windows[-1][1])
    return window.summary().mean("core_wait")


def _load() -> str:
    """The machine's 1-minute load average: how many processes wanted its cores."""
    import os
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def _rescaled(costs, net, other):
    """Per-layer costs of another MLP of the same kind, by FLOPs (one width measured)."""
    from dataclasses import replace
    per_flop_f = [(t - costs.fixed_s) / layer.flops for t, layer in zip(costs.forward, net.layers)]
    per_flop_b = [(t - costs.fixed_s) / layer.flops for t, layer in zip(costs.backward, net.layers)]
    rate_f = sum(per_flop_f) / len(per_flop_f)
    rate_b = sum(per_flop_b) / len(per_flop_b)
    return replace(costs, forward=tuple(costs.fixed_s + rate_f * layer.flops for layer in other.layers),
                   backward=tuple(costs.fixed_s + rate_b * layer.flops for layer in other.layers),
                   update=costs.update * other.params / net.params, params=other.params)
