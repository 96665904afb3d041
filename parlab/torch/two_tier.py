"""Two nodes and a slow link: data parallelism when some links are much slower than others.

The ranks sit on nodes of ``node_size`` consecutive ranks (``parlab.nodes``): fast links
inside a node, a slow one between nodes. Three ways to keep the replicas in step, each
on the rows of the global batch data parallelism gives it (lab 05):

* ``flat``: every step, one all-reduce of the gradients over all ranks, blind to nodes;
* ``hierarchical``: every step, the same average in three phases: reduce-scatter inside
  the node, all-reduce of this rank's chunk across the nodes (with the ranks of the same
  local index), all-gather inside. Only 1/node_size of the gradient per rank crosses.
  Both equal one device on the whole batch;
* ``local_sgd``: DiLoCo (Douillard et al., 2023, arXiv 2311.08105). Inside a node the
  ranks stay synchronous data parallel every step; only every H steps do the nodes meet:
  the pseudo-gradient Δ = θ_start − θ_now, averaged across nodes, drives an outer SGD
  step with Nesterov momentum from θ_start (the paper's outer lr 0.7, momentum 0.9). The
  slow link carries H times fewer bytes; the nodes drift apart in between, so this one
  only approximates one device.

Each phase is a traced collective whose span names its group's axis, "inside" or
"across" (``node_groups``), so ``timeline.bytes_by_axis`` tells the slow link's bytes
from the fast ones'. gloo runs ``reduce_scatter`` on CPU tensors in this torch (2.13),
on sub-groups too, so the three phases are the library's own collectives.
"""
from __future__ import annotations

import hashlib
import math

import torch
import torch.distributed as dist
from torch import nn

from .. import data as datasets
from .. import nodes as node_math
from ..errors import whole_number
from ..split import share
from ..trace import span
from . import comm, runtime, training
from .groups import Group, as_group, name_group

__all__ = ["HOWS", "INNER", "check_two_tier", "dataset_loss", "hierarchical_all_reduce",
           "node_groups", "train_two_tier"]

HOWS = node_math.HOWS
INNER = ("sgd", "momentum", "adamw")


# ------------------------------------------------------------------ groups
def node_groups(world_size: int, node_size: int) -> tuple[Group, Group]:
    """(inside, across): this rank's node, and the ranks of its local index on every node.

    Collective: every rank builds every group, the nodes first and then the lines across,
    each in the order of its smallest rank, so no rank waits for a group another never
    makes (as ``mesh.init_mesh`` does). The groups are named "inside" and "across", so
    the spans of their collectives carry that axis.
    """
    if not dist.is_initialized():
        raise RuntimeError("node_groups needs a process group: call it inside a rank started "
                           "by parlab.launch or torchrun")
    if dist.get_world_size() != world_size:
        raise ValueError(f"node_groups: world_size={world_size}, but "
                         f"{dist.get_world_size()} ranks were launched")
    rank, found = dist.get_rank(), {}
    for axis, lines in (("inside", node_math.nodes(world_size, node_size)),
                        ("across", node_math.across_lines(world_size, node_size))):
        for line in lines:
            pg = dist.new_group(list(line))     # collective: every rank, every line, same order
            if rank in line:
                name_group(pg, axis)
                found[axis] = Group(pg, line, line.index(rank), axis)
    return found["inside"], found["across"]


