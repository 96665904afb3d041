"""Lab 09's programs: short rank functions, each broken the way real jobs break, and fixed.

The lab prints them (``reports.listing``: line 1 is the ``def``) and provokes them under a
timeout (``reports.provoke``), whose reports number lines the same way. The imports sit
inside the functions, as in a notebook cell: a rank runs nothing else of this module.
"""
from __future__ import annotations

SIZES = (64, 32, 10)     # the replicas' MLP: small, so a drift or a NaN shows in a few steps
STEPS = 10               # data-parallel steps of the drift and NaN programs
SHARD = 32               # rows of each global batch a rank takes (2 ranks: batches of 64)
FOLDER = "traces/lab09"  # where the lab writes each run's full report, beside the notebook
HANG_TIMEOUT = 4.0       # seconds a launch that hangs is given, start-up included (a 2-rank
#                          start takes ~0.4 s on a quiet 2-core machine, up to 2 s when busy)
FAIL_TIMEOUT = 30.0      # a launch expected to end on its own (a fix, a crash)


# ------------------------------------------------------------------ deadlock by message order
def swap(rank, world_size, numel=1024):
    """Two ranks swap tensors: each sends its own, then receives the other's."""
    import torch
    from parlab.torch import comm
    mine, theirs = torch.full((numel,), float(rank)), torch.empty(numel)
    peer = 1 - rank
    comm.send(mine, peer)
    comm.recv(theirs, peer)
    return theirs[0].item()


def swap_by_parity(rank, world_size, numel=1024):
    """Fix 1: even ranks send first, odd ranks receive first."""
    import torch
    from parlab.torch import comm
    mine, theirs = torch.full((numel,), float(rank)), torch.empty(numel)
    peer = 1 - rank
    if rank % 2 == 0:
        comm.send(mine, peer)
        comm.recv(theirs, peer)
    else:
        comm.recv(theirs, peer)
        comm.send(mine, peer)
    return theirs[0].item()


def swap_nonblocking(rank, world_size, numel=1024):
    """Fix 2: post the send without waiting for it, receive, then wait for the send."""
    import torch
    from parlab.torch import comm
    mine, theirs = torch.full((numel,), float(rank)), torch.empty(numel)
    peer = 1 - rank
    pending = comm.isend(mine, peer)
    comm.recv(theirs, peer)
    comm.wait_all([pending])
    return theirs[0].item()


def swap_collective(rank, world_size, numel=1024):
    """Fix 3: a collective, which the library schedules so that it cannot deadlock."""
    import torch
    from parlab.torch import comm
    mine = torch.full((numel,), float(rank))
    theirs = comm.all_gather(mine)[1 - rank]
    return theirs[0].item()


