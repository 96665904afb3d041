"""Sequence parallelism (Korthikanti et al. 2022, "Reducing activation recomputation in
large transformer models", section 4.2.2): tensor parallelism whose whole-activation
regions are split along the sequence too.

Under tensor parallelism alone, every rank holds the residual stream, the layer norms'
inputs and outputs whole: batch · seq_len · d_model floats each, on every rank. Here each
rank holds its seq_len / n positions of them. The exchanges change shape:

* where tensor parallelism all-reduced a row layer's partial sums (g), a
  **reduce-scatter** along the sequence adds them and leaves each rank its positions;
* where it copied the whole input to the column layers (f), an **all-gather** along the
  sequence gives every rank the whole sequence again (the attention needs it); backward,
  a reduce-scatter adds every rank's gradient for each rank's positions.

An all-reduce is a reduce-scatter followed by an all-gather (ring algorithm), so the
forward pass moves the same bytes; what each rank keeps between them is 1/n. Backward,
each gathered input is gathered again (it was kept by position): 2L + 1 all-gathers more
than tensor parallelism, about 1.25x its bytes on the links. The norms, the position
embedding and the row layers' biases now see only this rank's positions: their gradients
are partial sums, added over the ranks once after the backward pass
(``sync_replicated_grads``).

Activations are laid out (seq_len, batch, d_model) inside the model, as Megatron-LM
does, so the sequence is dim 0: the dim that reduce-scatter and all-gather split.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import comm, runtime, training
from .groups import as_group
from .tensor_parallel import _split_size
from .transformer import GPTConfig, build, causal_attention, merge_heads, split_heads
from .transformer_tp import ParallelBlock, ParallelGPT, train_split


class _ScatterSequence(torch.autograd.Function):
    """Reduce-scatter along dim 0 forward (partial sums added, each rank keeps its
    positions); all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return comm.reduce_scatter(x.contiguous(), group=group)

    @staticmethod
    def backward(ctx, grad):
        return torch.cat(comm.all_gather(grad.contiguous(), group=ctx.group), dim=0), None


class _GatheredLinears(torch.autograd.Function):
    """All-gather ``x`` along the sequence and apply column layers to the whole sequence,
    keeping only this rank's positions for the backward pass: there the input is
    gathered again (section 4.2.2: storing the gathered input would undo the saving).
    Arguments after the group: weight, bias, weight, bias, ... (a bias may be None)."""

    @staticmethod
    def forward(ctx, x, group, *weights_and_biases):
        weights, biases = weights_and_biases[::2], weights_and_biases[1::2]
        ctx.group, ctx.has_bias = group, [b is not None for b in biases]
        ctx.save_for_backward(x, *weights)
        whole = torch.cat(comm.all_gather(x.contiguous(), group=group), dim=0)
        return tuple(F.linear(whole, w, b) for w, b in zip(weights, biases))

    @staticmethod
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        whole = torch.cat(comm.all_gather(x.contiguous(), group=ctx.group,
                                          name="all_gather (again, backward)"), dim=0)
        flat = whole.reshape(-1, whole.shape[-1])
        grad_input, out = None, []
        for grad, w, has_bias in zip(grads, weights, ctx.has_bias):
            rows = grad.reshape(-1, grad.shape[-1])          # one row per position
            through = grad @ w                               # this layer's share of dx
            grad_input = through if grad_input is None else grad_input + through
            out += [rows.t() @ flat, rows.sum(0) if has_bias else None]
        return (comm.reduce_scatter(grad_input.contiguous(), group=ctx.group), None, *out)


def gathered_linears(x, layers, group=None):
    """``layers``' outputs on the whole sequence from this rank's positions ``x``; each
    layer a module with ``weight`` and ``bias`` (this rank's column slice)."""
    args = [t for m in layers for t in (m.weight, m.bias)]
    return _GatheredLinears.apply(x, as_group(group), *args)


def scatter_sequence(x, group=None):
    return _ScatterSequence.apply(x, as_group(group))


class SequenceParallelBlock(ParallelBlock):
    """A ``ParallelBlock``'s slices, run on this rank's positions (seq/n, batch, d)."""

    def forward(self, x):
        g = self.group
        q, k, v = (split_heads(t.transpose(0, 1), self.heads)         # (seq, batch, d/n) each
                   for t in gathered_linears(self.ln1(x), (self.q, self.k, self.v), g))
        heads = merge_heads(causal_attention(q, k, v)).transpose(0, 1)
        x = x + scatter_sequence(F.linear(heads, self.proj.weight), g) + self.proj.bias
        hidden, = gathered_linears(self.ln2(x), (self.fc1,), g)
        return x + scatter_sequence(F.linear(F.gelu(hidden), self.fc2.weight), g) + self.fc2.bias


