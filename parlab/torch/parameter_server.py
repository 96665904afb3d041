"""Lab 06: parameters that live outside the workers.

(In this module a *worker* is a role, as in parameter-server papers: a rank that
computes gradients for the servers. The function every rank runs is ``train_parameter_server``.)

A **parameter server** holds the model's parameters (or a shard of them) and updates
them; **workers** hold no state of their own between steps: each pulls the current
parameters, computes a gradient on its own data and pushes it back. Ranks
``0 .. num_servers - 1`` are servers, the rest are workers; the flat parameter vector
is cut into ``num_servers`` contiguous shards, one per server, and a worker talks to
every server (pull all shards, push each shard's gradient to its server).

Two ways for a server to treat the pushes:

* ``"sync"``: wait for one gradient from every worker, apply their average, then send
  the new parameters to all. Exactly synchronous data parallelism with a central
  reducer, so the slowest worker sets the pace.
* ``"async"``: apply each gradient the moment it arrives and send the pusher fresh
  parameters. Nobody waits for anybody, but a gradient may have been computed on
  parameters that other pushes have changed since: its **staleness** is how many
  updates the server applied between the worker's pull and its push.

Every message is a header of two numbers, then (unless it says goodbye) a flat float32
shard. The header's arrival is what a rank waits for, so its receive is recorded as a
*wait* span; the shard that follows is recorded as communication, its transfer. The
timeline thus tells waiting for a peer apart from moving bytes.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..split import share
from ..system import listening_addresses
from ..trace import WAIT, recorder, span
from . import comm, runtime, training
from .groups import Group, as_group
from .training import flat_gradients, flat_parameters, load_flat

MODES = ("sync", "async")

# Headers. Worker -> server: [kind, loss of the batch]; server -> worker: [version, stop].
_PUSH_GRADIENT, _PUSH_LEAVING = 0.0, 1.0


# ------------------------------------------------------------------ roles and shards
def roles(world_size: int, num_servers: int, ranks=None) -> tuple[list[int], list[int]]:
    """(server ranks, worker ranks) among ``ranks`` (default: 0 .. world_size - 1).

    The first ``num_servers`` ranks of the group serve, the others are workers.
    """
    if not isinstance(num_servers, int) or num_servers < 1:
        raise ValueError(f"num_servers must be a whole number >= 1, got {num_servers!r}")
    if world_size - num_servers < 1:
        raise ValueError(
            f"{world_size} processes leave no worker beside {num_servers} server(s): launch "
            f"at least {num_servers + 1} processes, or use fewer servers")
    ranks = list(range(world_size)) if ranks is None else list(ranks)
    return ranks[:num_servers], ranks[num_servers:]


def shard_bounds(numel: int, num_servers: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) pieces of a flat vector, sizes differing by at most one."""
    if num_servers > numel:
        raise ValueError(f"cannot cut {numel} parameters into {num_servers} non-empty shards")
    base, extra = divmod(numel, num_servers)
    bounds, start = [], 0
    for s in range(num_servers):
        stop = start + base + (s < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


# ------------------------------------------------------------------ update rules
def sgd_update(shard: torch.Tensor, grad: torch.Tensor, lr: float, staleness: int) -> None:
    """The server's rule for one asynchronous push: plain SGD, in place.

    ``staleness`` is how many updates landed since the pusher read these parameters;
    plain SGD ignores it (a staleness-aware rule could scale ``lr`` down with it).
    """
    shard.sub_(grad, alpha=lr)


def _now() -> float:
    """Host seconds on the merged clock of the run (the timeline's clock)."""
    return time.perf_counter() + recorder().offset


# ------------------------------------------------------------------ server
def _serve(g: Group, workers: list[int], mode: str, shard: torch.Tensor, total: int,
           lr: float, update: Callable) -> dict:
    """Serve one shard until every worker has left; return what happened to it.

    total: sync: the number of steps; async: stop the workers once this many gradients
    have been applied (only server 0 decides, so that all workers stop at one signal).
    """
    grad = torch.empty_like(shard)
    header_in, header_out = torch.empty(2), torch.empty(2)
    version = 0
    read_version = {}                   # the version each worker last pulled
    applied: list[dict] = []            # one record per gradient applied

    def send_params(worker: int, stop: bool) -> None:
        header_out[0], header_out[1] = version, float(stop)
        read_version[worker] = version
        comm.send(header_out, worker, name="send header", group=g)
        comm.send(shard, worker, name="send params", group=g)

    def receive_push(worker: int | None) -> tuple[int, bool]:
        """(sender, leaving?); worker None: whoever pushes first."""
        if worker is None:
            worker = comm.recv_any(header_in, name="wait for push", kind=WAIT, group=g)
        else:
            comm.recv(header_in, worker, name="wait for push", kind=WAIT, group=g)
        if header_in[0] == _PUSH_LEAVING:
            return worker, True
        comm.recv(grad, worker, name="receive gradients", group=g)
        return worker, False

    def record(worker: int) -> None:
        applied.append({"time": _now(), "worker": worker, "loss": float(header_in[1]),
                        "staleness": version - read_version[worker], "version": version})

    start = _now()
    for w in workers:
        send_params(w, stop=total == 0)
    if mode == "sync":
        grad_sum = torch.zeros_like(shard)
        for step in range(total):
            grad_sum.zero_()
            for w in workers:               # in rank order: the same sum on every run
                receive_push(w)
                with span("sum gradients"):
                    grad_sum += grad
                record(w)
            with span("apply update"):
                shard.sub_(grad_sum / len(workers), alpha=lr)
            version += 1
            for w in workers:
                send_params(w, stop=step == total - 1)
        for w in workers:
            receive_push(w)                 # each worker's goodbye
    else:
        left = 0
        while left < len(workers):          # serve pushes in the order they come
            w, leaving = receive_push(None)
            if leaving:
                left += 1
                continue
            with span("apply update"):
                update(shard, grad, lr, version - read_version[w])
            record(w)
            version += 1
            send_params(w, stop=g.first and len(applied) >= total)
    return {"role": "server", "shard": shard.numpy().copy(), "applied": applied,
            "updates": version, "start": start, "end": _now(),
            "listening": listening_addresses()}    # gloo's sockets, pinned to the loopback


# ------------------------------------------------------------------ worker
class EmulatedSlowdown:
    """A worker whose computation is ``factor`` times slower than it is, without taking
    a core from others: after each gradient it idles ``factor - 1`` times its compute
    time C (forward and backward).

    C is measured once: the median over ``measure`` steps after the first ``skip``
    (which pay for warming up); until then the idle follows each step's own compute.
    An idle that followed every step's compute would grow with contention: where
    workers share cores, a step that waited for a core would idle that wait again,
    ``factor - 1`` times, and the slowdown would change with the load. Pulling and
    pushing are not slowed, so the worker's whole step is less than ``factor`` times
    slower: how much less depends on how long they take beside the compute.
    """

    def __init__(self, factor: float, measure: int = 5, skip: int = 2):
        self.factor, self.measure, self.skip = float(factor), measure, skip
        self.seen: list[float] = []

    def idle_s(self, compute_s: float) -> float:
        """Seconds to idle after a step whose forward and backward took ``compute_s``."""
        if len(self.seen) < self.skip + self.measure:
            self.seen.append(compute_s)
            return (self.factor - 1) * compute_s
        return (self.factor - 1) * float(np.median(self.seen[self.skip:]))


def _work(g: Group, servers: list[int], bounds, model: nn.Module, batches, rows: slice,
          slowdown: float) -> dict:
    """Pull, compute, push until server 0 says stop; then say goodbye to every server.

    The model computes on this rank's device; parameters and gradients travel through
    host memory, where the servers keep them.
    """
    device = runtime.rank_device()
    model.to(device)
    flat = torch.empty(bounds[-1][1])
    headers_in = [torch.empty(2) for _ in servers]
    headers_out = [torch.empty(2) for _ in servers]
    loss_fn = nn.CrossEntropyLoss()
    steps: list[dict] = []
    sends: list = []
    slow = EmulatedSlowdown(slowdown)
    while True:
        for i, (a, b) in enumerate(bounds):              # shard i lives on servers[i]
            comm.recv(headers_in[i], servers[i], name="wait for server", kind=WAIT, group=g)
            comm.recv(flat[a:b], servers[i], name="pull params", group=g)
        # The previous pushes are complete by now: a server replies only after receiving.
        # Waiting for them BEFORE these receives could deadlock with several servers: a
        # server blocked sending its reply to us while we wait for another server, itself
        # blocked sending to a worker that waits on the first server.
        comm.wait_all(sends)
        if headers_in[0][1] == 1.0:                      # server 0 says: stop
            break
        load_flat(model, flat)
        xb, yb = next(batches)
        x, y = training.on_device(xb, yb, device, rows)
        t0, ran0 = time.perf_counter(), time.thread_time()
        with span("forward"):
            loss = loss_fn(model(x), y)
        model.zero_grad(set_to_none=True)
        with span("backward"):
            loss.backward()
        if slowdown > 1:
            runtime.synchronize(device)
            # On the CPU the passes' own time is the thread's CPU time: their wall time
            # also holds waits for a core, which the idle would repeat (factor - 1) times.
            # A GPU's passes run off this thread: their wall time, synchronized.
            spent = (time.thread_time() - ran0 if device.type == "cpu"
                     else time.perf_counter() - t0)
            with span("emulated slowdown"):
                time.sleep(slow.idle_s(spent))
        grads = flat_gradients(model).cpu()
        steps.append({"time": _now(), "loss": loss.item(), "read_version": int(headers_in[0][0])})
        sends = []
        for i, (a, b) in enumerate(bounds):
            headers_out[i][0], headers_out[i][1] = _PUSH_GRADIENT, loss.item()
            sends.append(comm.isend(headers_out[i], servers[i], name="push header", group=g))
            sends.append(comm.isend(grads[a:b], servers[i], name="push gradients", group=g))
    sends = []
    for i, server in enumerate(servers):
        headers_out[i][0] = _PUSH_LEAVING
        sends.append(comm.isend(headers_out[i], server, name="leave", group=g))
    comm.wait_all(sends)
    return {"role": "worker", "steps": steps, "slowdown": slowdown, "params": flat.numpy()}


# ------------------------------------------------------------------ entry point
def train_parameter_server(rank: int, world_size: int, mode: str = "sync", num_servers: int = 1,
                           model: str = "mlp", global_batch: int = 128, steps: int = 10,
                           lr: float = 0.1, slow: dict | None = None, seed: int = 0,
                           update: Callable = sgd_update, *, group=None) -> dict:
    """Rank function: the group's first ``num_servers`` ranks serve, the others are workers.

    group: the ranks of this parameter-server system (default: all).

    global_batch: each step's batch is cut into equal slices, one per worker (worker i
    takes slice i), as in data parallelism, so sync mode equals one device on the
    global batch. steps: sync: the number of updates; async: the server stops the
    workers after ``steps x workers`` gradients (the same amount of data).
    slow: {global rank: factor}, an emulated slowdown of those workers' computation.
    update: the rule an async server applies to each push (see ``sgd_update``).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    g = as_group(group)
    servers, workers = roles(g.size, num_servers, g.ranks)
    share(global_batch, len(workers), f"{len(workers)} workers")
    slow = {int(r): float(f) for r, f in (slow or {}).items()}
    for r, factor in slow.items():
        if r not in workers or factor < 1:
            raise ValueError(f"slow={slow}: keys must be worker ranks {workers} and factors "
                             ">= 1 (3 means three times slower)")
    net = training.build_model(model, seed=seed)  # every rank builds the same initial model
    bounds = shard_bounds(sum(p.numel() for p in net.parameters()), num_servers)
    if g.rank in servers:
        a, b = bounds[g.index]
        total = steps if mode == "sync" else steps * len(workers)
        return _serve(g, workers, mode, flat_parameters(net)[a:b].clone(), total, lr, update)
    b = global_batch // len(workers)
    i = workers.index(g.rank)
    return _work(g, servers, bounds, net, training.digit_batches(model, global_batch),
                 slice(i * b, (i + 1) * b), slow.get(g.rank, 1.0))


# ------------------------------------------------------------------ reading the results
def assemble(results: list[dict]) -> np.ndarray:
    """The trained flat parameter vector, from the servers' shards in rank order."""
    return np.concatenate([r["shard"] for r in results if r["role"] == "server"])


def state_dict(results: list[dict], model: str = "mlp") -> dict:
    """The trained parameters as a state dict of numpy arrays (for comparisons)."""
    net = training.build_model(model)
    load_flat(net, torch.as_tensor(assemble(results)))
    return training.state_numpy(net)


def accuracy(results: list[dict], model: str = "mlp") -> float:
    """Test accuracy of the parameters the servers ended with."""
    from .. import data as datasets
    net = training.build_model(model)
    load_flat(net, torch.as_tensor(assemble(results)))
    x, y = datasets.digits("test", flat=model == "mlp")
    with torch.no_grad():
        return float((net(torch.as_tensor(x)).argmax(1).numpy() == y).mean())


def history(results: list[dict]) -> list[dict]:
    """Server 0's record of every applied gradient, times relative to its start."""
    server = results[0]
    return [dict(r, time=r["time"] - server["start"]) for r in server["applied"]]


def throughput(results: list[dict], global_batch: int) -> float:
    """Training samples per second: gradients applied by server 0, over its run time."""
    server = results[0]
    workers = sum(r["role"] == "worker" for r in results)
    samples = len(server["applied"]) * global_batch // workers
    return samples / (server["applied"][-1]["time"] - server["start"])


# ------------------------------------------------------------------ staleness, in one process
def train_with_delay(delay: int, steps: int = 200, batch: int = 32, lr: float = 0.1,
                     model: str = "mlp", seed: int = 0, every: int = 10) -> dict:
    """SGD where each gradient is computed on the parameters of ``delay`` updates ago.

    This is what a constant staleness does to training, without any process: the
    gradient applied at step t was taken at w_{t - delay}. Returns the training-set loss
    every ``every`` steps.
    """
    from collections import deque

    from .. import data as datasets
    net = training.build_model(model, seed=seed)
    x_all, y_all = (torch.as_tensor(a) for a in datasets.digits("train", flat=model == "mlp"))
    current = flat_parameters(net)
    past = deque([current.clone()], maxlen=delay + 1)
    batches = training.digit_batches(model, batch)
    losses = []
    for step in range(steps + 1):
        if step % every == 0:
            load_flat(net, current)
            with torch.no_grad():
                losses.append(float(nn.functional.cross_entropy(net(x_all), y_all)))
        if step == steps:
            break
        load_flat(net, past[0])                  # the oldest kept: delay updates ago
        xb, yb = next(batches)
        net.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(torch.as_tensor(xb)), torch.as_tensor(yb)).backward()
        current = current - lr * flat_gradients(net)
        past.append(current.clone())
    return {"delay": delay, "steps": list(range(0, steps + 1, every)), "loss": losses}
