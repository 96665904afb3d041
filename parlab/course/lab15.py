"""Lab 15 (labs/15_capstone_unet.ipynb): one model from start to end. A U-Net that
learns the course's shapes; the same U-Net on 4 devices (data parallel, a pipeline cut
between encoder and decoder, both at once on a mesh), each equal to one device; the
cost model's choice among them, measured against its prediction; TensorFlow's
``MirroredStrategy`` and ``MultiWorkerMirroredStrategy``; the trained model served from
another process. Its exercises and its lessons."""
from __future__ import annotations

import os

import numpy as np

from ..launcher import LaunchResult, launch
from ..split import UNetConfig, crossing
from . import lessons, replays
from .exercise import Exercise, check, register, whose  # noqa: F401 (labNN.check, labNN.whose)
from .lab15_choose import check_plan, plan_cost  # noqa: F401 (the notebook's lab15.*)
from .lab15_serve import (run_tf_mirrored_fit, run_tf_multi_worker,  # noqa: F401
                          serve_in_fresh_process, show_segmentations, weight_difference)

CFG = UNetConfig()        # global batch 16, Adam 3e-3, 4 micro-batches, cut encoder | decoder
EPOCHS = 30               # of the 192 training images, for the U-Net that learns
TEST_IMAGES = 64          # parlab.data.shapes(64, seed=1): images no step trained on
MIN_IOU = 0.5             # lesson 15.unet_learns_the_shapes: each shape's IoU at least this
PLAN_NAMES = {"dp": "dp 4", "pp": "pp 2 (encoder | decoder)", "dp_pp": "dp 2 × pp 2"}


def held_out_data(cfg: UNetConfig = CFG):
    """Images and masks no training step sees (``parlab.data.shapes``, seed 1)."""
    from .. import data
    return data.shapes(TEST_IMAGES, cfg.size, seed=1)


# ------------------------------------------------------------------ a U-Net that learns
def iou_per_class(pred, masks, classes=(1, 2)) -> dict:
    """Each foreground class's intersection over union: pixels both the prediction and
    the mask give the class, over pixels either gives it (0 where neither does)."""
    out = {}
    for c in classes:
        union = ((pred == c) | (masks == c)).sum()
        out[c] = float(((pred == c) & (masks == c)).sum() / union) if union else 0.0
    return out


CLASS_NAMES = {1: "disc", 2: "square"}


def train_unet(epochs: int = EPOCHS, *, cfg: UNetConfig = CFG, progress: bool = True) -> dict:
    """Train the U-Net on one device (the notebook's: one core, or a GPU) with the
    weighted loss (``unet.loss_fn``); its IoU per shape on the test images before and
    after, and what painting every pixel background would score.

    Returns {"model" (on the CPU), "history", "iou", "iou_before", "iou_background",
    "pixel_accuracy", "background_share", "epochs", "device"}.
    """
    from ..torch import serve, single, unet
    from .lab01 import one_device
    x, y = unet.training_data(cfg)
    xt, yt = held_out_data(cfg)
    with one_device() as device:
        model = unet.build(cfg).to(device)
        before = serve.segment(model.eval(), xt, device)
        history = single.train(model, x, y, epochs=epochs, batch_size=cfg.global_batch,
                               lr=cfg.lr, device=device, progress=progress, seed=cfg.seed,
                               loss_fn=unet.loss_fn(cfg))
        pred = serve.segment(model.eval(), xt, device)
    return {"model": model.to("cpu"), "history": history, "epochs": epochs, "device": device,
            "iou": iou_per_class(pred, yt), "iou_before": iou_per_class(before, yt),
            "iou_background": iou_per_class(np.zeros_like(yt), yt),
            "pixel_accuracy": float((pred == yt).mean()),
            "background_share": float((yt == 0).mean())}


def learn_numbers(run: dict) -> dict:
    """What lesson 15.unet_learns_the_shapes reads from ``train_unet``."""
    return {"iou": dict(run["iou"]), "iou_background": dict(run["iou_background"]),
            "iou_before": dict(run["iou_before"]), "epochs": run["epochs"],
            "loss": (run["history"]["loss"][0], run["history"]["loss"][-1]),
            "pixel_accuracy": run["pixel_accuracy"], "background_share": run["background_share"]}


