"""Lab 15 in TensorFlow: the same U-Net (``models.unet``), trained as the course's source
material trained it: Keras ``fit`` on one device and under ``MirroredStrategy``, and a
custom ``GradientTape`` loop on one device and under ``MultiWorkerMirroredStrategy``
(two processes, each told its place by ``TF_CONFIG``). Every run starts from the same
weights (``initial_weights``), so each can be compared with one device.

The loss is the PyTorch lab's: each pixel's cross-entropy times its class's weight,
averaged over the pixels (``weighted_loss``); Keras's default reduction of per-pixel
losses is that mean. Under a strategy, each replica divides its share by the GLOBAL
number of pixels and the replicas' gradients are summed: the whole batch's mean.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .. import data as datasets
from ..split import UNetConfig
from .cluster import tf_config


def images(cfg: UNetConfig, n: int | None = None):
    """The training shapes, channels last as Keras wants them: (n, size, size, 1)."""
    x, y = datasets.shapes(cfg.images, cfg.size, seed=0)
    n = n or len(y)
    return np.ascontiguousarray(x[:n].transpose(0, 2, 3, 1)), y[:n]


def weighted_loss(weights):
    """Per-pixel weighted cross-entropy (shape: batch × size × size), for Keras to average."""
    import tensorflow as tf
    w = tf.constant(np.asarray(weights, dtype=np.float32))

    def loss(masks, logits):
        masks = tf.cast(masks, tf.int32)
        per_pixel = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=masks, logits=logits)
        return tf.gather(w, masks) * per_pixel
    return loss


def _optimizer(cfg: UNetConfig):
    import keras
    return (keras.optimizers.Adam(cfg.lr) if cfg.optimizer == "adam"
            else keras.optimizers.SGD(cfg.lr))


def initial_weights(cfg: UNetConfig) -> list:
    """The U-Net's starting weights (seeded), to hand to every run."""
    import keras

    from . import models
    keras.utils.set_random_seed(cfg.seed)
    return models.unet(cfg.base, cfg.size).get_weights()


def _model(cfg: UNetConfig, weights):
    from . import models
    model = models.unet(cfg.base, cfg.size)
    model.set_weights(weights)
    return model


def fit(cfg: UNetConfig, weights, strategy=None, epochs: int = 1, n: int | None = None) -> dict:
    """Keras ``compile`` + ``fit`` from ``weights``, under ``strategy`` (None: one device),
    on the first ``n`` training images in a fixed order; the loss of every step and the
    weights after."""
    import contextlib

    import keras

    class StepLosses(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            losses.append(float(logs["loss"]))

    losses: list[float] = []
    x, y = images(cfg, n)
    weights_ = datasets.class_weights(datasets.shapes(cfg.images, cfg.size, seed=0)[1])
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = _model(cfg, weights)
        model.compile(_optimizer(cfg), weighted_loss(weights_))
    model.fit(x, y, batch_size=cfg.global_batch, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[StepLosses()])
    # Keras reports each step's loss as the mean so far of the epoch: undo the mean
    k = len(x) // cfg.global_batch
    per_step = []
    for e in range(epochs):
        run = losses[e * k:(e + 1) * k]
        per_step += [run[0]] + [(i + 1) * run[i] - i * run[i - 1] for i in range(1, len(run))]
    return {"losses": per_step, "weights": model.get_weights(),
            "replicas": strategy.num_replicas_in_sync if strategy is not None else 1}


def custom_loop(cfg: UNetConfig, weights, strategy=None, rows: slice = slice(None)) -> dict:
    """The ``GradientTape`` loop for ``cfg.steps`` steps from ``weights``: under
    ``strategy`` this process's replica computes on ``rows`` of each global batch and
    divides its loss by the whole batch's pixels; the optimizer sums the replicas'
    gradients (an all-reduce). None: one device, the whole batch."""
    import contextlib

    import tensorflow as tf

    x, y = images(cfg)
    loss_fn = weighted_loss(datasets.class_weights(datasets.shapes(cfg.images, cfg.size,
                                                                   seed=0)[1]))
    pixels = cfg.global_batch * cfg.size * cfg.size
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = _model(cfg, weights)
        opt = _optimizer(cfg)

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(yb, model(xb, training=True))) / pixels
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        return loss

    @tf.function
    def step(xb, yb):
        if strategy is None:
            return replica_step(xb, yb)
        return strategy.run(replica_step, args=(xb, yb))

    losses = []
    for _, (xb, yb) in zip(range(cfg.steps), datasets.endless_batches(x, y, cfg.global_batch)):
        losses.append(float(step(tf.constant(xb[rows]), tf.constant(yb[rows]))))
    return {"losses": losses, "weights": model.get_weights()}


def multi_worker(rank: int, world_size: int, ports, cfg: UNetConfig, weights) -> dict:
    """Rank function for ``parlab.launch(..., process_group=False)``: one TF worker task
    per process, told its place in the cluster by ``TF_CONFIG``.

    Keras 3 ``fit`` fails under MultiWorkerMirroredStrategy in this TensorFlow (see
    PLATFORM-NOTES), so this is the custom loop: each worker computes on its share of
    every global batch; its returned losses are its share of the batch's loss (they add
    up to the whole batch's).
    """
    config = tf_config(ports, rank)
    os.environ["TF_CONFIG"] = json.dumps(config)  # must be set before the strategy starts
    from ..hardware import quiet_tensorflow
    quiet_tensorflow()
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    share = cfg.global_batch // world_size
    out = custom_loop(cfg, weights, strategy, slice(rank * share, (rank + 1) * share))
    out.update(tf_config=config, pid=os.getpid())
    return out