class SequenceParallelGPT(ParallelGPT):
    """``ParallelGPT``'s parameters (the same names and slices), with the whole-activation
    regions split by position."""

    block_class = SequenceParallelBlock

    def __init__(self, dense, group=None):
        super().__init__(dense, group)
        g = self.group
        self.positions_here = _split_size(dense.cfg.seq_len, g.size, "the sequence")

    def forward(self, idx):
        """This rank's slice of the logits (batch, seq_len, vocab / n), every position."""
        g, n = self.group, self.positions_here
        if idx.shape[1] != self.cfg.seq_len:
            raise ValueError(f"sequence parallel splits the configured seq_len "
                             f"{self.cfg.seq_len} into {g.size} parts; got sequences of "
                             f"{idx.shape[1]} tokens")
        x = scatter_sequence(self.tokens.partial(idx.t()), g)       # (seq/n, batch, d)
        here = torch.arange(g.index * n, (g.index + 1) * n, device=idx.device)
        x = x + self.positions(here).unsqueeze(1)
        for block in self.blocks:
            x = block(x)
        logits, = gathered_linears(self.ln_f(x), (self.head,), g)
        return logits.transpose(0, 1)


def replicated_parameters(model: SequenceParallelGPT) -> list:
    """The parameters every rank holds whole but uses on its own positions only."""
    names = ("ln1.", "ln2.", "ln_f.", "positions.", "proj.bias", "fc2.bias")
    return [p for name, p in model.named_parameters() if any(k in name for k in names)]


def sync_replicated_grads(model: SequenceParallelGPT) -> None:
    """Add the replicated parameters' gradients over the ranks: each rank's is the sum
    over its positions only."""
    training.all_reduce_gradients(replicated_parameters(model), model.group,
                                  name="all_reduce (norms' gradients)")


def expected_comm_bytes(cfg: GPTConfig, batch_size: int, world_size: int) -> dict:
    """Bytes each rank hands to collectives per training step, from the formula, counted
    as ``comm`` records them: an all-gather by this rank's contribution (its positions), a
    reduce-scatter by its whole input.

    Forward: the embedding's reduce-scatter; per block two all-gathers (before q, k, v and
    before fc1) and two reduce-scatters (after the projection and after fc2); the final
    norm's all-gather; three numbers per position for the loss. Backward: each
    all-gather becomes a reduce-scatter and each reduce-scatter an all-gather, and each
    all-gathered input is gathered again (it was kept as this rank's positions). Then the
    replicated parameters' gradients, all-reduced once.
    """
    f32, positions = 4, batch_size * cfg.seq_len
    whole = positions * cfg.d_model * f32
    share = whole // world_size
    d, layers = cfg.d_model, cfg.layers
    forward = whole + layers * (2 * share + 2 * whole) + share + 3 * positions * f32
    backward = layers * (2 * whole + 2 * share) + whole + share + (2 * layers + 1) * share
    replicated = (layers * (4 * d + 2 * d) + 2 * d + cfg.seq_len * d) * f32
    return {"forward": forward, "backward": backward, "gradients": replicated,
            "total": forward + backward + replicated}


def split_activation_bytes(cfg: GPTConfig, batch_size: int) -> int:
    """Bytes of the activations saved for the backward pass that sequence parallelism
    splits over the ranks (tensor parallelism keeps them whole on every rank): each
    layer norm's input and output, and its two statistics per position (mean and
    reciprocal deviation), two norms a block and the final one; and the positions' int64
    indices. A rank saves 1 - 1/n of them fewer than under tensor parallelism."""
    f32, positions = 4, batch_size * cfg.seq_len
    norms = 2 * cfg.layers + 1
    return norms * (2 * positions * cfg.d_model + 2 * positions) * f32 + 8 * cfg.seq_len


def train_sp(rank: int, world_size: int, cfg: GPTConfig = GPTConfig(), batch_size: int = 8,
             steps: int = 3, lr: float = 0.1, seed: int = 0, optimizer_name: str = "sgd",
             *, group=None) -> dict:
    """Rank function: ``transformer_tp.train_tp`` with sequence parallelism; returns the
    same (losses, first logits slice, gradients and saved bytes, final parameters)."""
    g = as_group(group)
    model = SequenceParallelGPT(build(cfg, seed), g).to(runtime.rank_device())
    return train_split(model, cfg, batch_size, steps, lr, seed, optimizer_name,
                       after_backward=sync_replicated_grads)
