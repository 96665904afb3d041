"""Lab 01 in TensorFlow: a custom GradientTape loop, Keras ``fit``, and what a step costs."""
from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf

from .. import data as datasets
from ..trace import Timeline, recording, span


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def compiled_step(model, opt, loss_fn):
    """One training step traced into a graph (tf.function), as production loops do."""
    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step


def accuracy(model, x, y) -> float:
    return float((np.argmax(model(x, training=False).numpy(), axis=1) == y).mean())


def train_custom(model, x, y, *, epochs: int = 5, batch_size: int = 64, lr: float = 1e-3,
                 progress: bool = True, x_test=None, y_test=None, seed: int = 0) -> dict:
    """The custom training loop: forward under a GradientTape, gradients, apply (Adam)."""
    from .. import progress as bars

    step = compiled_step(model, keras.optimizers.Adam(lr), _loss())

    history = {"loss": [], "test_accuracy": []}
    bar = bars.bar(epochs * (len(y) // batch_size), "training (GradientTape)", progress)
    for epoch in range(epochs):
        for xb, yb in datasets.batches(x, y, batch_size, seed=seed + epoch):
            loss = float(step(tf.constant(xb), tf.constant(yb)))
            history["loss"].append(loss)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if x_test is not None:
            history["test_accuracy"].append(accuracy(model, x_test, y_test))
    bars.finish(bar, history["loss"][-1] if history["loss"] else None)
    return history


def train_fit(model, x, y, *, epochs: int = 5, batch_size: int = 64, lr: float = 1e-3,
              verbose: int = 2, x_test=None, y_test=None) -> dict:
    """The same training through Keras ``compile`` + ``fit`` (which prints its progress)."""
    model.compile(optimizer=keras.optimizers.Adam(lr), loss=_loss(), metrics=["accuracy"])
    val = (x_test, y_test) if x_test is not None else None
    hist = model.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=verbose,
                     validation_data=val, shuffle=True)
    return hist.history


def step_timeline(model, x, y, *, batch_size: int = 64, steps: int = 5,
                  label: str = "/device:CPU:0") -> Timeline:
    """Measured eager steps split into data, forward, backward, update.

    Eager mode, so that each phase is a separate call that can be timed; ``.numpy()``
    at the end of a phase waits for its result.
    """
    opt = keras.optimizers.Adam(1e-3)
    loss_fn = _loss()
    batches = datasets.batches(x, y, batch_size, seed=0)
    with recording() as rec:
        for i in range(steps + 1):  # the first step builds the optimizer: dropped
            if i == 1:
                rec.clear()
            with span("data"):
                xb, yb = next(batches)
                xb, yb = tf.constant(xb), tf.constant(yb)
            with span("forward"):
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb, model(xb, training=True))
                loss.numpy()
            with span("backward"):
                grads = tape.gradient(loss, model.trainable_variables)
                grads[-1].numpy()
            with span("update"):
                opt.apply_gradients(zip(grads, model.trainable_variables))
                model.trainable_variables[-1].numpy()
    return rec.timeline({0: f"rank 0 · {label}"})


def memory_estimate(model: keras.Sequential, batch_size: int, optimizer_slots: int = 2) -> dict:
    """Memory computed from the model: weights, their gradients, optimizer slots, and
    every layer's output for one batch (the activations)."""
    params = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    acts = sum(int(np.prod(layer.output.shape[1:])) * batch_size * 4 for layer in model.layers)
    return {"parameters": params, "gradients": params,
            "optimizer state": optimizer_slots * params, "activations": acts}


def throughput(make_model, x, y, batch_sizes, *, steps: int = 10) -> list[dict]:
    """Samples per second of a compiled (tf.function) training step per batch size."""
    out = []
    for bs in batch_sizes:
        step = compiled_step(make_model(), keras.optimizers.Adam(1e-3), _loss())

        xb, yb = tf.constant(x[:bs]), tf.constant(y[:bs])
        times = []
        for i in range(steps + 2):  # tracing and a warm-up step are dropped
            t0 = time.perf_counter()
            step(xb, yb).numpy()
            if i >= 2:
                times.append(time.perf_counter() - t0)
        t = float(np.median(times))
        out.append({"batch_size": bs, "step_s": t, "samples_per_s": bs / t})
    return out
