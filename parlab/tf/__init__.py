"""TensorFlow side of parlab. Importing this package imports tensorflow.

Call ``parlab.devices(n, framework="tf")`` before any TensorFlow operation when a lab needs
n logical devices: TensorFlow fixes its devices at its first operation.
"""
from ..hardware import quiet_tensorflow

quiet_tensorflow()

import tensorflow as _tf  # noqa: E402

_tf.get_logger().setLevel("ERROR")  # strategies log every all-reduce at INFO level

from . import models  # noqa: E402

__all__ = ["models"]
