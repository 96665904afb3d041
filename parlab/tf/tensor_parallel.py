"""Lab 03 in TensorFlow: a dense layer's units split over logical devices with tf.device.

Keras stores a Dense kernel as (inputs, outputs), so a column split cuts the kernel's
columns (output units) and a row split its rows (input units).
"""
from __future__ import annotations

import tensorflow as tf


def _parts(n: int, k: int):
    if n % k:
        raise ValueError(f"{n} units do not split evenly over {k} devices")
    size = n // k
    return [slice(i * size, (i + 1) * size) for i in range(k)]


def column_parallel(x, kernel, bias, devices):
    """Each device computes its slice of the output units from the whole input.

    Returns the concatenated output and the device each slice was computed on.
    """
    outs, where = [], []
    for dev, cols in zip(devices, _parts(kernel.shape[1], len(devices))):
        with tf.device(dev):
            y = tf.matmul(x, kernel[:, cols]) + bias[cols]
        outs.append(y)
        where.append(y.device)
    return tf.concat(outs, axis=-1), where


def row_parallel(x, kernel, bias, devices):
    """Each device multiplies its slice of the inputs; the partial sums are added."""
    partials, where = [], []
    for dev, rows in zip(devices, _parts(kernel.shape[0], len(devices))):
        with tf.device(dev):
            p = tf.matmul(x[:, rows], kernel[rows, :])
        partials.append(p)
        where.append(p.device)
    return tf.add_n(partials) + bias, where


def column_row_pair(x, k1, b1, k2, b2, devices):
    """Megatron's pair: column-parallel, ReLU on each device's slice, row-parallel.

    The only exchange is the final sum of the partial outputs.
    """
    partials = []
    for dev, cols in zip(devices, _parts(k1.shape[1], len(devices))):
        with tf.device(dev):
            h = tf.nn.relu(tf.matmul(x, k1[:, cols]) + b1[cols])  # stays on this device
            partials.append(tf.matmul(h, k2[cols, :]))
    return tf.add_n(partials) + b2