def _learn_experiment() -> dict:
    return learn_numbers(train_unet(progress=False))


@lessons.lesson("15.unet_learns_the_shapes",
                f"the U-Net learns the shapes: after {EPOCHS} epochs with the weighted loss, "
                f"the IoU of the discs and that of the squares on test images are each at "
                f"least {MIN_IOU} (painting every pixel background, the easy answer for 86 % "
                f"of the pixels, scores 0 for both)",
                _learn_experiment)
def unet_learns_the_shapes(m: dict):
    figures = ", ".join(f"{CLASS_NAMES[int(c)]} IoU {v:.2f} (background everywhere: "
                        f"{m['iou_background'][c]:.2f}; untrained {m['iou_before'][c]:.2f})"
                        for c, v in m["iou"].items())
    short = [CLASS_NAMES[int(c)] for c, v in m["iou"].items() if v < MIN_IOU]
    why = (f"{' and '.join(short)} below {MIN_IOU} after {m['epochs']} epochs; the training "
           f"loss went from {m['loss'][0]:.3f} to {m['loss'][1]:.3f}")
    return not short, figures, why


# ------------------------------------------------------------------ strategies, equal to one device
def run_plans(plans=(("dp", 1), ("pp", 1), ("dp_pp", 2)), *, cfg: UNetConfig = CFG,
              devices=None, pin_cores: bool = True, timeout: float = 240.0) -> dict:
    """Each (plan, dp) of ``plans`` in turn on the same 4 ranks, in one launch
    (``unet.measure_plans``): data parallel on 4, the 2-stage pipeline on the first 2,
    dp 2 × pp 2 on a mesh. Returns {plan: {"results", "timeline" (its steps only, lanes
    named by mesh coordinates), "replayed" (the same, replayed on dedicated devices),
    "ranks" (those that trained)}} and "launch"."""
    from ..torch import unet
    from ..trace import Timeline
    res = launch(unet.measure_plans, 4, args=(cfg, tuple(plans)), devices=devices,
                 pin_cores=pin_cores, timeout=timeout)
    out = {"launch": res}
    rp = replays.replayed(res)
    on_replay = replays.between_barriers(rp, "between plans", len(res.results[0]))
    for k, entry in enumerate(res.results[0]):
        plan = entry["plan"]
        results = [r[k]["result"] for r in res.results]
        window = res.timeline.window(*entry["window"])
        labels = results[0].get("labels") or {r: f"rank {r}" for r in range(4)}
        ranks = [0, 1] if plan == "pp" else [0, 1, 2, 3]
        if plan == "pp":
            labels = {0: "rank 0 · stage 0 (encoder)", 1: "rank 1 · stage 1 (decoder)"}
        elif plan == "dp":
            labels = {r: f"rank {r} · replica {r}" for r in range(4)}
        out[plan] = {"results": results, "ranks": ranks, "dp": entry["dp"],
                     "timeline": Timeline(window.filter(ranks=ranks).spans, labels, ranks),
                     "replayed": replays.lanes_named(
                         rp.window(*on_replay[k]).filter(ranks=ranks),
                         {r: labels[r] for r in ranks}, ranks)}
    return out


def plan_outcome(plan: str, results: list) -> dict:
    """A plan's loss curve (the whole batch's loss per step) and its model state, put
    together from its ranks: replicas' losses averaged, a pipeline's last stage's,
    stages' states merged. Also whether every replica ended identical."""
    from ..metrics import identical, merged
    if plan == "dp":
        return {"losses": list(np.mean([r["losses"] for r in results], axis=0)),
                "state": results[0]["state"], "first_grads": results[0]["first_grads"],
                "replicas_identical": identical(r["state"] for r in results)}
    pipes = [results[0:2]] if plan == "pp" else [results[0:2], results[2:4]]
    losses = np.mean([p[-1]["losses"] for p in pipes], axis=0)
    states = [merged(p) for p in pipes]
    return {"losses": list(losses), "state": states[0],
            "first_grads": merged(pipes[0], "first_grads"),
            "replicas_identical": identical(states)}


