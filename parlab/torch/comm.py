"""Traced communication: every send, receive and collective of the course goes here.

Each call runs the ``torch.distributed`` operation inside a communication span that
carries the message size, so a timeline cannot drift from what the code did. Strategy
modules call these, never ``torch.distributed`` directly.

Every call takes ``group=``: None (every rank), a torch ProcessGroup (e.g. a line of a
device mesh, ``mesh.group("tp")``) or a ``parlab.torch.groups.Group``. Peers (``dst``,
``src``) are global ranks, as in ``torch.distributed``. The span records the mesh axis
of the group, so a timeline can tell data-parallel bytes from tensor-parallel ones.

Each span also carries a match key: the k-th collective on a group, or the k-th message
from one rank to another, has the same key on every rank involved, so the timeline can
split the span into waiting for the peers and transferring (``parlab.trace.split_waits``).
Counters advance whether or not recording is on, so keys stay aligned across ranks.

``bytes`` on a span is the size of the buffer this rank hands to the operation: the
tensor sent or received, the tensor all-reduced or broadcast, this rank's contribution to
an all-gather, and the full input of a reduce-scatter. How many bytes actually cross the
links depends on the algorithm: see ``parlab.metrics.bus_factor``.

Ranks that share one GPU (``parlab.devices(n, mode="shared-gpu")``) cannot use NCCL,
which refuses two ranks on one device (NVIDIA/nccl#418), and gloo sends and receives only
CPU tensors (torch.distributed's backend table). There every CUDA tensor is staged: copied
to host memory, carried by gloo, copied back. The copies are recorded as communication
spans of their own ("... · to host", "... · to GPU", 0 bytes, so bytes are not counted
twice): they are part of moving the message, and come before the matched span so that a
rank's own copy is never mistaken for waiting on its peers.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .. import core_waits
from ..trace import COMM, WAIT, recorder, span
from . import runtime
from .groups import axis_of, pg_of

__all__ = ["all_gather", "all_reduce", "all_reduce_async", "all_to_all", "barrier", "broadcast",
           "exchange_counts", "get_rank",
           "get_world_size", "isend", "recv", "recv_any", "reduce_scatter", "send", "wait_all"]

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT}


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _reduce_op(op: str):
    if op == "avg":
        return dist.ReduceOp.SUM  # gloo has no AVG: sum, then divide (below)
    try:
        return _OPS[op]
    except KeyError:
        raise ValueError(f"op must be one of {sorted(_OPS) + ['avg']}, got {op!r}") from None


_RANKS: dict[int, tuple[int, ...]] = {}     # id(process group) -> its global ranks
_COUNT: dict[tuple, int] = {}               # operations so far, per group or per message route


def _ranks(pg) -> tuple[int, ...]:
    if pg is None:
        return tuple(range(dist.get_world_size()))
    if id(pg) not in _RANKS:
        _RANKS[id(pg)] = tuple(dist.get_process_group_ranks(pg))
    return _RANKS[id(pg)]


def _next(counter: tuple) -> int:
    _COUNT[counter] = _COUNT.get(counter, -1) + 1
    return _COUNT[counter]


def collective_key(group, op: str) -> tuple:
    """(op, ("c", ranks, k)): the k-th collective this rank issues on ``group``, an ``op``
    ("all_reduce", "all_gather", ...: what the replay prices it as)."""
    ranks = _ranks(pg_of(group))
    return (op, ("c", ranks, _next(("c", ranks))))


def message_key(role: str, src: int, dst: int, group, tag: int = 0) -> tuple:
    """(role, ("p", ranks, src, dst, tag, k)): the k-th message from src to dst."""
    route = ("p", _ranks(pg_of(group)), src, dst, tag)
    return (role, (*route, _next(route)))


def _traced(name: str, tensor_bytes: int, group, peer: int | None = None, kind: str = COMM,
            key: tuple | None = None):
    """The span around one operation: its size, peer, group's mesh axis and match key."""
    return span(name, kind, tensor_bytes, peer=peer, axis=axis_of(pg_of(group)), key=key)


