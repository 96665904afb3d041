"""Lab 01 (labs/01_single_device.ipynb): its exercises (memory of a step and of training)
and its lessons (the models learn; throughput against the batch size)."""
from __future__ import annotations

import contextlib
import os
import time

from . import lessons
from .exercise import Exercise, check, register  # noqa: F401 (labNN.check)


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


# ------------------------------------------------------------------ lessons
# Lab 01 runs on one device in the notebook's own process: its experiments call the same
# parlab.torch.single functions as the notebook, with the notebook's settings.
# The batch sizes of the notebook's throughput sweep, four times the batch at each step
# until the device is busy. One CPU core is not quite saturated at 1024 (measured here: the
# step time grew x2.5-3.0 from 256 to 1024, throughput still x1.3-1.6), so the sweep goes
# on to 4096 (the digits repeated). On a GPU the MLP is far from saturated at 1024
# (measured on an H100: the step time grew x1.01-1.03 from 256 to 1024), so there the
# sweep goes on to about a million samples: 256 MB of inputs, a few seconds in all.
SWEEP = (4, 16, 64, 256, 1024, 4096)
GPU_SWEEP = SWEEP + (16384, 65536, 262144, 1048576)


def sweep_sizes(device) -> tuple:
    """The batch sizes of the throughput sweep on ``device``: a GPU needs far larger ones."""
    return GPU_SWEEP if str(device).startswith("cuda") else SWEEP


@contextlib.contextmanager
def one_device():
    """The notebook's device: "cuda:0" on a GPU machine, else the CPU on one thread (a
    simulated device is one core, as the notebook's first cell sets)."""
    import torch

    from ..hardware import devices
    found = devices(1)
    threads = torch.get_num_threads()
    if found.simulated:
        torch.set_num_threads(1)
    try:
        yield found.names[0]
    finally:
        torch.set_num_threads(threads)


def mlp_numbers(history: dict, y_test) -> dict:
    """What lesson 01.mlp_learns_digits reads from ``single.train``'s history: the test
    accuracy after the last epoch, and chance (the share of the commonest digit)."""
    import numpy as np
    return {"accuracy": history["test_accuracy"][-1],
            "chance": float(np.bincount(y_test).max() / len(y_test)),
            "loss": (history["loss"][0], history["loss"][-1])}


def _mlp_experiment() -> dict:
    import torch

    from .. import data
    from ..torch import models, single
    x_train, y_train = data.digits("train")
    x_test, y_test = data.digits("test")
    with one_device() as device:        # the notebook's training cell, without the bar
        torch.manual_seed(0)
        history = single.train(models.mlp((64, 256, 256, 128, 10)), x_train, y_train, epochs=8,
                               batch_size=64, lr=1e-3, x_test=x_test, y_test=y_test,
                               device=device, progress=False)
    return mlp_numbers(history, y_test)


@lessons.lesson("01.mlp_learns_digits",
                "the MLP learns the digits: after 8 epochs its test accuracy is above 90 % "
                "(guessing the commonest digit gets about 10 %)",
                _mlp_experiment)
def mlp_learns_digits(m: dict):
    first, last = m["loss"]
    figures = (f"test accuracy {m['accuracy']:.1%} (always answering the commonest test "
               f"digit: {m['chance']:.1%})")
    return (m["accuracy"] > 0.9, figures,
            f"the training loss went from {first:.3f} to {last:.3f} in 8 epochs")


