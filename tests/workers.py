"""Importable workers for the tests (a notebook-style worker is built in the tests)."""
import os
import random
import signal
import time

import torch

import parlab
from parlab.torch import comm


def rank_info(rank, world_size):
    return {"rank": rank, "world_size": world_size, "pid": os.getpid(),
            "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
            "torch_rand": float(torch.rand(1)), "py_rand": random.random()}


def cores_of_rank(rank, world_size):
    return sorted(os.sched_getaffinity(0))


def where_the_rank_runs(rank, world_size, variable):
    """The rank's folder, one environment variable and its parent; it prints a line."""
    print(f"hello from rank {rank}")
    return {"cwd": os.getcwd(), "value": os.environ.get(variable), "parent": os.getppid()}


def sum_of_ranks(rank, world_size):
    x = torch.tensor([float(rank)])
    comm.all_reduce(x)
    return x


def raise_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError("shard 1 is malformed")
    comm.recv(torch.zeros(1), src=1)  # would block forever without the launcher
    return rank


def sigkill_rank_0(rank, world_size):
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.all_reduce(torch.zeros(1))
    return rank


def recv_that_never_comes(rank, world_size):
    comm.barrier()  # both ranks are up: what follows is the hang, not a slow start
    if rank == 0:
        comm.recv(torch.zeros(1), src=1)
    else:
        time.sleep(600)


def listening_addresses(rank, world_size):
    import psutil
    comm.barrier()
    addrs = sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN})
    comm.barrier()
    return addrs


def every_collective(rank, world_size):
    """Run each traced op once; return results for checking against local math."""
    out = {}
    x = torch.arange(4, dtype=torch.float32) + 10 * rank
    out["all_reduce"] = comm.all_reduce(x.clone())
    out["all_reduce_avg"] = comm.all_reduce(x.clone(), op="avg")
    out["all_gather"] = torch.stack(comm.all_gather(x))
    out["reduce_scatter"] = comm.reduce_scatter(torch.arange(2 * world_size, dtype=torch.float32) + rank)
    out["broadcast"] = comm.broadcast(x.clone(), src=0)
    if rank == 0:
        comm.send(torch.ones(8), dst=1)
    elif rank == 1:
        out["recv"] = comm.recv(torch.zeros(8), src=0)
    comm.barrier()
    with parlab.span("local math"):
        torch.ones(10).sum()
    return out


def skewed_clock_then_barrier(rank, world_size, skew_s, align):
    """Rank 1's clock runs skew_s ahead; a span starts right after a barrier on all ranks."""
    from parlab import trace
    from parlab.torch import runtime
    rec = trace.recorder()
    if rank == 1:
        real = time.perf_counter
        rec.timer = trace.HostTimer(lambda: real() + skew_s)
    if align:
        runtime.align_clocks(force_estimate=True)
    else:
        rec.offset = 0.0
    for _ in range(3):
        comm.barrier()
        with parlab.span("after barrier"):
            time.sleep(0.001)
    return rec.offset


def sliced_linear_layers(rank, world_size):
    """Column- and row-parallel layers against the dense layer: outputs and gradients."""
    from torch import nn

    from parlab.torch import tensor_parallel as tp
    torch.manual_seed(1)
    full = nn.Linear(16, 8)
    x = torch.randn(5, 16)
    out = {}
    col = tp.ColumnParallelLinear(full, gather_output=True)
    xc = x.clone().requires_grad_(True)
    y = col(xc)
    (y * torch.arange(8.0)).sum().backward()
    out["col"] = (y.detach(), col.weight.grad, col.bias.grad, xc.grad)
    row = tp.RowParallelLinear(full)
    part = 16 // world_size
    xr = x[:, rank * part:(rank + 1) * part].clone().requires_grad_(True)
    y = row(xr)
    (y * torch.arange(8.0)).sum().backward()
    out["row"] = (y.detach(), row.weight.grad, row.bias.grad, xr.grad)
    return out


# ------------------------------------------------------------------ strategies on sub-groups
PAIR_CFG = dict(sizes=(64, 64, 64, 64, 64, 10), batch_size=48, steps=3, lr=0.1)


def strategies_on_pairs(rank, world_size, names):
    """Run each strategy in turn on each pair of a 4-rank launch: ranks (0, 1) and (2, 3).

    The mesh has axes pair × member; ``mesh.group("member")`` is this rank's pair. Both
    pairs run the same strategy at the same time, each on its own group. One launch for
    every strategy: starting 4 ranks costs more than most of the strategies' runs.
    """
    from parlab.torch.mesh import init_mesh
    mesh = init_mesh(pair=2, member=2)
    out = {"pair": mesh.coord("pair"), "member": mesh.coord("member"),
           "ranks": mesh.ranks("member"), "runs": {}}
    for name in names:
        out["runs"][name] = strategy_on_pairs(rank, world_size, name, mesh)["run"]
    return out


