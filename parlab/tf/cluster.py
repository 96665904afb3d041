"""Addresses for TensorFlow clusters on this machine: every task on 127.0.0.1.

TensorFlow's gRPC servers bind their port on every interface whatever host the cluster
names (``GrpcServer::Init`` listens on ``"0.0.0.0:" + port``); parlab keeps their lifetime
to one launch instead (see ``parlab.tf.parameter_server``). Imports no TensorFlow.
"""
from __future__ import annotations

from ..system import free_ports  # noqa: F401 (parlab.tf.cluster.free_ports, as before)

HOST = "127.0.0.1"


def tf_config(ports, index: int) -> dict:
    """TF_CONFIG of worker ``index`` in a cluster of workers on ``ports``."""
    return {"cluster": {"worker": [f"{HOST}:{p}" for p in ports]},
            "task": {"type": "worker", "index": index}}
