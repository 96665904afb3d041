"""The transformer block split by tensor parallelism the TensorFlow way: DTensor layouts.

The PyTorch lab splits a GPT block by hand (``parlab.torch.transformer_tp``); here the
same split is *declared*. Each weight is a ``DVariable`` whose layout names the
dimension it is cut along on a 1-D mesh ``model`` of N devices, and DTensor's SPMD
expansion inserts the communication (Megatron-LM, Shoeybi et al. 2019, section 3):

* q, k, v and fc1 are column-parallel: kernels (in, out) cut by their output units,
  ``[unsharded, model]``, biases ``[model]``. Device k computes its heads' q, k, v and
  its slice of the MLP's hidden units from the whole input.
* proj and fc2 are row-parallel: kernels cut by their input units, ``[model,
  unsharded]``; each device's product is a partial sum that one all-reduce adds. Their
  biases are added once, after the sum, so they stay whole.
* The layer norms and the residual stream stay whole on every device.

Between the column and the row layers the activations stay split: the attention's
per-head tensor (batch, heads, seq, head_dim) is ``[unsharded, model, unsharded,
unsharded]``, heads split over the devices, and the MLP's hidden (batch, seq, 4 d) is
``[unsharded, unsharded, model]``. Batch and sequence are never split.

One pre-norm block (Radford et al. 2019, as ``parlab.torch.transformer.Block``):

    x = x + proj(attention(q(ln1(x)), k(ln1(x)), v(ln1(x))))     causal, ``heads`` heads
    x = x + fc2(gelu(fc1(ln2(x))))                                 fc1: d -> 4d, fc2: 4d -> d

``block`` is written once, for plain tensors and DTensors alike: the layouts alone make
it parallel. DTensor differentiates through the split on the CPU, so ``block_on_mesh``
compares the gradients too.
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from ..hardware import devices as course_devices

LAYER_NORM_EPSILON = 1e-5          # torch.nn.LayerNorm's default, as the PyTorch lab uses

COLUMN_PARALLEL = ("q", "k", "v", "fc1")
ROW_PARALLEL = ("proj", "fc2")
LAYER_NORMS = ("ln1", "ln2")


# ------------------------------------------------------------------ weights and layouts
def weight_shapes(d_model: int) -> dict[str, tuple[int, ...]]:
    """Every weight of the block by name, in the order the block uses them."""
    d, ff = d_model, 4 * d_model
    shapes = {"ln1.gamma": (d,), "ln1.beta": (d,)}
    for name in ("q", "k", "v", "proj"):
        shapes.update({f"{name}.kernel": (d, d), f"{name}.bias": (d,)})
    shapes.update({"ln2.gamma": (d,), "ln2.beta": (d,),
                   "fc1.kernel": (d, ff), "fc1.bias": (ff,),
                   "fc2.kernel": (ff, d), "fc2.bias": (d,)})
    return shapes


def initial_weights(d_model: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The same starting weights for the mesh and the one-device block.

    Kernels Glorot-uniform; biases and the norms' shifts small and random, the norms'
    scales near one, not the usual zeros and ones: a bias given the wrong layout (cut
    when it must stay whole) only shows when its values differ.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(d_model).items():
        if name.endswith(".kernel"):
            limit = math.sqrt(6 / sum(shape))
            value = rng.uniform(-limit, limit, shape)
        elif name.endswith(".gamma"):
            value = 1 + 0.1 * rng.standard_normal(shape)
        else:
            value = 0.1 * rng.standard_normal(shape)
        out[name] = value.astype(np.float32)
    return out


def megatron_layouts(mesh) -> dict[str, "dtensor.Layout"]:
    """Each weight's layout on a 1-D ``model`` mesh (Shoeybi et al. 2019, fig. 3):
    column-parallel kernels and biases cut by output units, row-parallel kernels by
    input units, the rest whole."""
    u = dtensor.UNSHARDED
    layouts = {}
    for name in weight_shapes(1):               # the names; the sizes do not matter
        layer, part = name.split(".")
        if layer in COLUMN_PARALLEL:
            specs = [u, "model"] if part == "kernel" else ["model"]
        elif layer in ROW_PARALLEL and part == "kernel":
            specs = ["model", u]
        else:                                   # norms, and the row layers' biases
            specs = [u, u] if part == "kernel" else [u]
        layouts[name] = dtensor.Layout(specs, mesh)
    return layouts


def layout_text(layout) -> str:
    """A layout as the short text the lab prints: ``[unsharded, model]``."""
    return "[" + ", ".join(layout.sharding_specs) + "]"


# ------------------------------------------------------------------ the block
def layer_norm(x, gamma, beta):
    """Normalise the last dimension, then scale and shift (Ba et al. 2016)."""
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + LAYER_NORM_EPSILON) * gamma + beta


def split_heads(x, heads: int):
    """(batch, seq, heads · head_dim) -> (batch, heads, seq, head_dim)."""
    batch, seq, width = x.shape
    return tf.transpose(tf.reshape(x, (batch, seq, heads, width // heads)), (0, 2, 1, 3))


def merge_heads(x):
    """(batch, heads, seq, head_dim) -> (batch, seq, heads · head_dim)."""
    batch, heads, seq, head_dim = x.shape
    return tf.reshape(tf.transpose(x, (0, 2, 1, 3)), (batch, seq, heads * head_dim))


def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(d)) v, each position seeing itself and those before it
    (Vaswani et al. 2017, eq. 1, masked). The (seq, seq) mask is made from positions,
    not with ``tf.linalg.band_part``: DTensor cannot split that op by heads."""
    scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(q.shape[-1])
    positions = tf.range(scores.shape[-1])
    past = positions[:, None] >= positions[None, :]          # query row, key column
    scores = tf.where(past, scores, tf.fill(tf.shape(scores), -math.inf))
    return tf.matmul(tf.nn.softmax(scores, axis=-1), v)


