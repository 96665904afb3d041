"""Context parallelism: the sequence split over the ranks through every layer, attention
computed by passing keys and values around a ring (ring attention: Liu et al. 2023;
Brandon et al. 2023 for the causal case), by hand over the course's traced sends.

Each rank holds the whole model and one contiguous chunk of every sequence: chunk r of
n, seq_len / n positions. Everything but attention is position by position and needs
nothing from the other ranks. Attention needs every earlier position's key and value.
So the ranks pass their chunk's keys and values to the right, n - 1 times; after step s
rank r holds chunk r - s and attends to it, merging the partial results with the
log-sum-exp rule of the online softmax (Milakov and Gimelshein 2018):

    m = logsumexp(lse_a, lse_b);   out = exp(lse_a - m) out_a + exp(lse_b - m) out_b

Causal masking leaves rank r only chunks 0..r to attend to: the last rank computes n
blocks, the first one. Backward passes the chunks again, now with their key and value
gradients, which each rank adds to as the chunk goes by; after n steps every chunk's
gradients are back at its owner. The weights are replicated, so their gradients are
summed over the ranks once per step, as in data parallel.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..trace import span
from . import comm, runtime
from .groups import as_group
from .tensor_parallel import _split_size
from .transformer import GPTConfig, build, optimizer, token_batches

TAG_K, TAG_V, TAG_DK, TAG_DV = 11, 12, 13, 14


def _pass_right(tensors_and_tags, g) -> list:
    """Send each tensor to the right neighbour, receive its like from the left."""
    outgoing = [(t.contiguous(), tag) for t, tag in tensors_and_tags]   # alive until sent
    works = [comm.isend(t, g.right, group=g, tag=tag, name="isend (ring)")
             for t, tag in outgoing]
    got = [comm.recv(torch.empty_like(t), g.left, group=g, tag=tag, name="recv (ring)")
           for t, tag in outgoing]
    comm.wait_all(works)
    return got


def _block(q, k, v, diagonal: bool):
    """Attention of q to one chunk of keys: (output, log-sum-exp per query); on the
    diagonal block a query sees itself and the keys before it."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if diagonal:
        t = q.shape[-2]
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device)
                                    .triu(1), float("-inf"))
    lse = scores.logsumexp(-1)
    return (scores - lse.unsqueeze(-1)).exp() @ v, lse


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g):
        out = lse = None
        k_j, v_j = k, v
        for step in range(g.size):
            j = (g.index - step) % g.size                 # whose chunk this rank holds
            if j <= g.index:                              # causal: later chunks unseen
                o, l = _block(q, k_j, v_j, diagonal=j == g.index)
                if out is None:
                    out, lse = o, l
                else:
                    m = torch.logaddexp(lse, l)
                    out = (lse - m).exp().unsqueeze(-1) * out + (l - m).exp().unsqueeze(-1) * o
                    lse = m
            if step < g.size - 1:
                k_j, v_j = _pass_right([(k_j, TAG_K), (v_j, TAG_V)], g)
        ctx.g = g
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        g = ctx.g
        scale = 1 / math.sqrt(q.shape[-1])
        delta = (grad_out * out).sum(-1, keepdim=True)   # D = rowsum(dO . O)
        dq = torch.zeros_like(q)
        k_j, v_j, dk_j, dv_j = k, v, torch.zeros_like(k), torch.zeros_like(v)
        for step in range(g.size):
            j = (g.index - step) % g.size
            if j <= g.index:
                s = q @ k_j.transpose(-2, -1) * scale
                if j == g.index:
                    t = q.shape[-2]
                    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device)
                                      .triu(1), float("-inf"))
                p = (s - lse.unsqueeze(-1)).exp()         # this chunk's softmax weights
                dv_j = dv_j + p.transpose(-2, -1) @ grad_out
                ds = p * (grad_out @ v_j.transpose(-2, -1) - delta)
                dq = dq + ds @ k_j * scale
                dk_j = dk_j + ds.transpose(-2, -1) @ q * scale
            # the gradients travel with their chunk; the last pass brings them home
            if step < g.size - 1:
                k_j, v_j, dk_j, dv_j = _pass_right(
                    [(k_j, TAG_K), (v_j, TAG_V), (dk_j, TAG_DK), (dv_j, TAG_DV)], g)
            else:
                dk_j, dv_j = _pass_right([(dk_j, TAG_DK), (dv_j, TAG_DV)], g)
        return dq, dk_j, dv_j, None


