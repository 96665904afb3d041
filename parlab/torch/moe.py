"""A mixture of experts and expert parallelism, by hand on the course's traced all-to-all.

A mixture-of-experts layer (Shazeer et al. 2017) holds E expert MLPs and a router. For
each token the router gives a probability per expert; the token goes to its top k
experts, and their outputs are added, weighted by the router's probabilities renormalised
over those k (for k = 1 the probability itself, as Switch does, so that the task's loss
still trains the router). Every token pays for k experts, whatever E is: parameters grow
with E, compute only by the router's E outputs.

* **Capacity** (GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021): an expert
  takes at most C = ceil(capacity_factor · tokens · k / E) assignments per batch, first
  choices before second ones; the rest are dropped (the token's output lacks that
  expert's share). ``capacity_factor=None``: no limit. Here the batch is one group; the
  papers count capacity per group of tokens on a device.
* **Load balancing** (Switch, eq. 4): the auxiliary loss E · sum_e f_e · P_e, with f_e
  the share of assignments expert e got (Switch counts first choices; here every one of
  the k) and P_e its mean router probability. It is 1 when the assignments spread
  evenly, and grows as assignments and probability pile onto the same experts.

**Expert parallelism** puts E / n experts on each of n ranks; everything else is
replicated, and each rank takes its own tokens, as in data parallel. A rank sends each
assignment's token to the rank holding the expert (an all-to-all, with uneven counts:
the counts go first), the experts compute what they received, and a second all-to-all
brings the outputs back (its backward is the reverse all-to-all). The replicated
weights' gradients are summed over the ranks once per step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..trace import span
from . import comm, runtime, training
from .groups import as_group
from .tensor_parallel import _split_size, reduce_from_parallel


@dataclass(frozen=True)
class MoEConfig:
    d_in: int = 64            # the digits' 8 x 8 pixels
    d_model: int = 128
    d_ff: int = 256
    experts: int = 8
    top_k: int = 2
    classes: int = 10
    capacity_factor: float | None = None
    aux_weight: float = 0.01

    def __post_init__(self):
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k must be between 1 and experts ({self.experts}), "
                             f"got {self.top_k}")


class Expert(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def kept_assignments(experts_of, experts: int, capacity: int | None):
    """Which (token, choice) assignments an expert takes, at most ``capacity`` each:
    every token's first choice before any second one, then in token order."""
    if capacity is None:
        return torch.ones_like(experts_of, dtype=torch.bool)
    order = experts_of.t().reshape(-1)                      # choice-major
    onehot = F.one_hot(order, experts)
    place = (onehot.cumsum(0) * onehot).sum(-1) - 1         # position in its expert's queue
    return (place < capacity).reshape(experts_of.shape[1], -1).t()


def balance_loss(probs, experts_of, experts: int, *, group=None, counts=None, tokens=None):
    """Switch's auxiliary loss E · sum_e f_e P_e. Where the batch is spread over the ranks
    of ``group``: ``counts`` and ``tokens``, the group's assignment counts and token count
    (``experts_of`` then unused), and the probabilities' sum all-reduced over the group,
    each rank's gradient its own tokens'."""
    if counts is None:
        counts = torch.bincount(experts_of.reshape(-1), minlength=experts).to(probs.dtype)
        tokens = probs.shape[0]
        prob_sum = probs.sum(0)
    else:
        if tokens is None:
            raise ValueError("balance_loss: give tokens (the group's count) with counts")
        prob_sum = reduce_from_parallel(probs.sum(0), group)
    share = counts / counts.sum()
    return experts * (share * prob_sum / tokens).sum()


def route(router: nn.Linear, x, top_k: int):
    """(probabilities (tokens, E), weights (tokens, k), experts (tokens, k)): each token's
    top k experts, weighted by their probabilities renormalised over the k (k = 1: the
    probability itself)."""
    probs = router(x).softmax(-1)
    top, experts_of = probs.topk(top_k, dim=-1)
    weights = top if top_k == 1 else top / top.sum(-1, keepdim=True)
    return probs, weights, experts_of


class MoE(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.d_model, cfg.experts, bias=False)
        self.experts = nn.ModuleList(Expert(cfg.d_model, cfg.d_ff) for _ in range(cfg.experts))

    def capacity(self, tokens: int) -> int | None:
        cf, c = self.cfg.capacity_factor, self.cfg
        return None if cf is None else math.ceil(cf * tokens * c.top_k / c.experts)

    def forward(self, x):
        """(output, auxiliary loss, assignments kept per expert)."""
        probs, weights, experts_of = route(self.router, x, self.cfg.top_k)
        kept = kept_assignments(experts_of, self.cfg.experts, self.capacity(x.shape[0]))
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, choice = ((experts_of == e) & kept).nonzero(as_tuple=True)
            if len(token):
                out = out.index_add(0, token, expert(x[token]) * weights[token, choice, None])
        per_expert = torch.bincount(experts_of[kept], minlength=self.cfg.experts)
        return out, balance_loss(probs, experts_of, self.cfg.experts), per_expert