def equivalence(runs: dict, reference: dict) -> dict:
    """Per plan: how far its loss curve (relative), its first step's gradients and its
    parameters after the run lie from one device's."""
    from ..metrics import max_difference
    out = {}
    for plan in (p for p in runs if p in PLAN_NAMES):
        got = plan_outcome(plan, runs[plan]["results"])
        ref = np.asarray(reference["losses"])
        out[plan] = {"loss": float(np.max(np.abs(np.asarray(got["losses"]) - ref) / np.abs(ref))),
                     "grads": max_difference(got["first_grads"], reference["first_grads"]),
                     "params": max_difference(got["state"], reference["state"]),
                     "replicas_identical": got["replicas_identical"],
                     "steps": len(got["losses"])}
    return out


def one_device_reference(cfg: UNetConfig = CFG) -> dict:
    """``unet.train_single`` on the notebook's device (one core, or a GPU): what every
    plan is compared with."""
    from ..torch import unet
    from .lab01 import one_device
    with one_device() as device:
        return unet.train_single(cfg, device)


LOSS_TOL, GRAD_TOL = 1e-5, 1e-6


def _strategies_experiment() -> dict:
    return {"equivalence": equivalence(run_plans(), one_device_reference())}


@lessons.lesson("15.strategies_equal_one_device",
                "data parallel on 4 devices, the pipeline cut between encoder and decoder "
                "and dp 2 × pp 2 each train the U-Net like one device: every step's loss "
                "within 1e-5 of one device's (relative), the first step's gradients within "
                "1e-6, every replica identical",
                _strategies_experiment)
def strategies_equal_one_device(m: dict):
    eq = m["equivalence"]
    figures = "; ".join(f"{PLAN_NAMES[p]}: loss {e['loss']:.1e}, gradients {e['grads']:.1e}, "
                        f"parameters after {e['steps']} steps {e['params']:.1e}"
                        for p, e in eq.items())
    off = [f"{PLAN_NAMES[p]} " + ", ".join(
        w for w, bad in (("its loss curve", e["loss"] > LOSS_TOL),
                         ("its gradients", e["grads"] > GRAD_TOL),
                         ("its replicas differ", not e["replicas_identical"])) if bad)
        for p, e in eq.items()
        if e["loss"] > LOSS_TOL or e["grads"] > GRAD_TOL or not e["replicas_identical"]]
    return not off, figures, "off one device: " + "; ".join(off)


# ------------------------------------------------------------------ what crosses the cut
def tensor_elements(name: str, size: int = CFG.size, base: int = CFG.base) -> int:
    """Numbers per image in one of the U-Net's named tensors (models.UNet.BLOCKS): each
    level down halves the side and doubles the channels."""
    side = {"x": size, "e1": size, "e2": size // 2, "b": size // 4, "d2": size // 2,
            "d1": size, "logits": size}[name]
    channels = {"x": 1, "e1": base, "e2": 2 * base, "b": 4 * base, "d2": 2 * base,
                "d1": base, "logits": 3}[name]
    return channels * side * side


def traced_cut_bytes(timeline, rank: int, steps: int, micro_batches: int) -> dict:
    """Bytes per micro-batch that ``rank`` (a stage before the cut) sent forward and
    received back, per tensor name, from its traced spans: {"forward": {name: bytes},
    "backward": {name: bytes}}."""
    out = {"forward": {}, "backward": {}}
    for s in timeline.spans:
        if s.rank != rank or s.kind != "comm" or not s.bytes:
            continue
        if s.name.startswith("isend ") and not s.name.startswith("isend grad"):
            key, name = "forward", s.name[len("isend "):]
        elif s.name.startswith("recv grad "):
            key, name = "backward", s.name[len("recv grad "):]
        else:
            continue
        out[key][name] = out[key].get(name, 0) + s.bytes / (steps * micro_batches)
    return out