def send_while_receiver_is_late(rank, world_size, sizes=(4, 4096, 65536, 2**20, 2**24),
                                late_s=0.2):
    """Rank 1 posts each receive late_s seconds late; rank 0 times how long its send blocks.
    A send that buffers its message returns at once; one that waits for the receiver
    blocks about late_s."""
    import time

    import torch
    from parlab.torch import comm
    blocked = {}
    for nbytes in sizes:
        t = torch.zeros(max(nbytes // 4, 1))
        comm.barrier()
        if rank == 0:
            t0 = time.perf_counter()
            comm.send(t, 1)
            blocked[nbytes] = time.perf_counter() - t0
        else:
            time.sleep(late_s)
            comm.recv(t, 0)
    return blocked


def ring_shift_blocking(rank, world_size, numel=4096):
    """Every rank passes its tensor to its right neighbour on a ring: send, then receive."""
    import torch
    from parlab.torch import comm
    mine, received = torch.full((numel,), float(rank)), torch.empty(numel)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    comm.send(mine, right)
    comm.recv(received, left)
    return received[0].item()


def ring_shift(rank, world_size, numel=4096):
    """The ring shift without a deadlock: post the send, receive, wait for the send."""
    import torch
    from parlab.torch import comm
    mine, received = torch.full((numel,), float(rank)), torch.empty(numel)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    pending = comm.isend(mine, right)
    comm.recv(received, left)
    comm.wait_all([pending])
    return received[0].item()


# ------------------------------------------------------------------ collectives that do not match
def log_mean_loss(rank, world_size):
    """Every rank has a loss; rank 0 averages them for its log line; a barrier ends the step."""
    import torch
    from parlab.torch import comm
    loss = torch.tensor([float(rank + 1)])
    if rank == 0:
        comm.all_reduce(loss, op="avg")          # called by rank 0 alone
        print(f"mean loss {loss.item():.2f}")
    comm.barrier()
    return loss.item()


def log_mean_loss_fixed(rank, world_size):
    """Every rank takes part in the all-reduce; rank 0 alone prints."""
    import torch
    from parlab.torch import comm
    loss = torch.tensor([float(rank + 1)])
    comm.all_reduce(loss, op="avg")
    if rank == 0:
        print(f"mean loss {loss.item():.2f}")
    comm.barrier()
    return loss.item()


MISMATCHES = ("length", "shape", "dtype")


def mismatched(rank, world_size, kind="length"):
    """One all-reduce; rank 1's tensor differs from rank 0's: 8 numbers instead of 4
    (length), 2 x 2 instead of 4 (shape), or int32 instead of float32 (dtype)."""
    import torch
    from parlab.torch import comm
    grad = torch.ones(4)
    if rank == 1:
        grad = {"length": torch.ones(8), "shape": torch.ones(2, 2),
                "dtype": torch.ones(4, dtype=torch.int32)}[kind]
    comm.all_reduce(grad)
    return grad.flatten().tolist()


def small_all_reduces(rank, world_size, calls=200):
    """Seconds of each of ``calls`` all-reduces of 4 numbers (the median)."""
    import statistics
    import time

    import torch
    from parlab.torch import comm
    x, took = torch.ones(4), []
    for _ in range(calls):
        t0 = time.perf_counter()
        comm.all_reduce(x)
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


# ------------------------------------------------------------------ data parallel, by hand
def shards(rank):
    """This rank's rows of every global batch of the training digits (SHARD each)."""
    import torch
    from parlab.torch import training
    for xb, yb in training.digit_batches("mlp", 2 * SHARD):
        rows = slice(rank * SHARD, (rank + 1) * SHARD)
        yield torch.as_tensor(xb[rows]).clone(), torch.as_tensor(yb[rows])


def data_parallel_step(net, opt, batch) -> float:
    """Lab 05's step: forward, backward, average the gradients over the ranks, update."""
    from torch.nn.functional import cross_entropy

    from parlab.torch.data_parallel import average_gradients
    x, y = batch
    opt.zero_grad()
    loss = cross_entropy(net(x), y)
    loss.backward()
    average_gradients(net)
    opt.step()
    return loss.item()


def flip_a_bit(tensor) -> None:
    """Flip the lowest bit of the tensor's first number, in place: what a faulty core or
    memory cell does to one replica (a change of about 1e-7 of the number)."""
    import torch
    bits = tensor.detach().view(-1)[:1].view(torch.int32)
    bits ^= 1


def replicas_from_own_seeds(rank, world_size, steps=STEPS):
    """Each rank builds its replica, trains with averaged gradients, checks the replicas."""
    import torch
    from parlab.torch import replicas, training
    net = training.build_model("mlp", sizes=SIZES)    # weights drawn from this rank's seed
    opt = torch.optim.SGD(net.parameters(), lr=0.2)
    watch = replicas.DriftWatch(net)                  # one collective per check
    watch.check("start")
    for step, batch in zip(range(steps), shards(rank)):
        data_parallel_step(net, opt, batch)
        watch.check(step)
    return {"first": watch.first, "state": training.state_numpy(net)}


def replicas_broadcast(rank, world_size, steps=STEPS):
    """The fix DDP applies when it wraps a model: rank 0's weights, broadcast to all."""
    import torch
    from parlab.torch import comm, replicas, training
    net = training.build_model("mlp", sizes=SIZES)
    for tensor in net.state_dict().values():
        comm.broadcast(tensor, 0)                     # every replica starts from rank 0's
    opt = torch.optim.SGD(net.parameters(), lr=0.2)
    watch = replicas.DriftWatch(net)
    watch.check("start")
    for step, batch in zip(range(steps), shards(rank)):
        data_parallel_step(net, opt, batch)
        watch.check(step)
    return {"first": watch.first, "state": training.state_numpy(net)}


FLIP = {"rank": 1, "step": 6, "tensor": "2.weight"}     # where the bit flip is planted


def replicas_with_a_flipped_bit(rank, world_size, steps=STEPS, flip=None):
    """Replicas that start equal; at one step one rank's tensor loses a bit."""
    import torch
    from parlab.torch import replicas, training
    flip = flip or FLIP
    net = training.build_model("mlp", sizes=SIZES, seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.2)
    watch = replicas.DriftWatch(net)
    losses = []
    for step, batch in zip(range(steps), shards(rank)):
        losses.append(data_parallel_step(net, opt, batch))
        if rank == flip["rank"] and step == flip["step"]:
            flip_a_bit(net.state_dict()[flip["tensor"]])    # a faulty core, emulated
        watch.check(step)
    return {"first": watch.first, "losses": losses, "state": training.state_numpy(net)}


def scheduled_on_rank_0(rank, world_size, steps=12):
    """Data parallel by hand, the learning rate halved every 4 steps; rank 0 logs."""
    import torch
    from parlab.torch import replicas, training
    net = training.build_model("mlp", sizes=SIZES, seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.4)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    watch = replicas.DriftWatch(net)
    for step, batch in zip(range(steps), shards(rank)):
        loss = data_parallel_step(net, opt, batch)
        if rank == 0:
            print(f"step {step}: loss {loss:.3f}, learning rate {schedule.get_last_lr()[0]:g}")
            schedule.step()
        watch.check(step)
    return {"state": training.state_numpy(net), "first": watch.first,
            "lr": schedule.get_last_lr()[0]}


def scheduled(rank, world_size, steps=12):
    """The same, with the schedule stepped on every rank: rank 0 only logs."""
    import torch
    from parlab.torch import replicas, training
    net = training.build_model("mlp", sizes=SIZES, seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.4)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    watch = replicas.DriftWatch(net)
    for step, batch in zip(range(steps), shards(rank)):
        loss = data_parallel_step(net, opt, batch)
        if rank == 0:
            print(f"step {step}: loss {loss:.3f}, learning rate {schedule.get_last_lr()[0]:g}")
        schedule.step()
        watch.check(step)
    return {"state": training.state_numpy(net), "first": watch.first,
            "lr": schedule.get_last_lr()[0]}


def scheduled_on_one_device(steps=12) -> dict:
    """What ``scheduled`` must equal: one device on the whole batches, the same schedule."""
    import torch
    from parlab.torch import training
    net = training.build_model("mlp", sizes=SIZES, seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.4)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    both = zip(shards(0), shards(1))
    for _, ((x0, y0), (x1, y1)) in zip(range(steps), both):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(torch.cat([x0, x1])), torch.cat([y0, y1])).backward()
        opt.step()
        schedule.step()
    return {"state": training.state_numpy(net), "lr": schedule.get_last_lr()[0]}


# ------------------------------------------------------------------ NaN on one rank
BLANK = {"rank": 1, "step": 6}       # where a blank image is planted in a rank's shard


def standardized(rank, world_size, steps=STEPS, blank=None, eps=0.0):
    """Data parallel, each image standardized to mean 0 and deviation 1 first; a check for
    NaN or infinity on every rank before the gradients are averaged."""
    import torch
    from torch.nn.functional import cross_entropy
    from parlab.torch import replicas, training
    from parlab.torch.data_parallel import average_gradients
    blank = blank or BLANK
    net = training.build_model("mlp", sizes=SIZES, seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.2)
    watch = replicas.NonFiniteWatch()
    losses = []
    for step, (x, y) in zip(range(steps), shards(rank)):
        if rank == blank["rank"] and step == blank["step"]:
            x[0] = 0.0                                             # a blank image
        x = (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + eps)
        opt.zero_grad()
        loss = cross_entropy(net(x), y)
        loss.backward()
        watch.check(step, batch=x, loss=loss, gradients=training.flat_gradients(net))
        average_gradients(net)
        opt.step()
        losses.append(loss.item())
    return {"first": watch.first, "losses": losses, "state": training.state_numpy(net)}


# ------------------------------------------------------------------ a rank that dies
DEATHS = ("raise", "exit", "killed", "frozen")


def dies(rank, world_size, how="raise", at_step=3, timeout_s=None):
    """Eight steps of one all-reduce each; at step 3, rank 1 dies one way or another.
    timeout_s: the all-reduces run on a group that gives up after that many seconds."""
    import os
    import signal
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from parlab.torch import comm
    group = dist.new_group(timeout=timedelta(seconds=timeout_s)) if timeout_s else None
    grad = torch.ones(1000)
    for step in range(8):
        if rank == 1 and step == at_step:
            if how == "raise":
                raise ValueError(f"record {step} of shard 1 is malformed")
            if how == "exit":
                os._exit(3)                               # a library that calls exit()
            if how == "killed":
                os.kill(os.getpid(), signal.SIGKILL)      # what the out-of-memory killer does
            if how == "frozen":
                os.kill(os.getpid(), signal.SIGSTOP)      # a machine that stops answering
        comm.all_reduce(grad, group=group)
    return step


# ------------------------------------------------------------------ a straggler
def data_parallel_with_a_straggler(rank, world_size, steps=20, slow=None, model="cnn",
                                   global_batch=192):
    """Data parallel by hand, the gradients averaged in one all-reduce a step; each rank in
    ``slow`` ({rank: factor}) computes factor times slower (emulated: it idles after its
    backward pass, as lab 06's slow worker does). The idle is priced on the passes' CPU
    time (``time.thread_time``), not their wall time: on shared cores the wall time holds
    waits for a core, and the straggler would idle those too, slower than ``factor`` on a
    dedicated device (its replay waited 91-93 % where a 3x straggler gives 2/3)."""
    import time

    import torch
    from torch.nn.functional import cross_entropy
    from parlab import span
    from parlab.torch import comm, training
    from parlab.torch.parameter_server import EmulatedSlowdown
    factor = (slow or {}).get(rank, 1.0)
    slowdown = EmulatedSlowdown(factor)
    net = training.build_model(model, seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    batches = training.digit_batches(model, global_batch)
    share = global_batch // world_size
    step_s = []
    for step in range(steps):
        x, y = training.on_device(*next(batches), "cpu", slice(rank * share, (rank + 1) * share))
        t0, ran0 = time.perf_counter(), time.thread_time()
        with span("forward"):
            loss = cross_entropy(net(x), y)
        opt.zero_grad()
        with span("backward"):
            loss.backward()
        if factor > 1:
            with span("emulated slowdown"):
                time.sleep(slowdown.idle_s(time.thread_time() - ran0))
        grads = training.flat_gradients(net)
        comm.all_reduce(grads, op="avg", name="gradient all_reduce")
        training.set_flat_gradients(net, grads)
        with span("update"):
            opt.step()
        step_s.append(time.perf_counter() - t0)
    return {"step_s": step_s, "slowdown": factor}


# ------------------------------------------------------------------ TensorFlow
def tf_worker_that_freezes(rank, world_size, ports, freeze_at=3, timeout_s=2.0, steps=8):
    """MultiWorkerMirroredStrategy, one worker per process (TF_CONFIG); each step all-reduces
    a gradient across the workers. At step ``freeze_at`` worker 1 stops answering.
    timeout_s: how long a collective may wait (CommunicationOptions)."""
    import json
    import os
    import signal

    from parlab.hardware import quiet_tensorflow
    from parlab.tf.cluster import tf_config
    os.environ["TF_CONFIG"] = json.dumps(tf_config(ports, rank))   # before the strategy
    quiet_tensorflow()
    import tensorflow as tf
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_s)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

    @tf.function
    def step():
        def replica():
            grad = tf.ones(1000)                      # stands for this worker's gradient
            return tf.distribute.get_replica_context().all_reduce("sum", grad)
        return strategy.run(replica)

    for s in range(steps):
        if rank == 1 and s == freeze_at:
            os.kill(os.getpid(), signal.SIGSTOP)          # a machine that stops answering
        step()
    return s
