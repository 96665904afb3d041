"""Lab 05: synchronous data parallelism. Every rank holds the whole model (a replica),
takes its own slice of each global batch, and averages gradients with the others, so
every replica applies the same update and they stay identical.

Three ways to average, from by-hand to library:

* ``average_gradients``: one all-reduce per parameter, after the backward pass;
* ``ring_all_reduce``: the ring algorithm written out with send/recv;
* ``DistributedDataParallel`` with a traced communication hook: gradients are averaged in
  buckets, each bucket's all-reduce starting in the background as soon as its gradients
  are ready, while the backward pass goes on (overlap).
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from .. import data as datasets
from ..trace import span
from . import comm, models

# ------------------------------------------------------------------ by hand


def average_gradients(model: nn.Module) -> None:
    """Replace every gradient by its mean over all ranks (one all-reduce per tensor)."""
    for p in model.parameters():
        if p.grad is not None:
            comm.all_reduce(p.grad, op="avg")


def ring_all_reduce(tensor: torch.Tensor, log: list | None = None) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place, with the ring algorithm.

    The tensor is cut into n chunks. Reduce-scatter: in step k, rank r sends chunk
    (r - k) mod n to its right neighbour and adds the chunk (r - k - 1) mod n it receives
    from its left one; after n - 1 steps rank r holds the full sum of chunk (r + 1) mod n.
    All-gather: n - 1 more steps pass the finished chunks around the ring. Each rank sends
    2(n - 1)/n of the tensor in all (Patarasuk & Yuan, 2009).
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return tensor
    if not tensor.is_contiguous():
        raise ValueError("ring_all_reduce works in place on a contiguous tensor")
    chunks = list(tensor.view(-1).tensor_split(n))  # views: sizes may differ by one
    right, left = (rank + 1) % n, (rank - 1) % n
    for phase in ("reduce-scatter", "all-gather"):
        for k in range(n - 1):
            if phase == "reduce-scatter":
                send_i, recv_i = (rank - k) % n, (rank - k - 1) % n
                incoming = torch.empty_like(chunks[recv_i])
            else:
                send_i, recv_i = (rank + 1 - k) % n, (rank - k) % n
                incoming = chunks[recv_i]          # a finished chunk: receive in place
            pending = comm.isend(chunks[send_i], right)
            comm.recv(incoming, left)
            if phase == "reduce-scatter":
                with span("add chunk"):
                    chunks[recv_i] += incoming
            comm.wait_all([pending])
            if log is not None:
                log.append({"phase": phase, "step": k, "rank": rank, "sends chunk": send_i,
                            "to": right, "receives chunk": recv_i})
    return tensor


# ------------------------------------------------------------------ DDP with traced hooks
def traced_hook(state: dict, bucket):
    """DDP communication hook: average a gradient bucket through the traced layer.

    state: {"lane": background lane, "compress": send float16 instead of float32}.
    """
    buf = bucket.buffer()
    world_size = dist.get_world_size()
    wire = buf.to(torch.float16) if state["compress"] else buf
    state["buckets"] = state.get("buckets", 0) + 1
    fut = comm.all_reduce_async(wire, lane=state["lane"],
                                name="fp16 bucket all_reduce" if state["compress"] else "bucket all_reduce")

    def finish(f):
        reduced = f.value()[0] if isinstance(f.value(), list) else f.value()
        buf.copy_(reduced.to(buf.dtype) / world_size)
        return buf

    return fut.then(finish)


# ------------------------------------------------------------------ training
MODES = ("by_hand", "ring", "ddp", "ddp_fp16")


def build(model: str = "mlp"):
    if model == "mlp":
        return models.mlp()
    if model == "conv_stack":
        return models.conv_stack(32)
    if model == "cnn":
        return models.cnn()
    raise ValueError(f"model must be 'mlp', 'cnn' or 'conv_stack', got {model!r}")


def _batches(model: str, global_batch: int):
    x, y = datasets.digits("train", flat=model == "mlp")
    return datasets.endless_batches(x, y, global_batch)


def train_data_parallel(rank: int, world_size: int, mode: str = "by_hand", model: str = "mlp",
                        global_batch: int = 128, steps: int = 5, lr: float = 0.1,
                        bucket_mb: float = 25.0, seed: int = 0) -> dict:
    """Worker: train a replica on its slice of every global batch.

    Rank r takes rows r*b:(r+1)*b of each global batch (b = global_batch / world_size),
    so the averaged gradient equals the gradient of the whole batch on one device.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if global_batch % world_size:
        raise ValueError(f"a global batch of {global_batch} does not split over {world_size} "
                         f"replicas: use a multiple of {world_size}")
    torch.manual_seed(seed)  # the same initial weights on every replica
    net = build(model)
    state = {"lane": world_size + rank, "compress": mode == "ddp_fp16"}
    if mode.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(net, bucket_cap_mb=bucket_mb)
        net.register_comm_hook(state, traced_hook)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    b = global_batch // world_size
    batches = _batches(model, global_batch)
    out = {"losses": [], "step_s": []}
    for step in range(steps):
        xb, yb = next(batches)
        x = torch.as_tensor(xb[rank * b:(rank + 1) * b])
        y = torch.as_tensor(yb[rank * b:(rank + 1) * b])
        t0 = time.perf_counter()
        opt.zero_grad()
        with span("forward"):
            loss = loss_fn(net(x), y)
        with span("backward"):
            loss.backward()            # DDP: buckets are all-reduced in the background here
        if mode == "by_hand":
            average_gradients(net)
        elif mode == "ring":
            flat = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
            ring_all_reduce(flat)
            flat /= world_size
            offset = 0
            for p in net.parameters():
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        with span("update"):
            opt.step()
        out["step_s"].append(time.perf_counter() - t0)
        out["losses"].append(loss.item())
    module = net.module if hasattr(net, "module") else net
    out["state"] = {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}
    out["buckets_per_step"] = state.get("buckets", 0) / steps
    del net, opt
    return out


