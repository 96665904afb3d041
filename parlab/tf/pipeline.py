"""Lab 04 in TensorFlow: an LSTM stack with its layers on different (logical) devices.

In eager mode Python runs each layer in turn, so placement changes where, not when. A
``tf.function`` hands the whole stack to TensorFlow's graph executor, which may run
independent operations on different devices at the same time.
"""
from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf


def build_stack(layers: int, hidden: int, devices, seed: int = 0):
    """LSTM layers (returning sequences), layer k built on ``devices[k % len(devices)]``."""
    stack = []
    for k in range(layers):
        with tf.device(devices[k % len(devices)]):
            layer = keras.layers.LSTM(hidden, return_sequences=True,
                                      kernel_initializer=keras.initializers.GlorotUniform(seed + k),
                                      recurrent_initializer=keras.initializers.Orthogonal(seed=seed + k))
            layer.build((None, None, 1 if k == 0 else hidden))
        stack.append(layer)
    return stack


def forward(stack, devices, x):
    for k, layer in enumerate(stack):
        with tf.device(devices[k % len(devices)]):
            x = layer(x)
    return x


def timed(stack, devices, x, repeats: int = 3) -> dict:
    """Median seconds of the stack's forward pass, eager and as a tf.function."""
    compiled = tf.function(lambda inp: forward(stack, devices, inp))
    out = {}
    for name, fn in (("eager", lambda: forward(stack, devices, x)), ("tf.function", lambda: compiled(x))):
        times = []
        for _ in range(repeats + 1):  # the first call traces the function: dropped
            t0 = time.perf_counter()
            y = fn().numpy()
            times.append(time.perf_counter() - t0)
        out[name] = {"seconds": float(np.median(times[1:])), "y": y}
    return out