def ring_attention(q, k, v, group=None):
    """Causal attention of this rank's chunk of queries to every earlier position, the
    keys and values passed around the ring; q, k, v: (batch, heads, seq/n, head_dim)."""
    return _RingAttention.apply(q, k, v, as_group(group))


def context_parallel_model(cfg: GPTConfig, seed: int, group=None):
    """The whole model, with each block's attention replaced by ring attention."""
    g = as_group(group)
    _split_size(cfg.seq_len, g.size, "the sequence")
    model = build(cfg, seed)
    for block in model.blocks:
        block.attention = lambda q, k, v: ring_attention(q, k, v, g)
    return model


def sync_grads(model, group=None) -> None:
    """Sum the replicated weights' gradients over the ranks: one all-reduce."""
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    comm.all_reduce(flat, group=group, name="all_reduce (gradients)")
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


def expected_comm_bytes(cfg: GPTConfig, batch_size: int, world_size: int) -> dict:
    """Bytes each rank hands to communication per training step, from the formula: a
    message counts on the sending rank's isend and on the receiving rank's recv, so each
    rank counts what it sends and what it receives (the same amount on a ring).

    Per block, a chunk's keys or values are batch · seq/n · d_model floats. Forward: keys
    and values passed n - 1 times. Backward: n - 1 times again, with their gradients n
    times. Then the gradients of every weight, all-reduced, and the loss (one number).
    """
    n, f32 = world_size, 4
    chunk = batch_size * cfg.seq_len // n * cfg.d_model * f32
    per_block = 2 * (n - 1) * chunk + (2 * (n - 1) + 2 * n) * chunk
    params = sum(p.numel() for p in build(cfg).parameters())
    ring = 2 * cfg.layers * per_block           # sent and received
    return {"ring": ring, "gradients": params * f32, "loss": f32,
            "total": ring + params * f32 + f32}


def train_cp(rank: int, world_size: int, cfg: GPTConfig = GPTConfig(), batch_size: int = 8,
             steps: int = 3, lr: float = 0.1, seed: int = 0, optimizer_name: str = "sgd",
             *, group=None) -> dict:
    """Rank function: train the transformer with every sequence split over ``group``
    (default: every rank), on the batches of ``transformer.train_reference``. Returns the
    losses, the first step's logits (this rank's positions) and gradients (whole, after
    the sum), and the final parameters."""
    g, device = as_group(group), runtime.rank_device()
    model = context_parallel_model(cfg, seed, g).to(device)
    opt = optimizer(optimizer_name, model.parameters(), lr)
    batches = token_batches(cfg, batch_size, seed)
    part = cfg.seq_len // g.size
    here = slice(g.index * part, (g.index + 1) * part)
    out = {"losses": []}
    for step in range(steps):
        x, y = (t[:, here].to(device) for t in next(batches))
        with span("forward"):
            opt.zero_grad()
            logits = model(x, first_position=here.start)
            # this chunk's share of the mean over every position of the batch
            loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1),
                                   reduction="sum") / (batch_size * cfg.seq_len)
        with span("backward"):
            loss.backward()
            sync_grads(model, g)
        if step == 0:
            out["first_logits"] = logits.detach().cpu().numpy().copy()
            out["first_grads"] = {n: p.grad.cpu().numpy().copy()
                                  for n, p in model.named_parameters()}
        with span("update"):
            opt.step()
        total = comm.all_reduce(loss.detach().reshape(1).clone(), group=g, name="all_reduce (loss)")
        out["losses"].append(total.item())
    out["weights"] = {n: p.detach().cpu().numpy().copy() for n, p in model.named_parameters()}
    return out