def block(weights: dict, x, heads: int) -> tuple:
    """One pre-norm GPT block: (output, per-head attention, MLP hidden).

    ``weights`` are plain tensors or DTensors, ``x`` (batch, seq, d_model) likewise; the
    code is the same for both, the split lives in the weights' layouts.
    """
    w = weights

    def dense(h, name):
        return tf.matmul(h, w[f"{name}.kernel"]) + w[f"{name}.bias"]

    h = layer_norm(x, w["ln1.gamma"], w["ln1.beta"])
    q, k, v = (split_heads(dense(h, name), heads) for name in ("q", "k", "v"))
    per_head = causal_attention(q, k, v)               # heads split: no exchange here
    x = x + dense(merge_heads(per_head), "proj")       # row-parallel: one all-reduce
    hidden = tf.nn.gelu(dense(layer_norm(x, w["ln2.gamma"], w["ln2.beta"]), "fc1"),
                        approximate=False)             # torch's F.gelu: the exact erf form
    return x + dense(hidden, "fc2"), per_head, hidden


def block_and_gradients(weights: dict, x, probe, heads: int) -> tuple:
    """The block's outputs and the gradients of sum(output · probe) / positions with
    respect to every weight (a random ``probe`` makes every output count)."""
    variables = list(weights.values())
    with tf.GradientTape() as tape:
        tape.watch(variables)              # plain tensors are not watched by themselves
        out, per_head, hidden = block(weights, x, heads)
        loss = tf.reduce_sum(out * probe) / (out.shape[0] * out.shape[1])
    grads = dict(zip(weights, tape.gradient(loss, variables)))
    return out, per_head, hidden, grads


# ------------------------------------------------------------------ devices and mesh
def model_mesh(device_names):
    """A 1-D DTensor mesh ``model`` over ``device_names`` ("/device:CPU:0", ...)."""
    names = [d.split("device:")[-1] for d in device_names]   # "/device:CPU:0" -> "CPU:0"
    return dtensor.create_mesh([("model", len(names))], devices=names)


def _started_with(kind: str) -> list[str]:
    """The logical devices TensorFlow already runs with (it has started)."""
    return [d.name for d in tf.config.list_logical_devices(kind)]


def mesh_devices(devices, heads: int) -> tuple[list[str], str]:
    """Device names for the mesh, and a note when they differ from what was asked.

    ``devices``: a count, a ``parlab.devices(..., framework="tf")`` set, or device
    names. A count goes through ``parlab.devices``, which sets up the logical devices
    the way every TensorFlow cell of the course does. TensorFlow fixes them at its first
    operation, so after an earlier cell made a different number this uses the first
    ``devices`` of them, or all of them when they are fewer (and says so).
    """
    if hasattr(devices, "names"):
        devices = devices.names
    if isinstance(devices, (list, tuple)):
        if not devices:
            raise ValueError("devices is empty: pass a count such as devices=4, or names "
                             "such as parlab.devices(4, framework='tf').names")
        return list(devices), ""
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a count of at least 1 (e.g. devices=4), a "
                         f"device set or a list of device names, got {devices!r}")
    _check_heads(heads, devices)
    try:
        return list(course_devices(devices, framework="tf").names), ""
    except ValueError as exc:
        # TensorFlow had started with another count: its refusal (a RuntimeError) is the
        # cause; any other ValueError (a device mode that cannot be met) stands as it is
        if not isinstance(exc.__cause__, RuntimeError):
            raise
        have = _started_with("CPU")
        if len(have) >= devices:
            return have[:devices], ""
        if len(have) < 2 or heads % len(have):
            raise
        return have, (f"TensorFlow already runs with {len(have)} logical CPU devices in "
                      f"this process (an earlier cell made them), so the mesh has "
                      f"{len(have)}, not {devices}: restart the kernel for {devices}")


