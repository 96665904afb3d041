"""Workers that import no framework: for launcher tests that need not pay for torch."""
import time


def no_torch(rank, world_size):
    return rank * 10


def no_torch_raises(rank, world_size):
    if rank == 1:
        raise RuntimeError("plain failure")
    time.sleep(30)


def one_rank_slow(rank, world_size, slow=1, seconds=60.0):
    if rank == slow:
        time.sleep(seconds)
    return rank


def draw_each_step(step):
    """An ``after_step`` hook that uses the random state as dropout would: one draw a step."""
    import torch
    torch.rand(1)
