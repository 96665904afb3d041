"""Importable rank functions for tests/test_gpu.py and tests/test_staging.py.

The staging workers run the shared-GPU path of the traced layer (copy to host, gloo,
copy back) on whatever device the rank has: forced on CPU tensors here, on CUDA tensors in
a shared-GPU launch.
"""
import torch

from parlab.torch import comm, runtime


def staged_ops(rank, world_size, force=True):
    """Every traced operation once, with host staging forced when ``force``; results as numpy."""
    before = runtime.stage_through_host("all") if force else None
    device = runtime.rank_device()
    out = {"device": str(device), "staging": runtime.host_staging()}
    x = torch.full((4,), float(rank + 1), device=device)
    same = x
    comm.all_reduce(x)
    out["all_reduce"] = x.cpu().numpy()
    out["in_place"] = x is same
    y = torch.full((4,), float(rank + 1), device=device)
    out["avg"] = comm.all_reduce(y, "avg").cpu().numpy()
    b = torch.full((3,), float(rank), device=device)
    out["broadcast"] = comm.broadcast(b, 1).cpu().numpy()
    out["all_gather"] = [t.cpu().numpy() for t in comm.all_gather(torch.tensor([float(rank)], device=device))]
    rs = torch.arange(2.0 * world_size, device=device) * (rank + 1)
    out["reduce_scatter"] = comm.reduce_scatter(rs).cpu().numpy()
    # a ring of messages: blocking send on even ranks, isend on odd ones
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    got = torch.zeros(2, device=device)
    msg = torch.tensor([float(rank), 10.0 * rank], device=device)
    if rank % 2 == 0:
        comm.send(msg, right)
        comm.recv(got, left)
    else:
        comm.recv(got, left)
        comm.wait_all([comm.isend(msg, right)])
    out["ring"] = got.cpu().numpy()
    # recv_any: rank 0 hears from everyone else, in any order
    if rank == 0:
        heard = {}
        for _ in range(world_size - 1):
            buf = torch.zeros(1, device=device)
            sender = comm.recv_any(buf)
            heard[sender] = float(buf.item())
        out["recv_any"] = heard
    else:
        comm.send(torch.tensor([100.0 + rank], device=device), 0)
    z = torch.full((5,), float(rank), device=device)
    fut = comm.all_reduce_async(z, lane=world_size + rank)
    fut.wait()
    out["all_reduce_async"] = z.cpu().numpy()
    comm.barrier()
    if force:
        runtime.stage_through_host(before)
    return out


def staged_strategies(rank, world_size, names):
    """tests/workers.strategies_on_pairs with every traced message staged through host memory."""
    import workers
    runtime.stage_through_host("all")
    return workers.strategies_on_pairs(rank, world_size, names)


# ------------------------------------------------------------------ GPU only
def strategies_with_placement(rank, world_size, names):
    """Each strategy on pairs, with where it ran and how much CUDA memory it allocated."""
    import workers
    from parlab.torch.mesh import init_mesh
    mesh = init_mesh(pair=2, member=2)
    out = {"device": str(runtime.rank_device()), "library_device": str(runtime.library_device()),
           "backend": str(torch.distributed.get_backend()), "shares_gpu": runtime.shares_gpu(),
           "runs": {}, "cuda_peak": {}}
    for name in names:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        out["runs"][name] = workers.strategy_on_pairs(rank, world_size, name, mesh)["run"]
        torch.cuda.synchronize()
        out["cuda_peak"][name] = torch.cuda.max_memory_allocated()
    return out


def nccl_on_one_rank(rank, world_size):
    """One rank on its GPU: the backend, the device, and an all-reduce of a CUDA tensor."""
    device = runtime.rank_device()
    x = torch.ones(1000, device=device) * 3
    comm.all_reduce(x)
    return {"backend": str(torch.distributed.get_backend()), "device": str(device),
            "uses_gpus": runtime.uses_gpus(), "sum": float(x.sum().item()),
            "timer": type(__import__("parlab").trace.recorder().timer).__name__}
