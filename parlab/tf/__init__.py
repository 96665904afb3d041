"""TensorFlow side of parlab. Importing this package imports tensorflow.

Call ``parlab.devices(n, framework="tf")`` before any TensorFlow operation when a lab needs
n logical devices: TensorFlow fixes its devices at its first operation.
"""
from ..hardware import quiet_tensorflow

quiet_tensorflow()

from . import models  # noqa: E402

__all__ = ["models"]