def cut_numbers(runs: dict, cfg: UNetConfig = CFG) -> dict:
    """What lesson 15.skips_cross_the_cut reads: the encoder stage's traced bytes per
    micro-batch, per tensor and way, and the cost model's (``sim.Network.unet``: its
    layers' output sizes, 4 bytes a number) for the tensors that cross the cut."""
    from ..torch.models import UNet
    from . import lab15_choose as choose
    net = choose.network(cfg)
    traced = traced_cut_bytes(runs["pp"]["timeline"], 0, cfg.steps, cfg.micro_batches)
    micro = cfg.global_batch // cfg.micro_batches
    at = choose.layer_of_cut(net, cfg.cuts[0])
    names = crossing(UNet.BLOCKS, cfg.cuts[0])
    made_by = {"e1": "enc0.conv1", "e2": "enc1.conv1", "b": "bottleneck.conv1",
               "d2": "dec1.conv1", "d1": "dec0.conv1"}      # each block's last layer
    layers = {layer.name: layer for layer in net.layers}
    formula = {n: 4 * micro * layers[made_by[n]].out_elems for n in names}
    return {"traced": traced, "micro_batch": micro, "cut": cfg.cuts[0], "formula": formula,
            "cut_bytes": net.cut_bytes(at, micro),
            "skips": [n for n in names if n != UNet.BLOCKS[cfg.cuts[0] - 1][0]]}


def _cut_experiment() -> dict:
    return cut_numbers(run_plans((("pp", 1),), pin_cores=False))


@lessons.lesson("15.skips_cross_the_cut",
                "the cut between encoder and decoder is crossed by the bottleneck's "
                "activation and by both skip connections, each micro-batch forward and its "
                "gradient back, the traced bytes equal to the formula; the skips carry most "
                "of them (at least 3/4 here: they are the large, shallow tensors)",
                _cut_experiment)
def skips_cross_the_cut(m: dict):
    traced, formula = m["traced"], m["formula"]
    total = m["cut_bytes"]
    skips = sum(formula[n] for n in m["skips"])
    figures = (f"per micro-batch of {m['micro_batch']} images, forward " + ", ".join(
        f"{n} {traced['forward'].get(n, 0):,.0f} B (formula {formula[n]:,})" for n in formula)
        + f"; back the same{'' if traced['backward'] == traced['forward'] else ' NOT'}; the "
        f"skips {', '.join(m['skips'])}: {skips / total:.0%} of {total:,.0f} B")
    off = [f"{way} {n}: traced {traced[way].get(n, 0):,.0f}, formula {formula[n]:,}"
           for way in ("forward", "backward") for n in formula
           if abs(traced[way].get(n, 0) - formula[n]) > 0.5]
    extra = sorted(set(traced["forward"]) - set(formula))
    if extra:
        off.append(f"tensors sent that the formula does not name: {extra}")
    if abs(sum(formula.values()) - total) > 0.5:
        off.append(f"the named tensors add up to {sum(formula.values()):,} B, the cut to {total:,.0f}")
    return not off and skips >= 0.75 * total, figures, "; ".join(off) or (
        f"the skips carried only {skips / total:.0%}")


# ------------------------------------------------------------------ choose, then measure
def single_step_timelines(batches=(2, 4, 16), *, cfg: UNetConfig = CFG, steps: int = 8) -> dict:
    """The U-Net's step on one device (forward, backward, update), per batch size: the
    micro-batches and replica shares the plans compute on, measured before any plan
    runs (the cost model's compute is calibrated on them)."""
    from ..torch import single, unet
    from .lab01 import one_device
    x, y = unet.training_data(cfg)
    with one_device() as device:
        return {b: single.step_timeline(unet.build(cfg), x, y, batch_size=b, steps=steps,
                                        device=device, loss_fn=unet.loss_fn(cfg))
                for b in batches}


MARKERS = {"dp": "forward", "pp": "F0", "dp_pp": "F0"}     # where each plan's step starts


def axis_bytes(plan: str, run: dict, cfg: UNetConfig) -> dict:
    """A plan's bytes per rank per step on each axis, traced and from the formula
    (``lab15_choose.expected_bytes``): {"bytes": {rank: {axis: [traced, formula]}},
    "unexpected_axes": axes that moved bytes no formula names}."""
    from . import lab15_choose as choose
    tl, ranks = run["timeline"], run["ranks"]
    want = choose.expected_bytes(plan, cfg)
    got = {r: {a: b / cfg.steps for a, b in tl.bytes_by_axis(r).items() if b} for r in ranks}
    return {"bytes": {r: {a: [got[r].get(a, 0.0), float(want[r][a])] for a in want[r]}
                      for r in ranks},
            "unexpected_axes": sorted({a for r in ranks for a in got[r]} -
                                      {a for r in ranks for a in want[r]})}


