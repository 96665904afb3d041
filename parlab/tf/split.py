"""Lab 02 in TensorFlow: model segments placed with ``tf.device``.

One process; each segment's variables are created under its device, and its forward
pass runs there, so activations cross devices between segments. A single GradientTape
differentiates through all of them. On logical CPU devices (``parlab.devices(n,
framework="tf")``) the placement is real but the devices share one thread pool.
"""
from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf

from .. import data as datasets
from ..split import SplitConfig, check_bounds
from ..trace import COMPUTE, Span, Timeline


def build_placed(cfg: SplitConfig, devices) -> list[tuple[str, list]]:
    """Dense layers of ``cfg.sizes``, grouped into stages and built on their devices.

    Returns [(device, [layers])] per stage. Layer i is initialised with seed
    ``cfg.seed + i`` wherever it lives, so any placement starts from the same weights.
    """
    if cfg.model != "mlp":
        raise ValueError("the TensorFlow split builds the MLP; set model='mlp'")
    n_layers = len(cfg.sizes) - 1
    bounds = check_bounds(cfg.bounds, n_layers, len(devices))
    edges = [0, *bounds, n_layers]
    stages = []
    for k, device in enumerate(devices):
        layers = []
        with tf.device(device):
            for i in range(edges[k], edges[k + 1]):
                last = i == n_layers - 1
                layer = keras.layers.Dense(
                    cfg.sizes[i + 1], activation=None if last else "relu",
                    kernel_initializer=keras.initializers.GlorotUniform(seed=cfg.seed + i),
                    name=f"dense_{i}")
                layer.build((None, cfg.sizes[i]))
                layers.append(layer)
        stages.append((device, layers))
    return stages


def forward(stages, x, spans: list | None = None):
    """Run the stages in order, each under its device; optionally time each stage."""
    for k, (device, layers) in enumerate(stages):
        t0 = time.perf_counter()
        with tf.device(device):
            for layer in layers:
                x = layer(x)
        if spans is not None:
            _ = x.numpy()  # eager CPU ops are done when they return; this makes sure
            spans.append(Span(k, COMPUTE, "forward", t0, time.perf_counter()))
    return x


def device_of(variable) -> str:
    """Where a Keras variable lives (Keras 3 wraps the tf.Variable in ``.value``)."""
    dev = tf.DeviceSpec.from_string(getattr(variable, "value", variable).device)
    return f"/device:{dev.device_type}:{dev.device_index}"


def variables(stages):
    return [v for _, layers in stages for layer in layers for v in layer.trainable_variables]


def bytes_per_device(stages) -> dict[str, int]:
    """Variable bytes grouped by the device each variable actually lives on."""
    out: dict[str, int] = {}
    for v in variables(stages):
        name = device_of(v)
        out[name] = out.get(name, 0) + int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size
    return out


def train(cfg: SplitConfig, devices, *, timeline: bool = False) -> dict:
    """Train the placed model with plain SGD (``var -= lr * grad``) on fixed batches."""
    if cfg.optimizer != "sgd":
        raise ValueError("the TensorFlow split uses plain SGD; set optimizer='sgd'")
    stages = build_placed(cfg, devices)
    params = variables(stages)
    x, y = datasets.digits("train")
    batches = datasets.endless_batches(x, y, cfg.batch_size)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    out = {"losses": [], "placement": {v.path: device_of(v) for v in params}}
    spans: list[Span] = []
    for step in range(cfg.steps):
        xb, yb = next(batches)
        with tf.GradientTape() as tape:
            logits = forward(stages, tf.constant(xb), spans if timeline else None)
            loss = loss_fn(yb, logits)
        t0 = time.perf_counter()
        grads = tape.gradient(loss, params)
        for v, g in zip(params, grads):
            v.assign_sub(cfg.lr * g)
        if timeline:
            _ = params[-1].numpy()
            spans.append(Span(len(stages), COMPUTE, "backward + update", t0, time.perf_counter()))
        if step == 0:
            out["first_logits"] = logits.numpy()
            out["first_grads"] = [g.numpy() for g in grads]
        out["losses"].append(float(loss))
    out["weights"] = [v.numpy() for v in params]
    out["bytes_per_device"] = bytes_per_device(stages)
    if timeline:
        labels = {k: f"stage {k} · {d} (logical)" for k, (d, _) in enumerate(stages)}
        labels[len(stages)] = "tape.gradient, all stages"
        out["timeline"] = Timeline(spans, labels)
    return out