def throughput_sweep(device="cpu", batch_sizes=None, steps: int = 20):
    """The notebook's sweep: ``single.throughput`` of the course's MLP on the digits for
    each batch size (``sweep_sizes(device)`` unless given; the digits are repeated where a
    batch is larger than the data); returns (its rows, the share of the sweep's time this
    thread waited for a core, measured by Linux; 0.0 where not measured)."""
    import numpy as np

    from .. import core_waits, data
    from ..torch import models, single
    batch_sizes = sweep_sizes(device) if batch_sizes is None else batch_sizes
    x, y = data.digits("train")
    copies = -(-max(batch_sizes) // len(y))            # ceiling: enough rows for the largest batch
    x, y = np.tile(x, (copies, 1)), np.tile(y, copies)
    start, waited = time.perf_counter(), core_waits.read_seconds()
    rows = single.throughput(models.mlp, x, y, list(batch_sizes), steps=steps, device=device)
    return rows, (core_waits.read_seconds() - waited) / (time.perf_counter() - start)


def throughput_numbers(rows: list, core_wait: float = 0.0, device: str = "cpu") -> dict:
    """What lesson 01.throughput_grows_then_levels reads from a sweep: batch sizes, step
    seconds (medians), the core-wait share and the load average while it ran."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {"batch": [r["batch_size"] for r in rows], "step_s": [r["step_s"] for r in rows],
            "core_wait": core_wait, "load": load, "device": device}


def _throughput_experiment() -> dict:
    with one_device() as device:
        rows, core_wait = throughput_sweep(device)
    return throughput_numbers(rows, core_wait, device)


@lessons.lesson("01.throughput_grows_then_levels",
                "throughput grows with the batch while fixed per-step costs dominate (on the "
                "sweep's first step up, the step time at most doubles) and levels off once "
                "the device is saturated (on its last step up, at most 1.5x the samples per "
                "second)",
                _throughput_experiment)
def throughput_grows_then_levels(m: dict):
    b, t = m["batch"], m["step_s"]
    first, last = t[1] / t[0], t[-1] / t[-2]           # step time ratios
    gain_first, gain_last = b[1] / b[0] / first, b[-1] / b[-2] / last
    figures = (f"batch {b[0]} -> {b[1]}: step time x{first:.2f}, throughput x{gain_first:.2f}; "
               f"batch {b[-2]} -> {b[-1]}: step time x{last:.2f}, throughput x{gain_last:.2f}")
    grows, levels = first <= 2.0, gain_last <= 1.5
    why = []
    if not grows:
        why.append(f"the step time more than doubled from batch {b[0]} to {b[1]}: fixed costs "
                   f"did not dominate even the smallest batches")
    if not levels and m["core_wait"] >= 0.1:
        why.append(f"the step time grew only x{last:.2f} for x{b[-1] // b[-2]} the batch: "
                   f"the sweep waited for a core, and a step that waits the same time at "
                   f"every batch size hides how the work grew")
    elif not levels:
        why.append(f"the step time grew only x{last:.2f} for x{b[-1] // b[-2]} the batch: "
                   f"{m['device']} was not saturated at batch {b[-1]}")
    why.append(f"{m['core_wait']:.0%} of the sweep waiting for a core, load average "
               f"{m['load']:.1f}")
    return grows and levels, figures, "; ".join(why)


OTHER_MODELS = {   # name: (model, data set, epochs, learning rate, batch size)
    "CNN, digits": (lambda models: models.cnn(16), "digits", 4, 1e-3, 32),
    "deep LSTM, waves": (lambda models: models.deep_lstm(layers=3, hidden=32), "waves", 6, 3e-3, 32),
    "U-Net, shapes (pixels)": (lambda models: models.unet(8), "shapes", 60, 3e-3, 16),
}


def _other_data(name: str):
    from .. import data
    if name == "digits":
        return (data.digits("train", flat=False)[0], data.digits("train")[1],
                data.digits("test", flat=False)[0], data.digits("test")[1])
    if name == "waves":
        return (*data.waves(1024, seed=0), *data.waves(256, seed=1))
    return (*data.shapes(192, seed=0), *data.shapes(64, seed=1))


def score(pred, y) -> float:
    """A classifier's accuracy; for masks (one label per pixel), the mean IoU of the
    foreground classes (all but class 0, the background): the pixels both the prediction
    and the mask give a class, over those either gives it. Pixel accuracy would flatter
    a model that paints everything background, as most pixels are."""
    import numpy as np
    if y.ndim == 1:
        return float((pred == y).mean())
    ious = [((pred == c) & (y == c)).sum() / ((pred == c) | (y == c)).sum()
            for c in range(1, int(y.max()) + 1) if ((pred == c) | (y == c)).any()]
    return float(np.mean(ious))


def train_other_models(device="cpu") -> dict:
    """Train each of ``OTHER_MODELS`` from seed 0; per model its settings, its loss
    (first, last step), its score on the test data before and after (``score``), and the
    score of predicting the commonest training label for every sample (or pixel)."""
    import numpy as np
    import torch

    from ..torch import models, single
    out = {}
    for name, (make, data_set, epochs, lr, batch) in OTHER_MODELS.items():
        xtr, ytr, xte, yte = _other_data(data_set)
        torch.manual_seed(0)
        model = make(models).to(device)

        def test_score():
            model.eval()
            with torch.no_grad():
                return score(model(torch.as_tensor(xte, device=device)).argmax(1).cpu().numpy(), yte)
        before = test_score()
        h = single.train(model, xtr, ytr, epochs=epochs, batch_size=batch, lr=lr,
                         device=device, progress=False)
        out[name] = {"epochs": epochs, "lr": lr, "batch": batch, "before": before,
                     "after": test_score(), "loss": (h["loss"][0], h["loss"][-1]),
                     "baseline": score(np.full_like(yte, np.bincount(ytr.ravel()).argmax()), yte),
                     "measure": "accuracy" if yte.ndim == 1 else "mean IoU of disc and square",
                     "model": model}
    return out


def baseline_name(run: dict) -> str:
    """What a run's baseline score is the score of, in words: for masks (IoU) every pixel
    painted with the commonest training label, which is background."""
    if "IoU" in run["measure"]:
        return "every pixel painted background, the commonest training label"
    return "always answering the commonest training label"


def other_models_numbers(runs: dict) -> dict:
    """What lesson 01.models_learn_their_data reads from ``train_other_models``."""
    return {name: {k: v for k, v in r.items() if k != "model"} for name, r in runs.items()}


def _other_models_experiment() -> dict:
    with one_device() as device:
        return other_models_numbers(train_other_models(device))


@lessons.lesson("01.models_learn_their_data",
                "each of the CNN, the deep LSTM and the U-Net learns its data: on test data "
                "it gets at least halfway from predicting the commonest label to perfect "
                "(accuracy; for the U-Net's pixels, the mean IoU of disc and square, where "
                "painting everything background scores 0)",
                _other_models_experiment)
def models_learn_their_data(m: dict):
    figures = ", ".join(f"{name.split(',')[0]} {r['measure']} {r['after']:.2f} "
                        f"({baseline_name(r)}: {r['baseline']:.2f})" for name, r in m.items())
    short = [name for name, r in m.items() if r["after"] < (1 + r["baseline"]) / 2]
    why = "; ".join(f"{name.split(',')[0]} only {m[name]['after']:.2f} after {m[name]['epochs']} "
                    f"epochs, its training loss {m[name]['loss'][0]:.3f} -> "
                    f"{m[name]['loss'][1]:.3f}" for name in short)
    return not short, figures, why