def measured_rows(runs: dict, cfg: UNetConfig) -> dict:
    """Per plan of ``runs``: its median warm step (``steps.step_seconds``), measured and
    replayed, the ranks' share of the measured one spent waiting for a core, and its bytes
    per rank per step on each axis, traced and from the formula (``axis_bytes``)."""
    from ..steps import step_seconds
    return {plan: {"measured_s": step_seconds(runs[plan]["timeline"], MARKERS[plan], skip=2),
                   "replayed_s": step_seconds(runs[plan]["replayed"], MARKERS[plan], skip=2),
                   "replay_source": replays.source(runs[plan]["replayed"]),
                   "core_wait": lessons.core_wait_share(runs[plan]["timeline"],
                                                        runs[plan]["ranks"]),
                   **axis_bytes(plan, runs[plan], cfg)}
            for plan in runs if plan in PLAN_NAMES}


def choice_numbers(rows: dict, choices: dict) -> dict:
    """What lab 15's last lessons read: per plan its measured and PREDICTED step, core
    wait, bytes per axis; the model's pick; how many cores the ranks shared."""
    from . import lab15_choose as choose
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    first = next(iter(rows))
    return {"plans": {p: {**r, "predicted_s": float(choices[p].step_s),
                          "devices": choices[p].devices_used} for p, r in rows.items()},
            "pick": choose.pick(choices), "cores": cores,
            "replay_source": rows[first].get("replay_source", "")}


MEASURE_STEPS = 14        # steps of each plan in the measured launch (the first 2 warm up)


def _choice_experiment() -> dict:
    from dataclasses import replace

    from . import lab15_choose as choose
    timelines = single_step_timelines()
    cal = choose.calibrate(timelines, run_plans(), CFG, replayed=True)
    choices = choose.predict(cal, CFG)
    cfg = replace(CFG, steps=MEASURE_STEPS)
    return choice_numbers(measured_rows(run_plans(cfg=cfg), cfg), choices)


@lessons.lesson("15.axis_bytes_match_formula",
                "in each plan, every rank moves per step, on each mesh axis, the bytes its "
                "formula gives (pp: 2 × the cut's tensors × m micro-batches; dp: 4 bytes per "
                "parameter the rank holds), to the byte",
                _choice_experiment)
def axis_bytes_match_formula(m: dict):
    pairs = [(p, r, a, got, want) for p, x in m["plans"].items()
             for r, axes in x["bytes"].items() for a, (got, want) in axes.items()]
    off = [q for q in pairs if abs(q[3] - q[4]) > 0.5]
    extra = [(p, x["unexpected_axes"]) for p, x in m["plans"].items() if x["unexpected_axes"]]
    figures = (f"{len(pairs) - len(off)} of {len(pairs)} (plan, rank, axis) counts match "
               f"their formula (" + ", ".join(
                   f"{PLAN_NAMES[p]}: " + ", ".join(f"{a} {w:,.0f} B" for a, (_, w) in
                                                   x["bytes"][min(x["bytes"])].items())
                   for p, x in m["plans"].items()) + " on its first rank)")
    why = "; ".join([f"{PLAN_NAMES[p]} rank {r} {a}: traced {g:,.0f}, formula {w:,.0f}"
                     for p, r, a, g, w in off[:3]]
                    + [f"{PLAN_NAMES[p]} moved bytes on {axes}, which no formula names"
                       for p, axes in extra])
    return not off and not extra, figures, why


CHOICE_MARGIN = 1.3       # the pick's replayed step against the other plan on all devices


@lessons.lesson("15.the_choice_holds_here",
                "of the plans that use all 4 devices, the one the cost model predicts "
                "quickest also takes the quickest step replayed on dedicated devices, at "
                "least 1.3x quicker than the other",
                _choice_experiment)