class Classifier(nn.Module):
    """The digits through a layer in, a residual mixture of experts, a layer out."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.inp, self.moe = nn.Linear(cfg.d_in, cfg.d_model), MoE(cfg)
        self.out = nn.Linear(cfg.d_model, cfg.classes)

    def forward(self, x):
        h = F.relu(self.inp(x))
        mixed, aux, per_expert = self.moe(h)
        return self.out(h + mixed), aux, per_expert


def build(cfg: MoEConfig, seed: int = 0) -> Classifier:
    torch.manual_seed(seed)
    return Classifier(cfg)


def train_reference(cfg: MoEConfig = MoEConfig(), batch_size: int = 64, steps: int = 3,
                    lr: float = 0.1, seed: int = 0) -> dict:
    """The whole model on one device, plain SGD on the digits: losses, first gradients,
    final weights, and the assignments each expert took per step."""
    model = build(cfg, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    batches = training.digit_batches("mlp", batch_size)
    out = {"losses": [], "per_expert": []}
    for step in range(steps):
        x, y = training.on_device(*next(batches), "cpu")
        opt.zero_grad()
        logits, aux, per_expert = model(x)
        loss = F.cross_entropy(logits, y) + cfg.aux_weight * aux
        loss.backward()
        if step == 0:
            out["first_grads"] = training.grads_numpy(model)
        opt.step()
        out["losses"].append(loss.item())
        out["per_expert"].append(per_expert.tolist())
    out["weights"] = training.state_numpy(model)
    return out


# ------------------------------------------------------------------ expert parallelism
class _AllToAll(torch.autograd.Function):
    """Rows to the members by ``send`` counts, ``recv`` coming back; backward, the
    gradients go back the way they came (the reverse all-to-all)."""

    @staticmethod
    def forward(ctx, x, send, recv, group, name):
        ctx.counts, ctx.group, ctx.name = (send, recv), group, name
        return comm.all_to_all(x, send, recv, group=group, name=name)[0]

    @staticmethod
    def backward(ctx, grad):
        send, recv = ctx.counts
        back, _ = comm.all_to_all(grad.contiguous(), recv, send, group=ctx.group,
                                  name=f"{ctx.name} (backward)")
        return back, None, None, None, None


def expert_span(e: int) -> str:
    return f"expert {e}"


class ExpertParallelMoE(nn.Module):
    """This rank's E / n experts of a dense ``MoE`` and a copy of its router.

    balance_group: the ranks whose tokens make up the batch the balance loss and the
    returned counts are over; by default ``group``. Data parallel across expert-parallel
    groups passes every rank, so that the loss is the whole batch's, as on one device."""

    def __init__(self, dense: MoE, group=None, balance_group=None):
        super().__init__()
        g = self.group = as_group(group)
        self.balance_group = g if balance_group is None else as_group(balance_group)
        self.cfg = dense.cfg
        if dense.cfg.capacity_factor is not None:
            raise ValueError("expert parallelism here applies no capacity: set "
                             "MoEConfig(capacity_factor=None)")
        self.local = _split_size(dense.cfg.experts, g.size, "the experts")
        self.first = g.index * self.local
        self.router = dense.router
        self.experts = nn.ModuleList(dense.experts[self.first:self.first + self.local])

    def forward(self, x):
        """Every assignment sent to its expert's rank, computed there, sent back: (output,
        auxiliary loss, the assignments each expert took from the whole group's batch)."""
        g, cfg = self.group, self.cfg
        probs, weights, experts_of = route(self.router, x, cfg.top_k)
        flat = experts_of.reshape(-1)                        # token-major: (token, choice)
        order = torch.argsort(flat, stable=True)             # by expert, so by rank
        token = order // cfg.top_k
        per_expert = torch.bincount(flat, minlength=cfg.experts)
        send = per_expert.view(g.size, self.local).sum(1).tolist()
        recv = comm.exchange_counts(send, group=g)
        rows = _AllToAll.apply(x[token], send, recv, g, "all_to_all (dispatch)")
        ids, _ = comm.all_to_all(flat[order], send, recv, group=g, name="all_to_all (experts)")
        # in the graph even if this rank's experts got nothing: the combine's backward
        # all-to-all must run on every rank, or the others wait for it forever
        done = rows * 0.0
        for i, expert in enumerate(self.experts):
            mine = (ids == self.first + i).nonzero(as_tuple=True)[0]
            if len(mine):
                with span(expert_span(self.first + i)):     # a hot expert shows as a long one
                    done = done.index_add(0, mine, expert(rows[mine]))
        back = _AllToAll.apply(done, recv, send, g, "all_to_all (combine)")
        out = torch.zeros_like(x).index_add(0, token, back * weights.reshape(-1)[order, None])
        b = self.balance_group
        counts = comm.all_reduce(per_expert, group=b, name="all_reduce (counts)")
        tokens = x.shape[0] * b.size
        aux = balance_loss(probs, experts_of, cfg.experts, group=b,
                           counts=counts.to(probs.dtype), tokens=tokens)
        return out, aux, counts


