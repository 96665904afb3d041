"""Small rank functions used by the README, the torchrun test and lab 00."""
from __future__ import annotations


def hello_allreduce(rank: int, world_size: int, n: int = 4) -> dict:
    """Each rank contributes its rank number; after the all-reduce every rank has the sum."""
    import torch

    from parlab import span
    from parlab.torch import comm

    with span("make data"):
        x = torch.full((n,), float(rank))
    comm.all_reduce(x)
    comm.barrier()
    return {"rank": rank, "sum": float(x[0]), "expected": world_size * (world_size - 1) / 2}