def strategy_on_pairs(rank, world_size, name, mesh=None):
    """Run one strategy on each pair of a 4-rank launch at once: ranks (0, 1) and (2, 3)."""
    from parlab.split import SplitConfig
    from parlab.torch import data_parallel as dp
    from parlab.torch import parameter_server as ps
    from parlab.torch import pipeline as pl
    from parlab.torch import split
    from parlab.torch import tensor_parallel as tp
    from parlab.torch.mesh import init_mesh

    mesh = mesh or init_mesh(pair=2, member=2)
    group = mesh.group("member")
    out = {"pair": mesh.coord("pair"), "member": mesh.coord("member"), "ranks": mesh.ranks("member")}
    if name == "split":
        out["run"] = split.train_split(rank, world_size, SplitConfig(bounds=[4], **PAIR_CFG), group=group)
    elif name == "pipeline":
        cfg, ops = pl.prepare(SplitConfig(**PAIR_CFG), 2, 4, "1f1b")
        out["run"] = pl.train_pipeline(rank, world_size, cfg, 4, ops, group=group)
    elif name in ("naive", "column_row"):
        out["run"] = tp.train_sliced(rank, world_size, PAIR_CFG["sizes"], name, 48, 3, 0.1, group=group)
    elif name == "dtensor":
        out["run"] = tp.library_sliced_step(rank, world_size, PAIR_CFG["sizes"], 48, group=group)
    elif name in ("by_hand", "ring", "ddp"):
        out["run"] = dp.train_data_parallel(rank, world_size, name, "mlp", 64, 3, 0.1, 0.05, group=group)
    elif name == "parameter_server":
        out["run"] = ps.train_parameter_server(rank, world_size, "sync", 1, "mlp", 64, 3, 0.1, group=group)
    elif name == "wavefront":
        out["run"] = pl.lstm_wavefront(rank, world_size, 16, 6, 8, group=group)
    else:
        raise ValueError(name)
    return out


def mesh_report(rank, world_size, axes):
    """What init_mesh says on this rank, and a sum over every axis's group."""
    import torch

    from parlab.torch.mesh import init_mesh
    mesh = init_mesh(**axes)
    report = {"coords": {a: mesh.coord(a) for a in mesh.axes}, "label": mesh.label(),
              "ranks": {a: mesh.ranks(a) for a in mesh.axes},
              "neighbors": {a: mesh.neighbors(a) for a in mesh.axes},
              "sizes": {a: mesh.size(a) for a in mesh.axes}, "sums": {}}
    for a in mesh.axes:
        x = torch.tensor([float(rank)])
        comm.all_reduce(x, group=mesh.group(a))
        report["sums"][a] = float(x)
    report["device_mesh"] = tuple(mesh.device_mesh.mesh.shape)
    return report


# ------------------------------------------------------------------ waiting vs transfer
def late_sender(rank, world_size, delay_s):
    """Rank 1 sleeps before sending 1 MB to rank 0, which is already receiving."""
    comm.barrier()
    x = torch.zeros(250_000)
    if rank == 1:
        time.sleep(delay_s)
        comm.send(x, dst=0)
    elif rank == 0:
        comm.recv(x, src=1)
    return rank


def late_member(rank, world_size, delay_s, late_rank):
    """Every rank all-reduces 1 MB; ``late_rank`` arrives ``delay_s`` after the others."""
    comm.barrier()
    if rank == late_rank:
        time.sleep(delay_s)
    comm.all_reduce(torch.ones(250_000))
    return rank


def listening_during_launch(rank, world_size, launcher_pid):
    """Listening sockets of this rank and (rank 0) of the launching process, while all run."""
    import psutil

    def listening(proc):
        return sorted(f"{c.laddr.ip}:{c.laddr.port}" for c in proc.net_connections("inet")
                      if c.status == psutil.CONN_LISTEN)
    total = comm.all_reduce(torch.tensor([float(rank)]))  # every rank has joined
    out = {"rank": listening(psutil.Process()), "sum": float(total[0])}
    if rank == 0:
        out["launcher"] = listening(psutil.Process(launcher_pid))
    comm.barrier()  # nobody leaves before every rank has looked
    return out


def tf_cluster_then_die(rank, world_size, pid_file):
    """Lab 06's cluster with worker processes; the coordinator dies once they serve."""
    import threading

    import psutil

    from parlab.tf import parameter_server as tf_ps
    cluster = threading.Thread(target=tf_ps.cluster_training, args=(rank, world_size),
                               kwargs={"workers_in_process": False, "chunks": 10**6},
                               daemon=True)
    cluster.start()
    me, servers = psutil.Process(), []
    deadline = time.monotonic() + 150
    while len(servers) < 2 and cluster.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
        servers = [c for c in me.children()
                   if any(s.status == psutil.CONN_LISTEN for s in c.net_connections("tcp"))]
    with open(pid_file, "w") as fh:
        fh.write("\n".join(str(c.pid) for c in servers))
    os.kill(os.getpid(), signal.SIGKILL)  # like a coordinator that crashes hard


def moe_starved_rank(rank, world_size, batch_size=64):
    """One expert-parallel step whose router never picks the last rank's experts: that
    rank computes nothing, and must still take part in every backward all-to-all."""
    import torch.nn.functional as F

    from parlab.torch import moe, training
    cfg = moe.MoEConfig()
    model = moe.expert_parallel_model(cfg, 0)
    starve(model.moe.router, cfg.experts // world_size)
    rows = slice(rank * batch_size // world_size, (rank + 1) * batch_size // world_size)
    x, y = training.on_device(*next(training.digit_batches("mlp", batch_size)), "cpu", rows)
    logits, aux, per_expert = model(x)
    loss = F.cross_entropy(logits, y, reduction="sum") / batch_size + cfg.aux_weight * aux
    loss.backward()
    training.all_reduce_gradients(moe.replicated_parameters(model))
    return {"router_grad": model.moe.router.weight.grad.numpy().copy(),
            "per_expert": per_expert.tolist()}


def starve(router, last: int):
    """Make a router's last ``last`` experts never chosen (the digits' features are >= 0
    after the layer in)."""
    import torch
    with torch.no_grad():
        router.weight[-last:] = -10.0
