"""A small decoder-only transformer (GPT-style), whole on one device: the reference that
the transformer's parallel strategies are checked against.

One block (Radford et al. 2019's pre-norm layout, as GPT-2 and Llama use):

    x = x + proj(attention(q(ln1(x)), k(ln1(x)), v(ln1(x))))     causal, ``heads`` heads
    x = x + fc2(gelu(fc1(ln2(x))))                                 fc1: d -> 4d, fc2: 4d -> d

between a token and a position embedding at the bottom and a final norm and a head over
the vocabulary at the top (not tied to the embedding, so that each can be split on its
own). Queries, keys and values are three layers rather than one packed layer: a split
by heads then cuts each of them into contiguous rows.

The tokens are generated, not downloaded: a fixed random walk over the vocabulary where
each token has a few likely successors, so a model can learn it and the loss falls.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 512
    seq_len: int = 64
    d_model: int = 128
    heads: int = 4
    layers: int = 2

    def __post_init__(self):
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} must divide by heads {self.heads}: "
                             f"pick a d_model in multiples of {self.heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def d_ff(self) -> int:
        return 4 * self.d_model


def mask_future(scores):
    """Scores (..., t, t) with each query's later keys set to -inf: a position sees
    itself and the positions before it."""
    t = scores.shape[-1]
    future = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(1)
    return scores.masked_fill(future, float("-inf"))


def causal_attention(q, k, v):
    """Softmax(q k^T / sqrt(d)) v over the heads in dim 1, each position seeing itself
    and the positions before it (Vaswani et al. 2017, eq. 1, masked)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return mask_future(scores).softmax(-1) @ v


def split_heads(x, heads: int):
    """(batch, time, heads · head_dim) -> (batch, heads, time, head_dim)."""
    b, t, d = x.shape
    return x.reshape(b, t, heads, d // heads).transpose(1, 2)


def merge_heads(x):
    """(batch, heads, time, head_dim) -> (batch, time, heads · head_dim)."""
    b, h, t, e = x.shape
    return x.transpose(1, 2).reshape(b, t, h * e)


class Block(nn.Module):
    attention = staticmethod(causal_attention)   # context parallelism puts a ring here

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d = cfg.d_model
        self.heads = cfg.heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, cfg.d_ff), nn.Linear(cfg.d_ff, d)

    def forward(self, x):
        h = self.ln1(x)
        q, k, v = (split_heads(f(h), self.heads) for f in (self.q, self.k, self.v))
        x = x + self.proj(merge_heads(self.attention(q, k, v)))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(cfg.vocab, cfg.d_model)
        self.positions = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx, positions=None):
        """Logits (batch, time, vocab); ``idx`` may hold some positions of the sequence
        only, ``positions`` saying which (context parallelism)."""
        if positions is None:
            positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build(cfg: GPTConfig, seed: int = 0) -> GPT:
    """The model with the same weights wherever it is built from the same seed."""
    torch.manual_seed(seed)
    return GPT(cfg)


def token_batches(cfg: GPTConfig, batch_size: int, seed: int = 0):
    """Endless (inputs, targets) batches, each (batch_size, seq_len) int64 tokens, the
    targets the inputs shifted by one; the same sequence on every rank and reference."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, cfg.vocab, size=(cfg.vocab, 4))   # each token's likely next
    while True:
        walk = np.empty((batch_size, cfg.seq_len + 1), dtype=np.int64)
        walk[:, 0] = rng.integers(0, cfg.vocab, batch_size)
        for t in range(1, cfg.seq_len + 1):
            follow = successors[walk[:, t - 1], rng.integers(0, 4, batch_size)]
            jump = rng.integers(0, cfg.vocab, batch_size)           # one step in ten: anywhere
            walk[:, t] = np.where(rng.random(batch_size) < 0.1, jump, follow)
        yield torch.from_numpy(walk[:, :-1]), torch.from_numpy(walk[:, 1:])


def text_batches(cfg: GPTConfig, batch_size: int, seed: int = 0, tokens: int = 200_000):
    """Endless (inputs, targets) batches of the generated language (``parlab.corpus``):
    windows of one long text at seeded places, the same on every rank. Held-out text is
    another seed's."""
    from .. import corpus
    if cfg.vocab < len(corpus.vocabulary()):
        raise ValueError(f"the language has {len(corpus.vocabulary())} words: set "
                         f"GPTConfig(vocab=) to at least that (got {cfg.vocab})")
    stream = torch.from_numpy(corpus.tokens(tokens, seed))
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(stream) - cfg.seq_len, batch_size)
        windows = torch.stack([stream[i:i + cfg.seq_len + 1] for i in starts])
        yield windows[:, :-1], windows[:, 1:]