# ------------------------------------------------------------------ the hierarchical all-reduce
def hierarchical_all_reduce(flat: torch.Tensor, inside: Group, across: Group, op: str = "sum",
                            *, same_inside: bool = False) -> torch.Tensor:
    """Reduce the 1-D tensor ``flat`` over every rank of both tiers, in place.

    Reduce-scatter inside the node (``flat`` zero-padded to a multiple of the node's
    size; this rank keeps chunk ``inside.index``), all-reduce of that chunk across the
    nodes, all-gather of the chunks inside. Each rank sends 1/node_size of the tensor
    over the slow link instead of the whole (``parlab.nodes.hierarchical_bytes``).
    A group of one rank moves nothing, and is skipped.

    op: "sum" or "avg". same_inside: the node's ranks hold the same tensor already
    (DiLoCo's pseudo-gradient after synchronous inner steps), so the reduce-scatter is
    left out: each rank takes its own chunk, and the result reduces over the nodes only.
    """
    if op not in ("sum", "avg"):
        raise ValueError(f"op must be 'sum' or 'avg', got {op!r}")
    if flat.dim() != 1 or not flat.is_contiguous():
        raise ValueError("hierarchical_all_reduce works in place on a contiguous 1-D tensor")
    k, numel = inside.size, flat.numel()
    chunk = math.ceil(numel / k)
    if k == 1:
        mine = flat
    else:
        padded = flat.new_zeros(chunk * k)
        padded[:numel] = flat
        if same_inside:
            mine = padded[inside.index * chunk:(inside.index + 1) * chunk].clone()
        else:
            mine = comm.reduce_scatter(padded, group=inside, name="reduce_scatter (inside)")
    if across.size > 1:
        comm.all_reduce(mine, group=across, name="all_reduce (across)")
    if k > 1:
        parts = comm.all_gather(mine, group=inside, name="all_gather (inside)")
        flat.copy_(torch.cat(parts)[:numel])
    if op == "avg":
        flat /= across.size if same_inside else across.size * k
    return flat


def _average_inside(net: nn.Module, inside: Group) -> None:
    if inside.size > 1:     # a node of one rank has nothing to average
        training.all_reduce_gradients(net, group=inside, op="avg",
                                      name="all_reduce (inside)")


# ------------------------------------------------------------------ DiLoCo's outer step
class OuterNesterov:
    """The outer optimizer of DiLoCo: SGD with Nesterov momentum on the pseudo-gradient.

    As ``torch.optim.SGD(nesterov=True)`` (Sutskever et al., 2013): v ← μ·v + Δ, then
    θ_start ← θ_start − lr·(Δ + μ·v). With lr = 1 and μ = 0 the new start is the
    average of the nodes' models: plain parameter averaging (local SGD).
    """

    def __init__(self, start: torch.Tensor, lr: float, momentum: float):
        self.start, self.lr, self.momentum = start, lr, momentum
        self.velocity = torch.zeros_like(start)

    def step(self, delta: torch.Tensor) -> torch.Tensor:
        self.velocity.mul_(self.momentum).add_(delta)
        self.start -= self.lr * (delta + self.momentum * self.velocity)
        return self.start


def outer_step(net: nn.Module, outer: OuterNesterov, inside: Group, across: Group) -> None:
    """Average the pseudo-gradient across nodes and move every replica to the new start.

    The node's ranks hold the same model (synchronous inside), so each sends only its
    own chunk across (``same_inside``): the bytes of a hierarchical all-reduce, once
    every H steps."""
    delta = outer.start - training.flat_parameters(net)
    hierarchical_all_reduce(delta, inside, across, op="avg", same_inside=True)
    with span("outer update"):
        # a copy: load_flat makes the parameters views of the vector it is given, and the
        # inner steps must not move the start they are measured from
        training.load_flat(net, outer.step(delta).clone())


# ------------------------------------------------------------------ training
def check_two_tier(world_size: int, how: str = "flat", node_size: int = 2, H: int = 16,
                   global_batch: int = 64, inner: str = "sgd") -> None:
    """A clear ValueError for settings that cannot run, before any rank starts."""
    if how not in HOWS:
        raise ValueError(f"how must be one of {HOWS}, got {how!r}")
    if inner not in INNER:
        raise ValueError(f"inner must be one of {INNER}, got {inner!r}")
    node_math.node_count(world_size, node_size)
    if whole_number(H) is None or H < 1:
        raise ValueError(f"H (steps between two averagings across nodes) must be a whole "
                         f"number >= 1, got {H!r}")
    share(global_batch, world_size, f"{world_size} ranks")