# ----------------------------------------------------------------- host staging
def _staged(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` must travel through host memory (see the module's notes)."""
    how = runtime.host_staging()
    return how == "all" or (how == "cuda" and tensor.device.type != "cpu")


def _to_host(tensor: torch.Tensor, name: str) -> torch.Tensor:
    with span(f"{name} · to host", COMM, 0):
        # copy=True: a fresh buffer even when the tensor is on the CPU already (the path
        # the tests force); .to() from CUDA waits for the copy, so the span holds it.
        return tensor.detach().to("cpu", copy=True).contiguous()   # gloo wants dense buffers


def _back(name: str, tensor: torch.Tensor) -> str:
    return f"{name} · to GPU" if tensor.device.type != "cpu" else f"{name} · back"


def _to_device(tensor: torch.Tensor, host: torch.Tensor, name: str) -> None:
    with span(_back(name, tensor), COMM, 0):
        tensor.copy_(host)


class _StagedWork:
    """A pending operation on a host copy: keeps the copy alive until it is waited for."""

    def __init__(self, work, host):
        self.work, self.host = work, host

    def wait(self, *args):
        return self.work.wait(*args)

    def __getattr__(self, name):
        return getattr(self.work, name)


def get_rank(group=None) -> int:
    """This rank's position in ``group`` (its global rank for the default group)."""
    return dist.get_rank(pg_of(group))


def get_world_size(group=None) -> int:
    """The number of ranks in ``group``."""
    return dist.get_world_size(pg_of(group))


def send(tensor: torch.Tensor, dst: int, *, group=None, tag: int = 0, name: str = "send") -> None:
    key = message_key("send", dist.get_rank(), dst, group, tag)
    wire = _to_host(tensor, name) if _staged(tensor) else tensor
    with _traced(name, nbytes(tensor), group, peer=dst, key=key):
        dist.send(wire, dst, group=pg_of(group), tag=tag)


def isend(tensor: torch.Tensor, dst: int, *, group=None, tag: int = 0, name: str = "isend"):
    """Start sending ``tensor`` and return at once; finish with ``wait_all``.

    The span covers only posting the message: the transfer goes on in the background
    (and shows on the receiver's side). Keep ``tensor`` unchanged until it is waited for.
    Pipelines need this: two neighbours each blocking in a send to the other deadlock.
    """
    key = message_key("isend", dist.get_rank(), dst, group, tag)
    if _staged(tensor):
        host = _to_host(tensor, name)
        with _traced(name, nbytes(tensor), group, peer=dst, key=key):
            return _StagedWork(dist.isend(host, dst, group=pg_of(group), tag=tag), host)
    with _traced(name, nbytes(tensor), group, peer=dst, key=key):
        return dist.isend(tensor, dst, group=pg_of(group), tag=tag)


def wait_all(works) -> None:
    """Wait for pending ``isend`` operations, recorded as one wait span.

    The data left when the sends were posted; what remains is waiting for the receivers
    to take them (a stage that runs ahead of its neighbour waits here at the end).
    """
    if works:
        with span("wait sends", WAIT, 0):
            for work in works:
                work.wait()


def recv(tensor: torch.Tensor, src: int, *, group=None, tag: int = 0,
         name: str = "recv", kind: str = COMM) -> torch.Tensor:
    """Receive into ``tensor`` from rank ``src``.

    The span covers waiting for the sender and the transfer; the timeline splits it at
    the moment the matching send started. kind: ``WAIT`` records the whole receive as
    waiting (a header or go-ahead of a few bytes, whose arrival is the point).
    """
    key = message_key("recv", src, dist.get_rank(), group, tag)
    staged = _staged(tensor)
    wire = torch.empty_like(tensor, device="cpu") if staged else tensor
    with _traced(name, nbytes(tensor), group, peer=src, kind=kind, key=key):
        dist.recv(wire, src, group=pg_of(group), tag=tag)
    if staged:
        _to_device(tensor, wire, name)
    return tensor


def recv_any(tensor: torch.Tensor, *, group=None, tag: int = 0, name: str = "recv any",
             kind: str = COMM) -> int:
    """Receive into ``tensor`` from whichever rank sends first; return that rank.

    An asynchronous parameter server needs this: it serves pushes in arrival order,
    whoever they come from. The span (peer unknown until it ends) includes the waiting.
    The sender is returned as a global rank.
    """
    rec = recorder()
    staged = _staged(tensor)
    wire = torch.empty_like(tensor, device="cpu") if staged else tensor
    counted = rec.enabled and rec.core_waits
    if counted:      # counters and clock agreeing at each edge (see core_waits.at_edge)
        before, start = core_waits.at_edge(time.perf_counter, core_waits.read_counters)
    else:
        before, start = None, time.perf_counter()
    sender = dist.recv(wire, None, group=pg_of(group), tag=tag)
    if before is not None:
        after, end = core_waits.at_edge(time.perf_counter,        # the threads read before
                                        lambda: core_waits.read_counters(relist=False))
    else:
        after, end = None, time.perf_counter()
    key = message_key("recv_any", sender, dist.get_rank(), group, tag)   # the replay re-serves it
    if rec.enabled:
        rec.add(name, kind, start, end, nbytes(tensor), peer=sender,
                axis=axis_of(pg_of(group)), key=key,
                core_wait_s=after[2] - before[2] if after else 0.0,
                clock=(*before[:2], *after[:2]) if after else None)
    if staged:
        _to_device(tensor, wire, name)
    return sender


def all_reduce(tensor: torch.Tensor, op: str = "sum", *, group=None,
               name: str = "all_reduce") -> torch.Tensor:
    """Reduce ``tensor`` over the group's ranks in place (op: sum, avg, max, min, product)."""
    key = collective_key(group, "all_reduce")
    wire = _to_host(tensor, name) if _staged(tensor) else tensor
    with _traced(name, nbytes(tensor), group, key=key):
        dist.all_reduce(wire, op=_reduce_op(op), group=pg_of(group))
    if wire is not tensor:
        _to_device(tensor, wire, name)
    if op == "avg":
        tensor /= get_world_size(group)
    return tensor


def all_reduce_async(tensor: torch.Tensor, *, lane: int | None = None, group=None,
                     name: str = "all_reduce (background)") -> torch.futures.Future:
    """Start a sum all-reduce and return a future; the caller's thread goes on.

    The span runs from the start to the completion of the operation and is recorded by
    the future's callback, on ``lane`` (a lane of its own shows it overlapping the work
    the rank does meanwhile). Host-clock times: exact on CPU; on a GPU the callback fires
    once the collective's work has completed.
    """
    rec, start, size = recorder(), time.perf_counter(), nbytes(tensor)
    axis, key = axis_of(pg_of(group)), collective_key(group, "all_reduce")
    # Staged (ranks sharing a GPU): the copy to host is part of this span, the copy back
    # happens when the reduced host buffer arrives, before the future completes.
    wire = tensor.detach().to("cpu", copy=True).contiguous() if _staged(tensor) else tensor
    work = dist.all_reduce(wire, async_op=True, group=pg_of(group))

    def record(fut):
        value = fut.value()
        if wire is not tensor:
            tensor.copy_(wire)
            value = [tensor]
        if rec.enabled:
            rec.add(name, COMM, start, time.perf_counter(), size, lane=lane, axis=axis, key=key)
        return value

    return work.get_future().then(record)


def all_gather(tensor: torch.Tensor, *, group=None, name: str = "all_gather") -> list[torch.Tensor]:
    """Every group member's ``tensor``, in group order, on every member."""
    key = collective_key(group, "all_gather")
    if _staged(tensor):
        host = _to_host(tensor.contiguous(), name)
        wires = [torch.empty_like(host) for _ in range(get_world_size(group))]
        with _traced(name, nbytes(tensor), group, key=key):
            dist.all_gather(wires, host, group=pg_of(group))
        out = [torch.empty_like(tensor) for _ in wires]
        with span(_back(name, tensor), COMM, 0):
            for o, w in zip(out, wires):
                o.copy_(w)
        return out
    out = [torch.empty_like(tensor) for _ in range(get_world_size(group))]
    with _traced(name, nbytes(tensor), group, key=key):
        dist.all_gather(out, tensor.contiguous(), group=pg_of(group))
    return out


def reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, group=None,
                   name: str = "reduce_scatter") -> torch.Tensor:
    """Reduce ``tensor`` over the group and keep this member's slice along dim 0.

    Member i receives chunk i of the reduced tensor; dim 0 must divide by the group size.
    """
    world_size = get_world_size(group)
    if tensor.shape[0] % world_size:
        raise ValueError(
            f"reduce_scatter splits dim 0 into {world_size} equal chunks, but it has "
            f"{tensor.shape[0]} rows: pad it to a multiple of {world_size}.")
    key = collective_key(group, "reduce_scatter")
    staged = _staged(tensor)
    source = _to_host(tensor, name) if staged else tensor
    chunks = [c.contiguous() for c in source.chunk(world_size)]
    wire = torch.empty_like(chunks[0])
    with _traced(name, nbytes(tensor), group, key=key):
        dist.reduce_scatter(wire, chunks, op=_reduce_op(op), group=pg_of(group))
    out = wire
    if staged:
        out = torch.empty(wire.shape, dtype=tensor.dtype, device=tensor.device)
        _to_device(out, wire, name)
    if op == "avg":
        out /= world_size
    return out


def all_to_all(tensor: torch.Tensor, send_counts=None, recv_counts=None, *, group=None,
               name: str = "all_to_all") -> tuple[torch.Tensor, list[int]]:
    """Send rows of ``tensor`` (dim 0) to every member and receive theirs: the first
    ``send_counts[0]`` rows go to member 0, the next ``send_counts[1]`` to member 1, and
    so on. Returns the rows received, in member order, and how many came from each.

    Without counts the rows split evenly. A receiver must know how many rows to expect
    before the data comes: given ``send_counts`` alone, the counts go first
    (``exchange_counts``); give ``recv_counts`` too where they are known already (the
    way back of an exchange).
    """
    n = get_world_size(group)
    rows = tensor.shape[0]
    if send_counts is None:
        if recv_counts is not None:
            raise ValueError("all_to_all: recv_counts needs send_counts")
        if rows % n:
            raise ValueError(f"all_to_all splits dim 0 evenly over {n} members, but it has "
                             f"{rows} rows: pass send_counts, or pad to a multiple of {n}")
        send_counts = recv_counts = [rows // n] * n
    else:
        send_counts = [int(c) for c in send_counts]
        if len(send_counts) != n or sum(send_counts) != rows or min(send_counts) < 0:
            raise ValueError(f"all_to_all: send_counts must give {n} counts, none negative, "
                             f"adding up to the tensor's {rows} rows; got {send_counts}")
        if recv_counts is None:
            recv_counts = exchange_counts(send_counts, group=group, name=f"{name} (counts)")
        elif len(recv_counts) != n or min(recv_counts) < 0:
            raise ValueError(f"all_to_all: recv_counts must give {n} counts, none negative; "
                             f"got {list(recv_counts)}")
    staged = _staged(tensor)
    wire = _to_host(tensor, name) if staged else tensor.contiguous()
    out = torch.empty((sum(recv_counts), *tensor.shape[1:]), dtype=tensor.dtype,
                      device=wire.device)
    key = collective_key(group, "all_to_all")
    with _traced(name, nbytes(tensor), group, key=key):
        dist.all_to_all_single(out, wire, list(recv_counts), send_counts, group=pg_of(group))
    if staged:
        back = torch.empty(out.shape, dtype=tensor.dtype, device=tensor.device)
        _to_device(back, out, name)
        out = back
    return out, list(recv_counts)


def exchange_counts(send_counts, *, group=None, name: str = "all_to_all (counts)") -> list[int]:
    """How many rows each member will send this one, from how many this one sends each:
    an all-to-all of one number per member."""
    device = "cpu" if runtime.host_staging() in ("all", "cuda") else runtime.rank_device()
    counts = torch.tensor([int(c) for c in send_counts], dtype=torch.int64, device=device)
    got = torch.empty_like(counts)
    key = collective_key(group, "all_to_all")
    with _traced(name, nbytes(counts), group, key=key):
        dist.all_to_all_single(got, counts, group=pg_of(group))
    return got.tolist()


def broadcast(tensor: torch.Tensor, src: int, *, group=None,
              name: str = "broadcast") -> torch.Tensor:
    """Copy ``tensor`` from global rank ``src`` to every member of the group, in place."""
    key = collective_key(group, "broadcast")
    wire = _to_host(tensor, name) if _staged(tensor) else tensor
    with _traced(name, nbytes(tensor), group, peer=src, key=key):
        dist.broadcast(wire, src, group=pg_of(group))
    if wire is not tensor:
        _to_device(tensor, wire, name)
    return tensor


def barrier(*, group=None, name: str = "barrier") -> None:
    """Wait until every member arrives; recorded as a communication span of 0 bytes."""
    with _traced(name, 0, group, key=collective_key(group, "barrier")):
        dist.barrier(group=pg_of(group))