def _check_heads(heads: int, devices: int) -> None:
    if heads % devices:
        fits = [n for n in range(1, heads + 1) if heads % n == 0]
        raise ValueError(f"heads={heads} do not divide by devices={devices}: each device "
                         f"holds whole heads. Pick devices among {fits}, or heads a "
                         f"multiple of {devices}")


def _check_sizes(batch: int, seq: int, d_model: int, heads: int) -> None:
    for name, value in (("batch", batch), ("seq", seq), ("d_model", d_model),
                        ("heads", heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    if d_model % heads:
        raise ValueError(f"d_model={d_model} must divide by heads={heads}: pick a d_model "
                         f"in multiples of {heads}")


# ------------------------------------------------------------------ the comparison
def _largest_difference(on_mesh, one_device) -> float:
    whole = dtensor.relayout(on_mesh, dtensor.Layout.replicated(
        dtensor.fetch_layout(on_mesh).mesh, on_mesh.shape.rank))
    return float(np.max(np.abs(whole.numpy() - one_device.numpy())))


def block_on_mesh(devices=4, batch: int = 2, seq: int = 16, d_model: int = 64,
                  heads: int = 4, seed: int = 0) -> dict:
    """The block on a 1-D ``model`` mesh with Megatron's layouts, against one device.

    Builds the same weights both ways (DVariables on the mesh; plain tensors on the
    first device), runs the forward and the gradients of a scalar loss with
    ``tf.GradientTape``. ``devices``: a count (made by ``parlab.devices``, see
    ``mesh_devices``), a device set, or device names. Returns:

    * ``devices``: how many devices the mesh has; ``mesh``: the mesh in words;
    * ``layouts``: each weight's layout, ``{"q.kernel": "[unsharded, model]", ...}``;
      ``pieces``: the shape of the piece of each weight one device holds;
    * ``activation_layouts``: the per-head attention, the MLP hidden and the output;
    * ``output_difference``, ``gradient_difference`` and their ``max_difference``:
      the largest absolute difference from the one-device block;
    * ``gradient_layouts_match``: whether every gradient has its weight's layout
      (each device's gradient is its own piece, nothing gathered).
    """
    _check_sizes(batch, seq, d_model, heads)
    names, note = mesh_devices(devices, heads)
    _check_heads(heads, len(names))
    mesh = model_mesh(names)
    init = initial_weights(d_model, seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((batch, seq, d_model)).astype(np.float32)
    probe = rng.standard_normal((batch, seq, d_model)).astype(np.float32)

    with tf.device(names[0]):
        plain = {name: tf.constant(value) for name, value in init.items()}
        ref_out, _, _, ref_grads = block_and_gradients(plain, tf.constant(x),
                                                       tf.constant(probe), heads)

    layouts = megatron_layouts(mesh)
    whole = dtensor.Layout.replicated(mesh, 3)          # batch and sequence never split
    with dtensor.default_mesh(mesh):
        on_mesh = {name: dtensor.DVariable(dtensor.copy_to_mesh(value, layouts[name]))
                   for name, value in init.items()}
        out, per_head, hidden, grads = block_and_gradients(
            on_mesh, dtensor.copy_to_mesh(x, whole), dtensor.copy_to_mesh(probe, whole),
            heads)

    output_difference = _largest_difference(out, ref_out)
    gradient_difference = max(_largest_difference(grads[n], ref_grads[n]) for n in init)
    described = ", ".join(n.split("device:")[-1] for n in names)
    return {
        "devices": len(names),
        "mesh": f"1-D mesh 'model' over {len(names)} devices ({described})"
                + (f"; {note}" if note else ""),
        "layouts": {n: layout_text(dtensor.fetch_layout(v)) for n, v in on_mesh.items()},
        "pieces": {n: tuple(dtensor.unpack(v.read_value())[0].shape)
                   for n, v in on_mesh.items()},
        "activation_layouts": {
            "attention per head (batch, heads, seq, head_dim)":
                layout_text(dtensor.fetch_layout(per_head)),
            "MLP hidden (batch, seq, 4·d_model)": layout_text(dtensor.fetch_layout(hidden)),
            "block output (batch, seq, d_model)": layout_text(dtensor.fetch_layout(out)),
        },
        "output_difference": output_difference,
        "gradient_difference": gradient_difference,
        "max_difference": max(output_difference, gradient_difference),
        "gradient_layouts_match": all(
            dtensor.fetch_layout(grads[n]) == dtensor.fetch_layout(on_mesh[n]) for n in init),
    }
