"""The transformer split by tensor parallelism inside each block (Megatron-LM, Shoeybi et
al. 2019, section 3), with the vocabulary split too, written by hand on the course's
traced communication.

* **Attention**: the heads are split over the ranks. Queries, keys and values are
  column-parallel (rank k computes its heads' q, k, v from the whole input), attention
  runs on those heads alone, and the output projection is row-parallel: each rank's
  product is a partial sum, and one all-reduce (g) adds them. Backward, one all-reduce
  (f) adds the input's gradient from every rank's heads.
* **MLP**: fc1 column-parallel, GELU on the slice, fc2 row-parallel: one g forward, one
  f backward, as in lab 03.
* **The vocabulary** (Megatron's vocab-parallel embedding and cross-entropy): rank k holds
  rows k of the token embedding and of the output head. A token's embedding comes from
  the rank that holds it, the others add zeros (one all-reduce). The logits are never
  gathered: the softmax's max, its sum of exponentials and the target's logit are each
  all-reduced over the ranks as one number per position, not the vocabulary's width.

The layer norms, the position embedding and the residual stream stay whole on every
rank, each rank computing them redundantly. Per block and step that is two all-reduces
of the activations forward and two backward, whatever the number of ranks
(``expected_comm_bytes``).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..trace import span
from . import comm, runtime
from .memory import saved_tensor_counter
from .groups import as_group
from .tensor_parallel import (ColumnParallelLinear, RowParallelLinear, _split_size,
                              copy_to_parallel, reduce_from_parallel)
from .transformer import (GPT, GPTConfig, build, causal_attention, merge_heads, optimizer,
                          split_heads, token_batches)


class ParallelBlock(nn.Module):
    """This rank's heads of the attention and slice of the MLP, from a dense ``Block``."""

    def __init__(self, dense, group=None):
        super().__init__()
        g = self.group = as_group(group)
        self.heads = _split_size(dense.heads, g.size, "the attention's heads")
        self.ln1, self.ln2 = copy.deepcopy(dense.ln1), copy.deepcopy(dense.ln2)
        self.q, self.k, self.v = (ColumnParallelLinear(m, g, copy_input=False)
                                  for m in (dense.q, dense.k, dense.v))
        self.proj = RowParallelLinear(dense.proj, g)
        self.fc1, self.fc2 = ColumnParallelLinear(dense.fc1, g), RowParallelLinear(dense.fc2, g)

    def forward(self, x):
        h = copy_to_parallel(self.ln1(x), self.group)      # f: once for q, k and v
        q, k, v = (split_heads(f(h), self.heads) for f in (self.q, self.k, self.v))
        x = x + self.proj(merge_heads(causal_attention(q, k, v)))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class VocabParallelEmbedding(nn.Module):
    """Rows k of the token embedding; a token held elsewhere looks up zeros here, and the
    all-reduce (g) brings every token its row."""

    def __init__(self, dense: nn.Embedding, group=None):
        super().__init__()
        g = self.group = as_group(group)
        self.part = _split_size(dense.num_embeddings, g.size, "the vocabulary")
        self.start = g.index * self.part
        self.weight = nn.Parameter(dense.weight.detach()[self.start:self.start + self.part]
                                   .clone())

    def partial(self, idx):
        """The rows this rank holds, zeros for the tokens it does not."""
        here = (idx >= self.start) & (idx < self.start + self.part)
        rows = F.embedding((idx - self.start).clamp(0, self.part - 1), self.weight)
        return rows * here.unsqueeze(-1)

    def forward(self, idx):
        return reduce_from_parallel(self.partial(idx), self.group)


def vocab_parallel_cross_entropy(logits, targets, group=None):
    """Mean cross-entropy from this rank's slice of the logits (its vocabulary rows), the
    same number on every rank, without gathering the logits.

    loss = log sum_v exp(z_v - M) - (z_target - M), with M the largest logit: each term
    is a sum over the vocabulary, so each rank sums its own slice and an all-reduce adds
    the slices (g: its backward is the identity, as every rank holds the same loss). M
    only keeps the exponentials finite and changes no gradient: an all-reduce of the
    maximum, outside autograd.
    """
    g = as_group(group)
    part = logits.shape[-1]
    start = g.index * part
    z = logits.reshape(-1, part)
    t = targets.reshape(-1)
    with torch.no_grad():
        top = comm.all_reduce(z.max(-1).values, op="max", group=g, name="all_reduce (max)")
    shifted = z - top.unsqueeze(-1)
    total = reduce_from_parallel(shifted.exp().sum(-1), g)
    here = (t >= start) & (t < start + part)
    picked = shifted.gather(1, (t - start).clamp(0, part - 1).unsqueeze(1)).squeeze(1)
    target = reduce_from_parallel(picked * here, g)
    return (total.log() - target).mean()


class ParallelGPT(nn.Module):
    """This rank's part of a dense ``GPT``: parameters named as in the dense model."""

    block_class = ParallelBlock

    def __init__(self, dense: GPT, group=None):
        super().__init__()
        g = self.group = as_group(group)
        self.cfg = dense.cfg
        self.tokens = VocabParallelEmbedding(dense.tokens, g)
        self.positions = copy.deepcopy(dense.positions)
        self.blocks = nn.ModuleList(self.block_class(b, g) for b in dense.blocks)
        self.ln_f = copy.deepcopy(dense.ln_f)
        self.head = ColumnParallelLinear(dense.head, g)   # rows k of the vocabulary

    def forward(self, idx):
        """This rank's slice of the logits (batch, time, vocab / n)."""
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# Where each dense parameter's slice lies on rank k: by rows (column-parallel layers, the
# vocabulary), by columns (row-parallel weights), or whole.
_ROWS = ("q.weight", "q.bias", "k.weight", "k.bias", "v.weight", "v.bias", "fc1.weight",
         "fc1.bias", "head.weight", "tokens.weight")