def the_choice_holds_here(m: dict):
    plans, pick = m["plans"], m["pick"]
    others = [p for p, x in plans.items() if p != pick and x["devices"] == plans[pick]["devices"]]
    if not others:
        return False, f"only {PLAN_NAMES[pick]} was measured", "nothing to compare it with"
    rival = min(others, key=lambda p: plans[p]["replayed_s"])
    margin = plans[rival]["replayed_s"] / plans[pick]["replayed_s"]
    figures = (f"the model's pick {PLAN_NAMES[pick]}: {plans[pick]['replayed_s'] * 1e3:.1f} ms "
               f"replayed (PREDICTED {plans[pick]['predicted_s'] * 1e3:.1f} ms); "
               f"{PLAN_NAMES[rival]}: {plans[rival]['replayed_s'] * 1e3:.1f} ms replayed "
               f"(PREDICTED {plans[rival]['predicted_s'] * 1e3:.1f} ms): {margin:.2f}x")
    why = (f"the cost model gave {PLAN_NAMES[rival]} "
           f"{plans[rival]['predicted_s'] / plans[pick]['predicted_s']:.2f}x the pick's step "
           "(PREDICTED)")
    return margin >= CHOICE_MARGIN, figures, why, m.get("replay_source", "")


# ------------------------------------------------------------------ exercise 15.1: what crosses a cut
def _cut_bytes(cut, micro_batch, size=32, base=8):
    # every tensor made before the cut and read after it crosses, forward; its gradient
    # (as many numbers) comes back; 4 bytes a number
    from ..torch.models import UNet
    numbers = sum(tensor_elements(n, size, base) for n in crossing(UNet.BLOCKS, cut))
    return (4 * micro_batch * numbers, 4 * micro_batch * numbers)


register(Exercise(
    name="cut_bytes",
    reference=_cut_bytes,
    cases=[(c, mb, s, b) for c in range(1, 6) for mb, s, b in ((4, 32, 8), (1, 64, 16), (3, 128, 4))],
    hint="list, for the cut, every tensor made by a block before it and read by a block after "
         "it (the skips e1 and e2 are read by the decoder, far away); each image's tensor has "
         "channels × side × side numbers, the side halving and the channels doubling at each "
         "level down; forward and backward move the same amount; a float32 is 4 bytes.",
    close=lambda got, want: tuple(got) == tuple(want),
))


def traced_bytes_at_cuts(cuts=(1, 2, 3, 4, 5), *, cfg: UNetConfig = CFG, devices=None) -> dict:
    """Run a 2-stage pipeline of the U-Net cut at each block boundary in ``cuts`` (one
    step, one launch) and count, per cut, the bytes the first stage sent forward and
    received back per micro-batch (traced): {cut: (forward, backward)}."""
    from dataclasses import replace

    from ..torch import unet
    one = replace(cfg, steps=1)
    res = launch(unet.pipeline_at_cuts, 2, args=(one, tuple(cuts)), devices=devices, timeout=120)
    out = {}
    for entry in res.results[0]:
        t = traced_cut_bytes(res.timeline.window(*entry["window"]), 0, 1, cfg.micro_batches)
        out[entry["cut"]] = (sum(t["forward"].values()), sum(t["backward"].values()))
    return out


def check_cut_bytes(fn, *, cfg: UNetConfig = CFG, devices=None):
    """Exercise 15.1: the learner's ``fn(cut, micro_batch, size, base) -> (forward,
    backward)`` bytes, first against the reference on several U-Nets, then against the
    bytes a real 2-stage pipeline traced at every cut of the lab's U-Net. Returns the
    function to use next."""
    from .exercise import EXERCISES
    use = check("cut_bytes", fn)
    if use is not fn:
        return use
    micro = cfg.global_batch // cfg.micro_batches
    traced = traced_bytes_at_cuts(cfg=cfg, devices=devices)
    wrong = [f"cut {c}: yours {fn(c, micro, cfg.size, cfg.base)}, traced "
             f"({t[0]:,.0f}, {t[1]:,.0f})" for c, t in traced.items()
             if tuple(fn(c, micro, cfg.size, cfg.base)) != t]
    if wrong:
        print("[cut_bytes] right on paper, yet a real pipeline sent other bytes:\n  "
              + "\n  ".join(wrong) + "\nThe lab goes on with the reference.")
        return EXERCISES["cut_bytes"].reference
    print(f"[cut_bytes] and on 2 real ranks, at every cut of the lab's U-Net, your bytes per "
          f"micro-batch of {micro} images equal the traced ones: " + ", ".join(
              f"cut {c} {t[0] / 1e3:,.0f} kB" for c, t in traced.items()))
    return fn
