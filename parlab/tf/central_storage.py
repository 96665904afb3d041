"""Lab 06 in TensorFlow: central storage.

``CentralStorageStrategy`` keeps ONE copy of every variable on a parameter device (the
CPU) while the replicas compute on the other devices; the replicas' gradients are
reduced where the variables live and applied there. Its twin is
``parlab.torch.central_storage``, written by hand.
"""
from __future__ import annotations


def central_storage(compute_devices, parameter_device: str):
    """The strategy: variables on ``parameter_device``, replicas on ``compute_devices``."""
    import tensorflow as tf
    return tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=list(compute_devices), parameter_device=parameter_device)