_COLUMNS = ("proj.weight", "fc2.weight")


def dense_part(name: str, value, index: int, world_size: int):
    """The part of the dense parameter ``name`` that rank ``index`` of ``world_size``
    holds (numpy or torch)."""
    if name.endswith(_ROWS):
        n = value.shape[0] // world_size
        return value[index * n:(index + 1) * n]
    if name.endswith(_COLUMNS):
        n = value.shape[1] // world_size
        return value[:, index * n:(index + 1) * n]
    return value


def expected_comm_bytes(cfg: GPTConfig, batch_size: int) -> dict:
    """Bytes each rank hands to all-reduces per training step, from the formula.

    Forward: the embedding's g and two g per block (after the attention's projection and
    after fc2), each an activation of batch · seq_len · d_model floats; and three numbers
    per position for the loss (the max, the sum of exponentials, the target's logit).
    Backward: two f per block (the gradients at ln1's and ln2's outputs) and one at the
    head's input. The same on every rank, for any number of ranks.
    """
    f32, positions = 4, batch_size * cfg.seq_len
    activation = positions * cfg.d_model * f32
    forward = (1 + 2 * cfg.layers) * activation + 3 * positions * f32
    backward = (2 * cfg.layers + 1) * activation
    return {"forward": forward, "backward": backward, "total": forward + backward}


def train_tp(rank: int, world_size: int, cfg: GPTConfig = GPTConfig(), batch_size: int = 8,
             steps: int = 3, lr: float = 0.1, seed: int = 0, optimizer_name: str = "sgd",
             *, group=None) -> dict:
    """Rank function: train the transformer split over ``group`` (default: every rank) on
    the same batches as ``transformer.train_reference``. Returns the losses, the first
    step's logits slice, gradients and bytes saved for the backward pass, and the final
    parameters (numpy, dense names)."""
    g = as_group(group)
    model = ParallelGPT(build(cfg, seed), g).to(runtime.rank_device())
    return train_split(model, cfg, batch_size, steps, lr, seed, optimizer_name)


def train_split(model, cfg: GPTConfig, batch_size: int, steps: int, lr: float, seed: int,
                optimizer_name: str, after_backward=None) -> dict:
    """The training loop of a model whose logits are split by vocabulary (``train_tp``
    and sequence parallel's); ``after_backward(model)`` runs before the update."""
    device = next(model.parameters()).device
    opt = optimizer(optimizer_name, model.parameters(), lr)
    batches = token_batches(cfg, batch_size, seed)
    out = {"losses": []}
    for step in range(steps):
        x, y = (t.to(device) for t in next(batches))
        with span("forward"), saved_tensor_counter(model) as saved:
            opt.zero_grad()
            logits = model(x)
            loss = vocab_parallel_cross_entropy(logits, y, model.group)
        with span("backward"):
            loss.backward()
            if after_backward is not None:
                after_backward(model)
        if step == 0:
            out["saved_for_backward"] = saved.bytes
            out["first_logits"] = logits.detach().cpu().numpy().copy()
            out["first_grads"] = {n: p.grad.cpu().numpy().copy()
                                  for n, p in model.named_parameters()}
        with span("update"):
            opt.step()
        out["losses"].append(loss.item())
    out["weights"] = {n: p.detach().cpu().numpy().copy() for n, p in model.named_parameters()}
    return out


# ------------------------------------------------------------------ the library's way
def library_plan(cfg: GPTConfig) -> dict:
    """The same split declared for ``torch.distributed.tensor.parallel``: the vocabulary
    row-wise in the embedding (a weight split by rows, its output all-reduced) and
    column-wise in the head (its logits left split, for ``loss_parallel``); q, k, v and
    fc1 column-wise, proj and fc2 row-wise."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    plan = {"tokens": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(cfg.layers):
        plan.update({f"blocks.{i}.{name}": ColwiseParallel() for name in ("q", "k", "v", "fc1")})
        plan.update({f"blocks.{i}.{name}": RowwiseParallel() for name in ("proj", "fc2")})
    return plan


def library_step(rank: int, world_size: int, cfg: GPTConfig = GPTConfig(), batch_size: int = 8,
                 seed: int = 0, *, group=None) -> dict:
    """Rank function: one training step of the model split by ``library_plan``, the loss
    by ``loss_parallel`` (the logits never gathered). DTensor does its own
    communication, so the step is one span. Returns the loss, this rank's logits and
    gradients, for comparison with ``train_tp``."""
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    from .tensor_parallel import device_mesh_of
    g, device = as_group(group), runtime.library_device()
    model = parallelize_module(build(cfg, seed).to(device), device_mesh_of(g), library_plan(cfg))
    heads = _split_size(cfg.heads, g.size, "the attention's heads")   # DTensor would
    for block in model.blocks:                   # split unevenly, and cut through heads
        block.heads = heads                      # each rank's q, k, v hold its heads only
    x, y = (t.to(device) for t in next(token_batches(cfg, batch_size, seed)))
    with span("DTensor forward + backward"), loss_parallel():
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
    def local(t, like=None):
        if not hasattr(t, "to_local"):
            return t
        if like is not None and hasattr(like, "placements"):   # the embedding's gradient
            t = t.redistribute(placements=like.placements)     # comes back whole: its rows
        return t.to_local()

    out = {"loss": local(loss).item(), "first_logits": local(logits).detach().cpu().numpy().copy(),
           "first_grads": {n: local(p.grad, p).cpu().numpy().copy()
                           for n, p in model.named_parameters()}}
    del model, logits, loss      # DTensor's objects go before the group is destroyed
    return out
