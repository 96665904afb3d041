"""Addresses for TensorFlow clusters on this machine: every task on 127.0.0.1.

TensorFlow's gRPC servers bind their port on every interface whatever host the cluster
names (``GrpcServer::Init`` listens on ``"0.0.0.0:" + port``); parlab keeps their lifetime
to one launch instead (see ``parlab.tf.parameter_server``). Imports no TensorFlow.
"""
from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_ports(n: int) -> list[int]:
    """n ports on 127.0.0.1 that were free a moment ago (for TF_CONFIG and cluster specs)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(ports, index: int) -> dict:
    """TF_CONFIG of worker ``index`` in a cluster of workers on ``ports``."""
    return {"cluster": {"worker": [f"{HOST}:{p}" for p in ports]},
            "task": {"type": "worker", "index": index}}
