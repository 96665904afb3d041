"""PyTorch side of parlab: the rank runtime, traced communication, the
device mesh, and the strategies each lab runs on its ranks.

Importing this package imports torch.
"""
from . import comm, runtime

__all__ = ["comm", "runtime"]
