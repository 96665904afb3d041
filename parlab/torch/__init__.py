"""PyTorch side of parlab: the rank runtime, traced communication, and the lab workers.

Importing this package imports torch.
"""
from . import comm, runtime

__all__ = ["comm", "runtime"]
