"""Lab 05: synchronous data parallelism. Every rank holds the whole model (a replica),
takes its own slice of each global batch, and averages gradients with the others, so
every replica applies the same update and they stay identical.

Three ways to average, from by-hand to library:

* ``average_gradients``: one all-reduce per parameter, after the backward pass;
* ``ring_all_reduce``: the ring algorithm written out with send/recv;
* ``DistributedDataParallel`` with a traced communication hook: gradients are averaged in
  buckets, each bucket's all-reduce starting in the background as soon as its gradients
  are ready, while the backward pass goes on (overlap).

Every function runs on ``group`` (default: all ranks): the replicas of a hybrid are one
line of a device mesh.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from .. import core_waits
from ..trace import COMPUTE, WAIT, recorder, span
from . import comm, runtime, training
from .groups import as_group

# ------------------------------------------------------------------ by hand


def average_gradients(model: nn.Module, group=None) -> None:
    """Replace every gradient by its mean over the group (one all-reduce per tensor)."""
    for p in model.parameters():
        if p.grad is not None:
            comm.all_reduce(p.grad, op="avg", group=group)


def ring_all_reduce(tensor: torch.Tensor, log: list | None = None, group=None) -> torch.Tensor:
    """Sum ``tensor`` over the group's ranks in place, with the ring algorithm.

    The tensor is cut into n chunks. Reduce-scatter: in step k, position r sends chunk
    (r - k) mod n to its right neighbour and adds the chunk (r - k - 1) mod n it receives
    from its left one; after n - 1 steps position r holds the full sum of chunk
    (r + 1) mod n. All-gather: n - 1 more steps pass the finished chunks around the ring.
    Each rank sends 2(n - 1)/n of the tensor in all (Patarasuk & Yuan, 2009).
    """
    g = as_group(group)
    r, n = g.index, g.size
    if n == 1:
        return tensor
    if not tensor.is_contiguous():
        raise ValueError("ring_all_reduce works in place on a contiguous tensor")
    chunks = list(tensor.view(-1).tensor_split(n))  # views: sizes may differ by one
    for phase in ("reduce-scatter", "all-gather"):
        for k in range(n - 1):
            if phase == "reduce-scatter":
                send_i, recv_i = (r - k) % n, (r - k - 1) % n
                incoming = torch.empty_like(chunks[recv_i])
            else:
                send_i, recv_i = (r + 1 - k) % n, (r - k) % n
                incoming = chunks[recv_i]          # a finished chunk: receive in place
            pending = comm.isend(chunks[send_i], g.right, group=g)
            comm.recv(incoming, g.left, group=g)
            if phase == "reduce-scatter":
                with span("add chunk"):
                    chunks[recv_i] += incoming
            comm.wait_all([pending])
            if log is not None:
                log.append({"phase": phase, "step": k, "rank": g.rank, "sends chunk": send_i,
                            "to": g.right, "receives chunk": recv_i})
    return tensor


# ------------------------------------------------------------------ DDP with traced hooks
def traced_hook(state: dict, bucket):
    """DDP communication hook: average a gradient bucket through the traced layer.

    state: {"lane": background lane, "compress": send float16 instead of float32,
    "group": the data-parallel group}.
    """
    state["buckets"] = state.get("buckets", 0) + 1
    return _average_bucket(state, bucket.buffer(), bucket.index())


def _average_bucket(state: dict, buf: torch.Tensor, index: int) -> torch.futures.Future:
    """Start the all-reduce of a bucket on the background lane; the future divides it by
    the group's size once it has arrived (on the thread that completes it)."""
    group = state.get("group")
    world_size = comm.get_world_size(group)
    wire = buf.to(torch.float16) if state["compress"] else buf
    # numbered: a bucket handed over while the previous one is in flight overlaps it, and
    # a lane merges touching spans of one name into one bar; each its own name, each its bar
    name = "fp16 bucket all_reduce" if state["compress"] else "bucket all_reduce"
    fut = comm.all_reduce_async(wire, lane=state["lane"], group=group, name=f"{name} {index}")

    def finish(f):
        reduced = f.value()[0] if isinstance(f.value(), list) else f.value()
        buf.copy_(reduced.to(buf.dtype) / world_size)
        return buf

    return fut.then(finish)


