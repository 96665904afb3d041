"""Lab 05 in TensorFlow: synchronous data parallelism. MirroredStrategy on one machine,
MultiWorkerMirroredStrategy across processes configured by TF_CONFIG.

Both keep one copy of every variable per replica (a MirroredVariable) and apply the same
averaged update to all of them. (The module is named like its PyTorch twin,
``parlab.torch.data_parallel``: the same lab, the same idea.)
"""
from __future__ import annotations

import json
import os

import numpy as np

from .cluster import tf_config


def _loss_fn(keras):
    # per-example losses, summed and divided by the GLOBAL batch: averaging over
    # replicas then gives the mean over the whole batch
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def mirrored(devices):
    """``MirroredStrategy`` over ``devices``.

    On GPUs TensorFlow all-reduces with NCCL by default, which needs each replica on a
    GPU of its own (NCCL refuses two ranks on one device, NVIDIA/nccl#418). Logical GPUs
    split from one GPU (``parlab.devices(n, framework="tf", mode="shared-gpu")``) reduce
    through one device instead (``tf.distribute.ReductionToOneDevice``). Not yet run on
    a GPU: see the README's GPU section.
    """
    import tensorflow as tf
    gpus = [d for d in devices if "GPU" in str(d).upper()]
    if gpus and len(gpus) > len(tf.config.list_physical_devices("GPU")):
        return tf.distribute.MirroredStrategy(
            devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    return tf.distribute.MirroredStrategy(devices)


def one_step_equivalence(devices, global_batch: int = 64, lr: float = 0.1) -> dict:
    """One custom-loop step under MirroredStrategy vs one step on one device, same weights."""
    return strategy_step_equivalence(mirrored(devices), global_batch, lr)


def strategy_step_equivalence(strategy, global_batch: int = 64, lr: float = 0.1) -> dict:
    """One custom-loop step under ``strategy`` vs one step on one device, same weights.

    Also reports where the first kernel's copies live: one per replica when mirrored,
    a single one on the parameter device under central storage.
    """
    import keras
    import tensorflow as tf

    from .. import data as datasets
    from . import models

    x, y = next(datasets.batches(*datasets.digits("train"), global_batch, shuffle=False))
    loss_fn = _loss_fn(keras)

    single = models.mlp()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(loss_fn(y, single(x)))
    grads = tape.gradient(loss, single.trainable_variables)
    for v, g in zip(single.trainable_variables, grads):
        v.assign_sub(lr * g)

    with strategy.scope():
        model = models.mlp()
        opt = keras.optimizers.SGD(lr)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch))

    @tf.function
    def step(batch):
        def replica(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(loss_fn(yb, model(xb))) / global_batch
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                    model.trainable_variables))
            return tf.shape(xb)[0]
        return strategy.run(replica, args=batch)

    rows = step(next(iter(dataset)))
    per_replica = [int(r) for r in strategy.experimental_local_results(rows)]
    diff = max(float(np.abs(a.numpy() - b.numpy()).max())
               for a, b in zip(model.trainable_variables, single.trainable_variables))
    kernel = model.trainable_variables[0]
    copies = [v.device for v in strategy.experimental_local_results(getattr(kernel, "value", kernel))]
    return {"replicas": strategy.num_replicas_in_sync, "rows per replica": per_replica,
            "max weight difference": diff, "copies of the first kernel": copies}


def mirrored_fit(devices, epochs: int = 3, batch: int = 64) -> dict:
    """Keras compile/fit under MirroredStrategy: the same call as on one device."""
    return strategy_fit(mirrored(devices), epochs, batch)


def strategy_fit(strategy, epochs: int = 3, batch: int = 64) -> dict:
    """Keras compile/fit under ``strategy``: the same call as on one device."""
    import keras

    from .. import data as datasets
    from . import models

    with strategy.scope():
        model = models.mlp()
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    x, y = datasets.digits("train")
    xt, yt = datasets.digits("test")
    hist = model.fit(x, y, epochs=epochs, batch_size=batch, validation_data=(xt, yt), verbose=2)
    return hist.history


def multi_worker(rank: int, world_size: int, ports, steps: int = 20, global_batch: int = 64,
                 lr: float = 0.1) -> dict:
    """Rank function for ``parlab.launch(..., process_group=False)``: one TF worker task
    per process (``parlab.course.lab05.run_multi_worker`` starts them).

    Keras 3 ``fit`` fails under MultiWorkerMirroredStrategy in this TensorFlow, so this is
    the custom loop: each worker computes on its half of every global batch, and the
    optimizer all-reduces the gradients across workers before applying them.
    """
    config = tf_config(ports, rank)
    os.environ["TF_CONFIG"] = json.dumps(config)  # must be set before the strategy starts
    from ..hardware import quiet_tensorflow
    quiet_tensorflow()
    import keras
    import tensorflow as tf

    from .. import data as datasets
    from . import models

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = models.mlp()
        opt = keras.optimizers.SGD(lr)
    loss_fn = _loss_fn(keras)
    x, y = datasets.digits("train")
    xt, yt = datasets.digits("test")
    shard = global_batch // world_size

    @tf.function
    def step(xb, yb):
        def replica(xr, yr):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(loss_fn(yr, model(xr))) / global_batch
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                    model.trainable_variables))
            return loss
        return strategy.run(replica, args=(xb, yb))

    batches = datasets.endless_batches(x, y, global_batch)
    losses = []
    for _ in range(steps):
        xb, yb = next(batches)
        part = slice(rank * shard, (rank + 1) * shard)  # this worker's slice
        losses.append(float(step(tf.constant(xb[part]), tf.constant(yb[part]))))
    accuracy = float((np.argmax(model(xt).numpy(), 1) == yt).mean())
    return {"tf_config": config, "pid": os.getpid(), "losses": losses, "test_accuracy": accuracy,
            "weights": [v.numpy() for v in model.trainable_variables]}