def inner_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    """Plain SGD, SGD with Nesterov momentum 0.9 ("momentum"), or AdamW with torch's
    defaults (DiLoCo's inner optimizer)."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True)
    return torch.optim.SGD(params, lr=lr)


def _digest(net: nn.Module) -> str:
    """A fingerprint of every parameter bit: two replicas agree exactly iff these do."""
    return hashlib.sha1(training.to_numpy(training.flat_parameters(net)).tobytes()).hexdigest()


def train_two_tier(rank: int, world_size: int, how: str = "flat", node_size: int = 2,
                   H: int = 16, steps: int = 8, global_batch: int = 64, lr: float = 0.1,
                   sizes=None, model: str = "mlp", seed: int = 0, outer_lr: float = 0.7,
                   outer_momentum: float = 0.9, inner: str = "sgd") -> dict:
    """Rank function: train a replica on nodes of ``node_size`` ranks, ``how`` keeping
    the replicas in step ("flat", "hierarchical" or "local_sgd": see the module).

    Rank r takes rows r·b:(r + 1)·b of each global batch (b = global_batch / world_size),
    as data parallelism does. local_sgd: the nodes average every H steps (a last period
    shorter than H is not averaged); outer_lr, outer_momentum: the outer Nesterov step;
    inner: "sgd" or "adamw", each rank's optimizer (every method's; its state stays with
    the rank across outer steps, as in DiLoCo).

    Returns "losses" (this rank's minibatch loss each step), "state" (numpy),
    "digests" (a fingerprint of the parameters after each step), "outer_steps" (the
    steps after which the nodes averaged) and "samples_seen" (rows of every rank).
    """
    check_two_tier(world_size, how, node_size, H, global_batch, inner)
    inside, across = node_groups(world_size, node_size)
    rows = as_group(None).rows(global_batch, "global batch")
    device = runtime.rank_device()
    net = training.build_model(model, sizes=sizes, seed=seed).to(device)  # same everywhere
    opt = inner_optimizer(inner, net.parameters(), lr)
    outer = (OuterNesterov(training.flat_parameters(net), outer_lr, outer_momentum)
             if how == "local_sgd" else None)
    loss_fn = nn.CrossEntropyLoss()
    batches = training.digit_batches(model, global_batch)
    out = {"losses": [], "digests": [], "outer_steps": []}
    for step in range(steps):
        x, y = training.on_device(*next(batches), device, rows)
        opt.zero_grad()
        with span("forward"):
            loss = loss_fn(net(x), y)
        with span("backward"):
            loss.backward()
        if how == "flat":
            training.all_reduce_gradients(net, op="avg")
        elif how == "hierarchical":
            flat = training.flat_gradients(net)
            hierarchical_all_reduce(flat, inside, across, op="avg")
            training.set_flat_gradients(net, flat)
        else:
            _average_inside(net, inside)
        with span("update"):
            opt.step()
        if outer is not None and (step + 1) % H == 0:
            with span("outer step"):
                outer_step(net, outer, inside, across)
            out["outer_steps"].append(step)
        out["losses"].append(loss.item())
        out["digests"].append(_digest(net))
    out["state"] = training.state_numpy(net)
    out["samples_seen"] = steps * global_batch
    del net, opt
    return out


def dataset_loss(state: dict, model: str = "mlp", sizes=None, split: str = "train") -> float:
    """The mean cross-entropy of a saved state (``state_numpy``) on a whole split of the
    digits: the loss on the global data, to compare methods by after the same samples."""
    net = training.build_model(model, sizes=sizes)
    net.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    x, y = datasets.digits(split, flat=model == "mlp")
    with torch.no_grad():
        return nn.functional.cross_entropy(net(torch.as_tensor(x)), torch.as_tensor(y)).item()


def train_each(rank: int, world_size: int, runs) -> list:
    """Rank function: ``train_two_tier`` once per settings dict of ``runs``, one after the
    other in one launch (one torchrun start for several methods), each between two
    barriers named "part" so that a timeline can be cut into its runs."""
    out = []
    for settings in runs:
        comm.barrier(name="part")
        out.append(train_two_tier(rank, world_size, **settings))
        comm.barrier(name="part")
    return out
