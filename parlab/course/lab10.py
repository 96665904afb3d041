"""Lab 10 (labs/10_capstone_unet.ipynb): one model from start to end. A U-Net that
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
from . import lessons
from .exercise import Exercise, check, register  # noqa: F401 (labNN.check)

CFG = UNetConfig()        # global batch 16, Adam 3e-3, 4 micro-batches, cut encoder | decoder
EPOCHS = 30               # of the 192 training images, for the U-Net that learns
TEST_IMAGES = 64          # parlab.data.shapes(64, seed=1): images no step trained on
MIN_IOU = 0.5             # lesson 10.unet_learns_the_shapes: each shape's IoU at least this
PLAN_NAMES = {"dp": "dp 4", "pp": "pp 2 (encoder | decoder)", "dp_pp": "dp 2 × pp 2"}


def test_data(cfg: UNetConfig = CFG):
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
    import torch

    from ..torch import serve, single, unet
    from .lab01 import one_device
    x, y = unet.training_data(cfg)
    xt, yt = test_data(cfg)
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
            "background_share": float((yt == 0).mean()), "torch": torch.__version__}


def learn_numbers(run: dict) -> dict:
    """What lesson 10.unet_learns_the_shapes reads from ``train_unet``."""
    return {"iou": dict(run["iou"]), "iou_background": dict(run["iou_background"]),
            "iou_before": dict(run["iou_before"]), "epochs": run["epochs"],
            "loss": (run["history"]["loss"][0], run["history"]["loss"][-1]),
            "pixel_accuracy": run["pixel_accuracy"], "background_share": run["background_share"]}


def _learn_experiment() -> dict:
    return learn_numbers(train_unet(progress=False))


@lessons.lesson("10.unet_learns_the_shapes",
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
    named by mesh coordinates), "ranks" (those that trained)}} and "launch"."""
    from ..torch import unet
    from ..trace import Timeline
    res = launch(unet.measure_plans, 4, args=(cfg, tuple(plans)), devices=devices,
                 pin_cores=pin_cores, timeout=timeout)
    out = {"launch": res}
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
                     "timeline": Timeline(window.filter(ranks=ranks).spans, labels, ranks)}
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


LOSS_TOL, GRAD_TOL = 1e-5, 1e-6


def _strategies_experiment() -> dict:
    from ..torch import unet
    return {"equivalence": equivalence(run_plans(), unet.train_single(CFG))}


