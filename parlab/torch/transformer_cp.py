"""Context parallelism: the sequence split over the ranks through every layer, attention
computed by passing keys and values around a ring (ring attention: Liu et al. 2023), by
hand over the course's traced sends.

Each rank holds the whole model and one chunk of every sequence: chunk r of n, seq_len / n
positions (or, zig-zag, two chunks: see ``chunks_of``). Everything but attention is position by position and needs
nothing from the other ranks. Attention needs every earlier position's key and value.
So the ranks pass their chunk's keys and values to the right, n - 1 times; after step s
rank r holds chunk r - s and attends to it, merging the partial results by their
log-sum-exp, as blockwise attention does (Rabe and Staats 2021; Dao et al. 2022):

    m = logsumexp(lse_a, lse_b);   out = exp(lse_a - m) out_a + exp(lse_b - m) out_b

Causal masking leaves rank r only chunks 0..r to attend to: the last rank computes n
blocks, the first one. The zig-zag split evens that out. Backward passes the chunks again, now with their key and value
gradients, which each rank adds to as the chunk goes by; after n steps every chunk's
gradients are back at its owner. The weights are replicated, so their gradients are
summed over the ranks once per step, as in data parallel. Here a rank passes its chunk
on after attending to it; Liu et al. overlap each transfer with the next block's work.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..trace import span
from . import comm, runtime, training
from .memory import saved_tensor_counter
from .groups import as_group
from .tensor_parallel import _split_size
from .transformer import GPTConfig, build, mask_future, optimizer, token_batches

TAG_K, TAG_V, TAG_DK, TAG_DV = 11, 12, 13, 14
ATTENTION, ATTENTION_BACKWARD = "attention tile", "attention tile (backward)"


def _pass_right(tensors_and_tags, g) -> list:
    """Send each tensor to the right neighbour, receive its like from the left."""
    outgoing = [(t.contiguous(), tag) for t, tag in tensors_and_tags]   # alive until sent
    works = [comm.isend(t, g.right, group=g, tag=tag, name="isend (ring)")
             for t, tag in outgoing]
    got = [comm.recv(torch.empty_like(t), g.left, group=g, tag=tag, name="recv (ring)")
           for t, tag in outgoing]
    comm.wait_all(works)
    return got


LAYOUTS = ("contiguous", "zigzag")


def chunks_of(rank: int, world_size: int, layout: str = "contiguous") -> tuple[int, ...]:
    """The chunks of the sequence a rank holds, in order. contiguous: n chunks, rank r
    the r-th. zigzag (the load-balanced split of Llama 3's context parallelism, Dubey et
    al. 2024, section 3.3.2, which all-gathers the keys and values rather than passing
    them round a ring): 2n chunks, rank r the r-th and the r-th from the end, so that
    under a causal mask every rank attends to as many keys as every other."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "contiguous":
        return (rank,)
    return (rank, 2 * world_size - 1 - rank)


def positions_of(rank: int, world_size: int, seq_len: int, layout: str = "contiguous"):
    """The positions of the sequence that a rank holds, as a tensor of indices."""
    chunks = chunks_of(rank, world_size, layout)
    size = _split_size(seq_len, world_size * len(chunks), f"the sequence ({layout} split)")
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks])


def _pairs(mine, theirs):
    """(index in ``mine``, index in ``theirs``, on the diagonal) for every pair of chunks
    that a causal mask leaves anything of: a key chunk before the query chunk, or the
    same chunk."""
    for qi, a in enumerate(mine):
        for ki, b in enumerate(theirs):
            if b <= a:
                yield qi, ki, b == a


def attention_blocks(world_size: int, layout: str = "contiguous") -> list[float]:
    """Per rank, the share of one sequence's whole (unmasked) attention that it computes
    under a causal mask, a diagonal block counted as half of one (exactly (c + 1) / 2c
    for c positions)."""
    k = len(chunks_of(0, world_size, layout))
    block = 1 / (world_size * k) ** 2
    return [sum(block / 2 if diag else block
                for j in range(world_size)
                for _, _, diag in _pairs(chunks_of(r, world_size, layout),
                                         chunks_of(j, world_size, layout)))
            for r in range(world_size)]