def train_single(model: str = "mlp", global_batch: int = 128, steps: int = 5, lr: float = 0.1,
                 seed: int = 0) -> dict:
    """The reference: one device on the whole global batch."""
    torch.manual_seed(seed)
    net = build(model)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    batches = _batches(model, global_batch)
    losses = []
    for _ in range(steps):
        xb, yb = next(batches)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(torch.as_tensor(xb)), torch.as_tensor(yb))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses,
            "state": {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}}


# ------------------------------------------------------------------ ring vs library
def ring_bandwidth(rank: int, world_size: int, sizes=(2**16, 2**20, 2**22), repeats: int = 5) -> list:
    """Worker: median time of our ring and of the library's all-reduce, per size."""
    out = []
    for nbytes in sizes:
        t = torch.zeros(nbytes // 4)
        for name, fn in (("our ring", ring_all_reduce), ("library", comm.all_reduce)):
            times = []
            for i in range(repeats + 1):
                comm.barrier()
                t0 = time.perf_counter()
                fn(t)
                if i:
                    times.append(time.perf_counter() - t0)
            out.append({"op": "all_reduce", "impl": name, "world_size": world_size,
                        "bytes": nbytes, "seconds": float(np.median(times))})
    return out if rank == 0 else []


def ring_demo(rank: int, world_size: int, numel: int = 8) -> dict:
    """Worker: a small ring all-reduce with its log of who sends which chunk when."""
    t = torch.arange(numel, dtype=torch.float32) + 100 * rank
    log: list = []
    ring_all_reduce(t, log)
    return {"result": t.numpy(), "log": log}


def _average_exercise(rank: int, world_size: int, fn) -> dict:
    torch.manual_seed(0)
    net = models.mlp((16, 8, 4))
    x = torch.randn(8, 16)
    y = torch.randint(0, 4, (8,))
    b = 8 // world_size
    nn.functional.cross_entropy(net(x[rank * b:(rank + 1) * b]), y[rank * b:(rank + 1) * b]).backward()
    fn(net)
    return {n: p.grad.numpy().copy() for n, p in net.named_parameters()}


def check_average_gradients(fn, world_size: int = 2):
    """Run the learner's gradient averaging on real ranks; compare with one device."""
    from ..exercises import run_on_ranks
    results = run_on_ranks("average_gradients", _average_exercise, fn, world_size)
    if results is None:
        return average_gradients
    torch.manual_seed(0)
    net = models.mlp((16, 8, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    nn.functional.cross_entropy(net(x), y).backward()
    for name, p in net.named_parameters():
        got = [r[name] for r in results]
        if any(not np.allclose(g, got[0], atol=1e-7) for g in got):
            print(f"[average_gradients] the ranks disagree on {name}: every rank must end with "
                  "the same gradient. The lab goes on with the reference.")
            return average_gradients
        if not np.allclose(got[0], p.grad.numpy(), atol=1e-6):
            ratio = float(np.median(got[0] / np.where(p.grad.numpy() == 0, np.nan, p.grad.numpy())))
            hint = (f" (yours is about {ratio:.2g}x the right one: a sum needs dividing by the "
                    "number of ranks)" if np.isfinite(ratio) else "")
            print(f"[average_gradients] {name} differs from the whole-batch gradient{hint}. "
                  "The lab goes on with the reference.")
            return average_gradients
    print(f"[average_gradients] correct: on {world_size} ranks the averaged gradients equal "
          "the whole batch's on one device.")
    return fn