@torch.no_grad()
def held_out_nats(model: GPT, cfg: GPTConfig, seed: int = 1, batches: int = 8,
                  batch_size: int = 16) -> float:
    """The model's mean cross-entropy (nats a token) on text it never trained on."""
    data = text_batches(cfg, batch_size, seed, tokens=50_000)
    device = next(model.parameters()).device
    return float(np.mean([lm_loss(model(x.to(device)), y.to(device)).item() for x, y in
                          (next(data) for _ in range(batches))]))


def lm_loss(logits, targets):
    """Mean cross-entropy of the next token over every position of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}


def optimizer(name: str, params, lr: float):
    """Plain SGD (the equivalence checks: one step is one update) or Adam (learning in
    a few dozen steps)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {name!r}")
    return OPTIMIZERS[name](params, lr=lr)


def train_reference(cfg: GPTConfig, batch_size: int = 8, steps: int = 3, lr: float = 0.1,
                    seed: int = 0, optimizer_name: str = "sgd") -> dict:
    """The whole model trained on one device: losses, the first step's logits,
    gradients and bytes saved for the backward pass, the final weights (numpy, by
    parameter name)."""
    from .memory import saved_tensor_counter
    model = build(cfg, seed)
    opt = optimizer(optimizer_name, model.parameters(), lr)
    batches = token_batches(cfg, batch_size, seed)
    out = {"losses": []}
    for step in range(steps):
        x, y = next(batches)
        opt.zero_grad()
        with saved_tensor_counter(model) as saved:
            logits = model(x)
            loss = lm_loss(logits, y)
        loss.backward()
        if step == 0:
            out["saved_for_backward"] = saved.bytes
            out["first_logits"] = logits.detach().numpy().copy()
            out["first_grads"] = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        opt.step()
        out["losses"].append(loss.item())
    out["weights"] = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    return out


LANGUAGE = GPTConfig(vocab=128, seq_len=32, d_model=64, heads=4, layers=2)


def learn_language(cfg: GPTConfig = LANGUAGE, steps: int = 60, batch_size: int = 16,
                   lr: float = 3e-3, seed: int = 0, prompt: str = "the") -> dict:
    """Train the model with Adam on the generated language (``parlab.corpus``), on one
    device. Returns the training losses, the held-out loss (nats a token), the two
    baselines it must beat (the unigram model, which counts words, and guessing) and a
    sentence the trained model writes after ``prompt``, each word its likeliest."""
    from .. import corpus
    torch.manual_seed(seed)
    model = build(cfg, seed)
    opt = optimizer("adam", model.parameters(), lr)
    batches = text_batches(cfg, batch_size, seed)
    losses = []
    for _ in range(steps):
        x, y = next(batches)
        opt.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    words = corpus.vocabulary()
    ids = [words.index(w) for w in [corpus.END, *prompt.split()]]   # a sentence's start
    with torch.no_grad():
        while len(ids) < 3 or (len(ids) < cfg.seq_len and words[ids[-1]] != corpus.END):
            logits = model(torch.tensor([ids]))
            ids.append(int(logits[0, -1].argmax()))
        ids = ids[1:]
    return {"losses": losses, "held_out": held_out_nats(model, cfg, seed + 1),
            "unigram": corpus.unigram_nats(corpus.tokens(200_000, seed),
                                           corpus.tokens(50_000, seed + 1)),
            "uniform": corpus.uniform_nats(), "writes": corpus.text(ids)}