def _block(q, k, v, diagonal: bool):
    """Attention of q to one chunk of keys: (output, log-sum-exp per query); on the
    diagonal block a query sees itself and the keys before it."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if diagonal:
        scores = mask_future(scores)
    lse = scores.logsumexp(-1)
    return (scores - lse.unsqueeze(-1)).exp() @ v, lse


def _block_grads(q, k, v, grad_out, lse, delta, diagonal: bool):
    """One block's share of dq, dk and dv, from the softmax's final log-sum-exp ``lse``
    (the weights p recomputed exactly) and D = rowsum(dO . O), as FlashAttention-2's
    backward does (Dao 2023)."""
    scale = 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale
    p = ((mask_future(scores) if diagonal else scores) - lse.unsqueeze(-1)).exp()
    ds = p * (grad_out @ v.transpose(-2, -1) - delta)
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ grad_out


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, layout):
        mine = chunks_of(g.index, g.size, layout)
        size = q.shape[-2] // len(mine)
        outs, lses = [None] * len(mine), [None] * len(mine)
        k_j, v_j = k, v
        for step in range(g.size):
            j = (g.index - step) % g.size                 # whose chunks this rank holds
            for qi, ki, diag in _pairs(mine, chunks_of(j, g.size, layout)):
                with span(ATTENTION):
                    o, l = _block(q.narrow(-2, qi * size, size),
                                  k_j.narrow(-2, ki * size, size),
                                  v_j.narrow(-2, ki * size, size), diag)
                if outs[qi] is None:
                    outs[qi], lses[qi] = o, l
                else:                                     # the online softmax's merge
                    m = torch.logaddexp(lses[qi], l)
                    outs[qi] = ((lses[qi] - m).exp().unsqueeze(-1) * outs[qi]
                                + (l - m).exp().unsqueeze(-1) * o)
                    lses[qi] = m
            if step < g.size - 1:
                k_j, v_j = _pass_right([(k_j, TAG_K), (v_j, TAG_V)], g)
        out, lse = torch.cat(outs, -2), torch.cat(lses, -1)
        ctx.g, ctx.layout = g, layout
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        g, layout = ctx.g, ctx.layout
        mine = chunks_of(g.index, g.size, layout)
        size = q.shape[-2] // len(mine)
        delta = (grad_out * out).sum(-1, keepdim=True)   # D = rowsum(dO . O)
        dq = torch.zeros_like(q)
        k_j, v_j, dk_j, dv_j = k, v, torch.zeros_like(k), torch.zeros_like(v)
        for step in range(g.size):
            j = (g.index - step) % g.size
            for qi, ki, diag in _pairs(mine, chunks_of(j, g.size, layout)):
                rows, cols = slice(qi * size, (qi + 1) * size), slice(ki * size, (ki + 1) * size)
                with span(ATTENTION_BACKWARD):
                    dq_a, dk_b, dv_b = _block_grads(
                        q[..., rows, :], k_j[..., cols, :], v_j[..., cols, :],
                        grad_out[..., rows, :], lse[..., rows], delta[..., rows, :], diag)
                    dq[..., rows, :] += dq_a
                    dk_j[..., cols, :] += dk_b
                    dv_j[..., cols, :] += dv_b
            # the gradients travel with their chunks; the last pass brings them home
            if step < g.size - 1:
                k_j, v_j, dk_j, dv_j = _pass_right(
                    [(k_j, TAG_K), (v_j, TAG_V), (dk_j, TAG_DK), (dv_j, TAG_DV)], g)
            elif g.size > 1:
                dk_j, dv_j = _pass_right([(dk_j, TAG_DK), (dv_j, TAG_DV)], g)
        return dq, dk_j, dv_j, None, None


def ring_attention(q, k, v, group=None, layout: str = "contiguous"):
    """Causal attention of this rank's queries to every earlier position, the keys and
    values passed around the ring; q, k, v: (batch, heads, this rank's positions,
    head_dim), its positions those of ``positions_of(..., layout)``."""
    return _RingAttention.apply(q, k, v, as_group(group), layout)


def context_parallel_model(cfg: GPTConfig, seed: int, group=None, layout: str = "contiguous"):
    """The whole model, with each block's attention replaced by ring attention."""
    g = as_group(group)
    positions_of(g.index, g.size, cfg.seq_len, layout)     # says so if the split is uneven
    model = build(cfg, seed)
    for block in model.blocks:
        block.attention = lambda q, k, v: ring_attention(q, k, v, g, layout)
    return model


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
    home = n if n > 1 else 0                    # the gradients' passes (none alone)
    per_block = 2 * (n - 1) * chunk + (2 * (n - 1) + 2 * home) * chunk
    with torch.random.fork_rng():                # counting leaves the caller's seed be
        params = sum(p.numel() for p in build(cfg).parameters())
    ring = 2 * cfg.layers * per_block           # sent and received
    return {"ring": ring, "gradients": params * f32, "loss": f32,
            "total": ring + params * f32 + f32}


def train_cp(rank: int, world_size: int, cfg: GPTConfig = GPTConfig(), batch_size: int = 8,
             steps: int = 3, lr: float = 0.1, seed: int = 0, optimizer_name: str = "sgd",
             layout: str = "contiguous", *, group=None) -> dict:
    """Rank function: train the transformer with every sequence split over ``group``
    (default: every rank), on the batches of ``transformer.train_reference``. Returns the
    losses, this rank's positions, the first step's logits (at those positions),
    gradients (whole, after the sum) and bytes saved for the backward pass, and the final
    parameters."""
    g, device = as_group(group), runtime.rank_device()
    model = context_parallel_model(cfg, seed, g, layout).to(device)
    opt = optimizer(optimizer_name, model.parameters(), lr)
    batches = token_batches(cfg, batch_size, seed)
    here = positions_of(g.index, g.size, cfg.seq_len, layout)
    out = {"losses": [], "positions": here.numpy().copy()}
    here = here.to(device)
    for step in range(steps):
        x, y = (t.to(device)[:, here] for t in next(batches))
        with span("forward"), saved_tensor_counter(model) as saved:
            opt.zero_grad()
            logits = model(x, positions=here)
            # this chunk's share of the mean over every position of the batch
            loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1),
                                   reduction="sum") / (batch_size * cfg.seq_len)
        with span("backward"):
            loss.backward()
            training.all_reduce_gradients(model, g)
        if step == 0:
            out["saved_for_backward"] = saved.bytes
            out["first_logits"] = logits.detach().cpu().numpy().copy()
            out["first_grads"] = {n: p.grad.cpu().numpy().copy()
                                  for n, p in model.named_parameters()}
        with span("update"):
            opt.step()
        total = comm.all_reduce(loss.detach().reshape(1).clone(), group=g, name="all_reduce (loss)")
        out["losses"].append(total.item())
    out["weights"] = {n: p.detach().cpu().numpy().copy() for n, p in model.named_parameters()}
    return out