@lessons.lesson("10.strategies_equal_one_device",
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
    """What lesson 10.skips_cross_the_cut reads: the encoder stage's traced bytes per
    micro-batch, per tensor and way, and the formula's (4 bytes a number)."""
    from ..torch.models import UNet
    run = runs["pp"]
    traced = traced_cut_bytes(run["timeline"], 0, cfg.steps, cfg.micro_batches)
    micro = cfg.global_batch // cfg.micro_batches
    names = crossing(UNet.BLOCKS, cfg.cuts[0])
    return {"traced": traced, "micro_batch": micro, "cut": cfg.cuts[0],
            "formula": {n: 4 * micro * tensor_elements(n, cfg.size, cfg.base) for n in names},
            "skips": [n for n in names if n != UNet.BLOCKS[cfg.cuts[0] - 1][0]]}


def _cut_experiment() -> dict:
    return cut_numbers(run_plans((("pp", 1),), pin_cores=False))


@lessons.lesson("10.skips_cross_the_cut",
                "the cut between encoder and decoder is crossed by the bottleneck's "
                "activation and by both skip connections, each micro-batch forward and its "
                "gradient back, the traced bytes equal to the formula; the skips carry most "
                "of them (at least 3/4 here: they are the large, shallow tensors)",
                _cut_experiment)
def skips_cross_the_cut(m: dict):
    traced, formula = m["traced"], m["formula"]
    total = sum(formula.values())
    skips = sum(formula[n] for n in m["skips"])
    figures = (f"per micro-batch of {m['micro_batch']} images, forward " + ", ".join(
        f"{n} {traced['forward'].get(n, 0):,.0f} B (formula {formula[n]:,})" for n in formula)
        + f"; back the same{'' if traced['backward'] == traced['forward'] else ' NOT'}; the "
        f"skips {', '.join(m['skips'])}: {skips / total:.0%} of {total:,} B")
    off = [f"{way} {n}: traced {traced[way].get(n, 0):,.0f}, formula {formula[n]:,}"
           for way in ("forward", "backward") for n in formula
           if abs(traced[way].get(n, 0) - formula[n]) > 0.5]
    extra = sorted(set(traced["forward"]) - set(formula))
    if extra:
        off.append(f"tensors sent that the formula does not name: {extra}")
    return not off and skips >= 0.75 * total, figures, "; ".join(off) or (
        f"the skips carried only {skips / total:.0%}")


# ------------------------------------------------------------------ TensorFlow, as the source did
def run_tf_mirrored_fit(tf_devices, cfg: UNetConfig = CFG, images: int = 96) -> dict:
    """The TensorFlow U-Net trained by Keras ``fit`` on one device and under
    ``MirroredStrategy`` over ``tf_devices`` (logical CPUs, or GPUs), from the same
    weights, on the first ``images`` training images in order: both runs, and the
    weights they started from (for the multi-worker run)."""
    from ..tf import data_parallel as tf_dp
    from ..tf import unet as tf_unet
    weights = tf_unet.initial_weights(cfg)
    one = tf_unet.fit(cfg, weights, None, n=images)
    mirrored = tf_unet.fit(cfg, weights, tf_dp.mirrored(tf_devices.names), n=images)
    return {"one": one, "mirrored": mirrored, "initial_weights": weights}


def run_tf_multi_worker(weights, cfg: UNetConfig = CFG, workers: int = 2,
                        timeout: float = 180.0) -> LaunchResult:
    """``MultiWorkerMirroredStrategy``: ``workers`` TensorFlow processes, each given its
    TF_CONFIG (ports on 127.0.0.1 chosen here), the custom loop from ``weights``."""
    from ..tf.cluster import free_ports
    from ..tf.unet import multi_worker
    return launch(multi_worker, workers, args=(free_ports(workers), cfg, weights),
                  process_group=False, timeout=timeout, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


def weight_difference(a, b) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


# ------------------------------------------------------------------ serving
def serve_in_fresh_process(model, images, *, cfg: UNetConfig = CFG, folder: str = "models",
                           timeout: float = 120.0) -> dict:
    """Save the trained U-Net to ``folder``, then segment ``images`` in a new Python
    process that loads it (``python -m parlab.torch.serve``), as a server would.

    Returns {"masks", "path", "said" (the process's own line), "pid"}.
    """
    import subprocess
    import sys
    import tempfile

    from ..torch import serve
    os.makedirs(folder, exist_ok=True)
    path = serve.save(model, os.path.join(folder, "unet_shapes.pt"), base=cfg.base,
                      size=cfg.size)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "images.npy"), os.path.join(tmp, "masks.npy")
        np.save(src, np.asarray(images, dtype=np.float32))
        done = subprocess.run([sys.executable, "-m", "parlab.torch.serve", path, src, dst],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": _package_root()})
        if done.returncode:
            raise RuntimeError(f"the serving process failed (exit {done.returncode}):\n"
                               f"{done.stderr[-2000:]}")
        masks = np.load(dst)
    said = done.stdout.strip().splitlines()[-1]
    return {"masks": masks, "path": path, "said": said, "pid": int(said.split()[1].rstrip(":"))}


def _package_root() -> str:
    """The folder holding this ``parlab``, ahead of any PYTHONPATH already set: the new
    process imports the same package as the notebook."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def show_segmentations(images, masks, truth, *, title: str):
    """Each image beside the mask the model gave it and the true mask."""
    from matplotlib.colors import ListedColormap

    from .. import plot
    plt = plot.pyplot()
    colors = ListedColormap(["#f2f2f2", plot.OKABE_ITO["blue"], plot.OKABE_ITO["orange"]])
    n = len(images)
    fig, axes = plt.subplots(n, 3, figsize=(8.5, 2.9 * n), squeeze=False)
    for i in range(n):
        for ax, pic, what in ((axes[i][0], images[i][0], "image"),
                              (axes[i][1], masks[i], "mask from the served model"),
                              (axes[i][2], truth[i], "true mask")):
            if what == "image":
                ax.imshow(pic, cmap="gray")
            else:
                ax.imshow(pic, cmap=colors, vmin=0, vmax=2, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(what, fontsize=12)
    fig.suptitle(title, fontsize=13)
    fig.text(0.5, 0.005, "grey: background   blue: disc   orange: square", ha="center",
             fontsize=11)
    return plot.finish(fig)
