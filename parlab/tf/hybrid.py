"""Lab 07 in TensorFlow: a 2-D mesh with DTensor, batch on one axis, model on the other.

``tf.experimental.dtensor`` is today's successor of Mesh-TensorFlow (Shazeer et al.,
2018, "Mesh-TensorFlow: Deep Learning for Supercomputers"): the devices form a mesh
with named dimensions, every tensor carries a *layout* that says which of its
dimensions is split along which mesh dimension, and TensorFlow inserts the
communication. Splitting the batch dimension along one mesh dimension is data parallel;
splitting a weight's dimension along the other is tensor (model) parallel.

Here, an MLP on a ``batch`` × ``model`` mesh of logical CPU devices: the input's rows
split over ``batch``; the Linear layers paired column-then-row over ``model`` as in
Megatron-LM (a kernel (in, out) split by its out columns, the next by its in rows).
``parlab.devices(n, framework="tf")`` must have made the logical devices first.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from .. import data as datasets

SIZES = (64, 256, 256, 128, 10)


def make_mesh(devices, batch: int = 2, model: int = 2):
    """A ``batch`` × ``model`` DTensor mesh over ``devices`` (e.g. 4 logical CPUs)."""
    if batch * model != len(devices):
        raise ValueError(f"a mesh of batch {batch} × model {model} needs {batch * model} "
                         f"devices, got {len(devices)}")
    names = [d.split("device:")[-1] for d in devices]   # "/device:CPU:0" -> "CPU:0"
    return dtensor.create_mesh([("batch", batch), ("model", model)], devices=names)


def initial_weights(sizes=SIZES, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """The same starting weights for the mesh and the one-device reference (Glorot-like)."""
    rng = np.random.default_rng(seed)
    out = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        limit = np.sqrt(6 / (a + b))
        out.append((rng.uniform(-limit, limit, (a, b)).astype(np.float32),
                    np.zeros(b, np.float32)))
    return out


def layouts(mesh, sizes=SIZES) -> list[tuple]:
    """Kernel and bias layouts, layer by layer: column, row, column, row, ... pairs.

    Column (by output units): kernel [unsharded, model], bias [model]. Row (by input
    units): kernel [model, unsharded], bias whole (added once, after the sum). An
    unpaired last layer is whole on every device.
    """
    u = dtensor.UNSHARDED
    n = len(sizes) - 1
    out = []
    for k in range(n):
        if k % 2 == 0 and k + 1 < n:
            out.append((dtensor.Layout([u, "model"], mesh), dtensor.Layout(["model"], mesh)))
        elif k % 2 == 1:
            out.append((dtensor.Layout(["model", u], mesh), dtensor.Layout([u], mesh)))
        else:
            out.append((dtensor.Layout([u, u], mesh), dtensor.Layout([u], mesh)))
    return out


def _forward(params, x):
    for k, (w, b) in enumerate(params):
        x = tf.matmul(x, w) + b
        if k < len(params) - 1:
            x = tf.nn.relu(x)
    return x


def _train(params, batches, steps: int, lr: float, place_batch=None) -> list[float]:
    """Plain SGD on the mean cross-entropy; the same function for the mesh and one device."""
    flat = [v for pair in params for v in pair]

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = _forward(params, x)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        for v, g in zip(flat, tape.gradient(loss, flat)):
            v.assign_sub(lr * g)
        return loss

    losses = []
    for _ in range(steps):
        xb, yb = next(batches)
        x, y = tf.constant(xb), tf.constant(yb.astype(np.int32))
        if place_batch is not None:
            x, y = place_batch(x, y)
        losses.append(float(step(x, y)))
    return losses


def train_on_mesh(devices, batch: int = 2, model: int = 2, sizes=SIZES, global_batch: int = 64,
                  steps: int = 5, lr: float = 0.1, seed: int = 0) -> dict:
    """Train the MLP on a DTensor mesh and on one device; report both and the layouts.

    Returns the losses, the largest weight difference from one device, each variable's
    layout and the shape of the piece each device holds.
    """
    mesh = make_mesh(devices, batch, model)
    init = initial_weights(sizes, seed)
    on_mesh = [(dtensor.DVariable(dtensor.copy_to_mesh(w, lw)),
                dtensor.DVariable(dtensor.copy_to_mesh(b, lb)))
               for (w, b), (lw, lb) in zip(init, layouts(mesh, sizes))]
    x_layout = dtensor.Layout(["batch", dtensor.UNSHARDED], mesh)
    y_layout = dtensor.Layout(["batch"], mesh)

    def place(x, y):   # rows split over the batch dimension, replicated over model
        return dtensor.copy_to_mesh(x, x_layout), dtensor.copy_to_mesh(y, y_layout)

    x_all, y_all = datasets.digits("train")
    mesh_losses = _train(on_mesh, datasets.endless_batches(x_all, y_all, global_batch),
                         steps, lr, place)
    with tf.device(devices[0]):
        single = [(tf.Variable(w), tf.Variable(b)) for w, b in init]
        single_losses = _train(single, datasets.endless_batches(x_all, y_all, global_batch),
                               steps, lr)
    diff = max(float(np.max(np.abs(dtensor.relayout(a, dtensor.Layout.replicated(mesh, a.shape.rank))
                                   .numpy() - b.numpy())))
               for pa, pb in zip(on_mesh, single) for a, b in zip(pa, pb))
    x0 = datasets.digits("train")[0][:global_batch]
    h = tf.nn.relu(tf.matmul(place(tf.constant(x0), tf.constant(np.zeros(global_batch, np.int32)))[0],
                             on_mesh[0][0]) + on_mesh[0][1])
    activations = {"input": x_layout.sharding_specs,
                   "after layer 0 (column)": dtensor.fetch_layout(h).sharding_specs,
                   "after layer 1 (row)": dtensor.fetch_layout(
                       tf.matmul(h, on_mesh[1][0]) + on_mesh[1][1]).sharding_specs}
    pieces = {}
    for k, (w, b) in enumerate(on_mesh):
        for name, v in ((f"layer {k} kernel", w), (f"layer {k} bias", b)):
            layout = dtensor.fetch_layout(v)
            pieces[name] = {"shape": tuple(v.shape), "sharding": layout.sharding_specs,
                            "piece per device": tuple(dtensor.unpack(v.read_value())[0].shape)}
    return {"mesh": f"batch {batch} × model {model}", "devices": list(mesh.local_devices()),
            "losses": mesh_losses, "single_losses": single_losses,
            "max_weight_difference": diff, "variables": pieces, "activations": activations}