def deferred_hook(state: dict, bucket):
    """DDP communication hook that sends nothing: it keeps the bucket for after the
    backward pass (``mode="ddp_no_overlap"``: DDP's own buckets, without overlap).

    state: as ``traced_hook``'s, and "deferred": the list the buckets are kept in.
    """
    state["buckets"] = state.get("buckets", 0) + 1
    state["deferred"].append((bucket.index(), bucket.buffer(), bucket.parameters(),
                              bucket.gradients()))
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def all_reduce_deferred(state: dict) -> None:
    """After the backward pass: average the buckets ``deferred_hook`` kept, one after the
    other in DDP's order, each as ``traced_hook`` would (the same all-reduce on the
    background lane, the same division). A process group runs its collectives in order
    anyway; started one by one, each bucket's bar stands apart on the lane."""
    for index, buf, params, grads in state["deferred"]:
        fut = _average_bucket(state, buf, index)
        with span("wait for buckets", WAIT):
            fut.wait()
        for p, g in zip(params, grads):
            if p.grad is not None and p.grad.data_ptr() != g.data_ptr():
                p.grad.copy_(g)     # gradients that are not views of the bucket
    state["deferred"].clear()


# ------------------------------------------------------------------ training
MODES = ("by_hand", "ring", "ddp", "ddp_fp16", "ddp_no_overlap")


def build(model: str = "mlp") -> nn.Sequential:
    """The model a replica holds, by name (see ``training.MODELS``)."""
    return training.build_model(model)