def expert_parallel_model(cfg: MoEConfig, seed: int, group=None, *,
                          balance_group=None, start=None) -> Classifier:
    """The classifier with its experts split over ``group``; ``start``: weights (numpy, by
    name; any subset, e.g. a trained router) to load before the split."""
    model = build(cfg, seed)
    if start:
        model.load_state_dict({k: torch.as_tensor(v) for k, v in start.items()}, strict=False)
    model.moe = ExpertParallelMoE(model.moe, group, balance_group)
    return model


def replicated_parameters(model: Classifier) -> list:
    return [p for n, p in model.named_parameters() if not n.startswith("moe.experts.")]


def train_ep(rank: int, world_size: int, cfg: MoEConfig = MoEConfig(), batch_size: int = 64,
             steps: int = 3, lr: float = 0.1, seed: int = 0, *, group=None,
             start=None) -> dict:
    """Rank function: the same training as ``train_reference``, each rank on its rows of
    every batch and holding its experts. Returns the losses (of the whole batch), the
    first gradients and final weights (this rank's experts named as in the dense model),
    the assignments each expert took per step. ``start``: weights to begin from
    (``expert_parallel_model``)."""
    g, device = as_group(group), runtime.rank_device()
    model = expert_parallel_model(cfg, seed, g, start=start).to(device)
    sync = lambda m: training.all_reduce_gradients(replicated_parameters(m), g)  # noqa: E731
    return train_steps(model, cfg, batch_size, steps, lr, g.rows(batch_size), sync, g)


def train_steps(model: Classifier, cfg: MoEConfig, batch_size: int, steps: int, lr: float,
                rows, sync_gradients, loss_group, out: dict | None = None) -> dict:
    """The training loop of an expert-parallel classifier: SGD on ``rows`` of every batch
    of the digits; ``sync_gradients(model)`` sums what the ranks share, after each
    backward pass; the loss is summed over ``loss_group``. Adds to ``out`` the losses (of
    the whole batch) and the assignments each expert took per step, the first gradients
    and the final weights (named as in the dense model)."""
    device = next(model.parameters()).device
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    batches = training.digit_batches("mlp", batch_size)
    out = {} if out is None else out
    out.update(losses=[], per_expert=[])
    for step in range(steps):
        x, y = training.on_device(*next(batches), device, rows)
        with span("forward"):
            opt.zero_grad()
            logits, aux, per_expert = model(x)
            ce = F.cross_entropy(logits, y, reduction="sum") / batch_size
            # every rank holds the whole aux loss, but its gradient reaches only this
            # rank's tokens: summed over the ranks, it is the whole gradient
            loss = ce + cfg.aux_weight * aux
        with span("backward"):
            loss.backward()
            sync_gradients(model)
        if step == 0:
            out["first_grads"] = dense_names(training.grads_numpy(model), model.moe)
        with span("update"):
            opt.step()
        total = comm.all_reduce(ce.detach().reshape(1).clone(), group=loss_group,
                                name="all_reduce (loss)")
        out["losses"].append(total.item() + cfg.aux_weight * aux.item())
        out["per_expert"].append(per_expert.tolist())
    out["weights"] = dense_names(training.state_numpy(model), model.moe)
    return out


def dense_names(values: dict, moe: ExpertParallelMoE) -> dict:
    """moe.experts.i.* of this rank is moe.experts.(first + i).* of the dense model."""
    out = {}
    for name, v in values.items():
        if name.startswith("moe.experts."):
            i, rest = name[len("moe.experts."):].split(".", 1)
            name = f"moe.experts.{moe.first + int(i)}.{rest}"
        out[name] = v
    return out


def expected_all_to_all_bytes(cfg: MoEConfig, tokens_here: int, per_expert, rank: int,
                              world_size: int) -> int:
    """Bytes a rank hands to all-to-alls in one step, from the step's routing
    (``per_expert``: the assignments each expert took over every rank), as ``comm``
    counts them (each call by its input): the counts (one int64 per rank); the dispatch
    of this rank's tokens · k rows of d_model floats, with their experts' ids (int64);
    the combine of the rows its experts received; backward, the same two again, the
    other way round."""
    local = cfg.experts // world_size
    sent = tokens_here * cfg.top_k
    received = sum(per_expert[rank * local:(rank + 1) * local])
    row = cfg.d_model * 4
    return 8 * world_size + sent * (row + 8) + received * row + received * row + sent * row