def train_data_parallel(rank: int, world_size: int, mode: str = "by_hand", model: str = "mlp",
                        global_batch: int = 128, steps: int = 5, lr: float = 0.1,
                        bucket_mb: float = 25.0, seed: int = 0, sizes=None,
                        bucket_view: bool = False, *, group=None) -> dict:
    """Rank function: train a replica on its slice of every global batch.

    The replicas are the group's ranks (default: all). Position i of n takes rows
    i*b:(i+1)*b of each global batch (b = global_batch / n), so the averaged gradient
    equals the gradient of the whole batch on one device.

    mode "ddp_no_overlap": DDP's own buckets, all-reduced after the backward pass, not
    during it. sizes: the MLP's widths (default the course's); bucket_view: DDP's
    gradients are views of its buckets (no copies).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    g, device = as_group(group), runtime.rank_device()
    rows = g.rows(global_batch, "global batch")
    net = training.build_model(model, sizes=sizes, seed=seed).to(device)  # same weights everywhere
    # DDP's bucket all-reduces run on a background lane of their own, after the ranks' lanes
    state = {"lane": world_size + rank, "compress": mode == "ddp_fp16", "group": g.pg,
             "deferred": []}
    # DDP's backward() returns only once every bucket's all-reduce has completed: on a
    # CPU, where host times are exact, the last gradient's arrival splits it into the
    # backward computation and the wait for the buckets still travelling.
    split_backward = mode in ("ddp", "ddp_fp16") and device.type == "cpu"
    counted = recorder().core_waits     # read the thread's counters at the split, too
    last_grad = [0.0, None, 0]          # when the last gradient was ready; the counters then;
                                        # how many gradients are ready in this backward
    if mode.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(net, bucket_cap_mb=bucket_mb, process_group=g.pg,
                                      gradient_as_bucket_view=bucket_view)
        net.register_comm_hook(state, deferred_hook if mode == "ddp_no_overlap" else traced_hook)
        if split_backward:
            n_grads = sum(1 for p in net.parameters() if p.requires_grad)

            def at_last_grad(_p):
                # the counters once a backward, at its last gradient (core_waits.at_edge),
                # not at every tensor's: each read costs a few microseconds
                last_grad[2] += 1
                if counted and last_grad[2] == n_grads:
                    last_grad[1], last_grad[0] = core_waits.at_edge(time.perf_counter,
                                                                    core_waits.read_own)
                else:
                    last_grad[0] = time.perf_counter()
            for p in net.parameters():
                p.register_post_accumulate_grad_hook(at_last_grad)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    batches = training.digit_batches(model, global_batch)
    out = {"losses": [], "step_s": [], "buckets_each_step": []}
    for step in range(steps):
        buckets_before = state.get("buckets", 0)
        x, y = training.on_device(*next(batches), device, rows)
        runtime.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        with span("forward"):
            loss = loss_fn(net(x), y)
        if split_backward:
            last_grad[1:] = [None, 0]
            c0, b0 = (core_waits.at_edge(time.perf_counter, core_waits.read_own) if counted
                      else (None, time.perf_counter()))
            loss.backward()            # buckets are all-reduced in the background meanwhile
            c1, b1 = (core_waits.at_edge(time.perf_counter, core_waits.read_own) if counted
                      else (None, time.perf_counter()))
            # the autograd hooks run on this thread: its counters at the last one split
            # the waits for a core between the backward pass and the wait for buckets
            cm = last_grad[1]
            ok = c0 is not None and c1 is not None and cm is not None
            recorder().add("backward", COMPUTE, b0, last_grad[0],
                           core_wait_s=cm[2] - c0[2] if ok else 0.0,
                           clock=(*c0[:2], *cm[:2]) if ok else None)
            recorder().add("wait for buckets", WAIT, last_grad[0], b1,
                           core_wait_s=c1[2] - cm[2] if ok else 0.0,
                           clock=(*cm[:2], *c1[:2]) if ok else None)
        else:
            with span("backward"):
                loss.backward()        # DDP on a GPU: bucket waiting included
        if mode == "by_hand":
            average_gradients(net, g)
        elif mode == "ddp_no_overlap":
            all_reduce_deferred(state)
        elif mode == "ring":
            flat = training.flat_gradients(net)
            ring_all_reduce(flat, group=g)
            training.set_flat_gradients(net, flat / g.size)
        with span("update"):
            opt.step()
        runtime.synchronize()
        out["step_s"].append(time.perf_counter() - t0)
        out["losses"].append(loss.item())
        out["buckets_each_step"].append(state.get("buckets", 0) - buckets_before)
    module = net.module if hasattr(net, "module") else net
    out["state"] = training.state_numpy(module)
    out["buckets_per_step"] = state.get("buckets", 0) / steps
    del net, opt
    return out


def train_single(model: str = "mlp", global_batch: int = 128, steps: int = 5, lr: float = 0.1,
                 seed: int = 0, optimizer: str = "sgd", sizes=None) -> dict:
    """The reference: one device on the whole global batch ("sgd" or "adam"; ``sizes``:
    the MLP's widths, default the course's)."""
    net = training.build_model(model, sizes=sizes, seed=seed)
    opt = training.make_optimizer(optimizer, net.parameters(), lr)
    batches = training.digit_batches(model, global_batch)
    losses = []
    for _ in range(steps):
        xb, yb = next(batches)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(torch.as_tensor(xb)), torch.as_tensor(yb))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "state": training.state_numpy(net)}


# ------------------------------------------------------------------ ring vs library
def ring_bandwidth(rank: int, world_size: int, sizes=(2**16, 2**20, 2**22), repeats: int = 15,
                   *, group=None) -> list:
    """Rank function: the time of our ring and of the library's all-reduce, per size.

    Each repetition runs both, one after the other, each after a barrier, so that a drift
    of the machine's speed meets both alike; each keeps its quickest repetition. On a few
    shared cores a third of the repetitions or more can be delayed by the scheduler, by
    milliseconds, and a delayed repetition is slower, never faster."""
    g, device = as_group(group), runtime.rank_device()
    out = []
    for nbytes in sizes:
        t = torch.zeros(nbytes // 4, device=device)
        impls = (("our ring", ring_all_reduce), ("library", comm.all_reduce))
        times: dict[str, list[float]] = {name: [] for name, _ in impls}
        for i in range(repeats + 1):                     # the first is a warm-up
            for name, fn in impls:
                seconds = runtime.timed_once(lambda: fn(t, group=g),
                                             before=lambda: comm.barrier(group=g))
                if i:
                    times[name].append(seconds)
        for name, xs in times.items():
            out.append({"op": "all_reduce", "impl": name, "world_size": g.size,
                        "bytes": nbytes, "seconds": min(xs)})
    return out if g.first else []


def ring_demo(rank: int, world_size: int, numel: int = 8, *, group=None) -> dict:
    """Rank function: a small ring all-reduce with its log of who sends which chunk when."""
    g = as_group(group)
    t = torch.arange(numel, dtype=torch.float32, device=runtime.rank_device()) + 100 * g.index
    log: list = []
    ring_all_reduce(t, log, group=g)
    return {"result": training.to_numpy(t), "log": log}
