"""Transformer blocks as the cost model sees them: GPT's and Llama's, per sequence.

A block of hidden size h with a heads of d = h / a, kv key-value heads (grouped-query
attention, Ainslie et al., 2023: kv = a is multi-head attention), an MLP of f hidden
units (gated: SwiGLU's three matrices, Shazeer, 2020), on a sequence of s tokens, in
16-bit activations (2 bytes):

* parameters: Q and O h^2 each, K and V h kv d each; MLP 2 h f (gated 3 h f); biases if
  any; two norms (LayerNorm 2h each, RMSNorm h each, Zhang & Sennrich, 2019).
* forward FLOPs: 2 s x (the matrices' parameters) + 4 s^2 h (the scores Q K^T and their
  use on V; Narayanan et al., 2021, eq. 3 over 3 for the forward alone). GPT (f = 4h,
  kv = a): 24 s h^2 + 4 s^2 h.
* matrix products (``Gemm``): QKV (s x (h + 2 kv d) x h, column-parallel), the scores
  and their use (a products of s x s x d and s x d x s, split by heads), the output
  projection (s x h x h, row-parallel), the MLP's up (s x f x h, twice gated) and down
  (s x h x f, row-parallel) projections: Megatron-LM's layout (Shoeybi et al., 2019).
* kept for the backward pass, in bytes (Korthikanti et al., 2022, section 4.1, eq. 1:
  GPT's s h (34 + 5 a s / h)): split by tensor parallelism: Q 2sh, K and V 2 s kv d
  each, the softmax's output 2 a s^2 and, with dropout, its mask a s^2 and output
  2 a s^2 (these three: what selective recomputation drops, "attention"), the output
  projection's input 2sh, the MLP's activation input 2sf and its output 2sf (gated: the
  gate's and the up projection's outputs and their product, 6sf); every tp rank holds
  whole the two norms' inputs 4sh, the inputs of QKV and of the MLP 4sh, and with
  dropout its two masks 2sh (what sequence parallelism splits). With flash attention
  (Dao et al., 2022) the s^2 tensors are never stored (4 a s bytes of softmax
  statistics are) and the scores are recomputed in the backward pass: one more s x s x d
  product per head there (``Layer.backward_gemms``; Dao et al., 2022, algorithm 4: the
  backward runs five products where a stored softmax needs four).
* element-wise bytes, read + written: softmax (and scaling, and dropout) over a s^2
  scores (none with flash attention: fused on chip), the MLP's activation over sf (gated
  5sf: SiLU, and the product's two reads and one write), rotary embeddings over Q and K;
  every tp rank repeats the two norms (2sh each), the two residual adds (3sh each) and
  with dropout the two dropouts (2sh each).
* a mixture-of-experts block (``experts`` E > 1, ``top_k`` k; Shazeer et al., 2017;
  GShard, Lepikhin et al., 2020): E MLPs of f units and a router (h x E); each token
  runs through k of them, so the MLP's products have k s rows, its kept and element-wise
  tensors are k times as large, and its parameters E times (``Layer.expert_params``,
  what expert parallelism spreads); the k s h activations it dispatches to the experts
  and combines back are ``Layer.routed_elems`` (balanced routing: every expert k s / E).
* under tensor parallelism the block all-reduces its s h output twice forward and its
  input's gradient twice backward (Shoeybi et al., 2019, figure 4); every tp rank holds
  the norms and the row-parallel layers' biases whole (``replicated_params``), whose
  gradients sequence parallelism all-reduces over tp once a step.
"""
from __future__ import annotations

from dataclasses import replace

from .checks import whole_experts
from .layers import Gemm, Layer

AB = 2                     # bytes per activation element (fp16 / bf16)
STATISTIC_BYTES = 4        # one float32 log-sum-exp per query and head (flash-style)


def block(name: str, seq: int, hidden: int, heads: int, *, kv_heads: int | None = None,
          ffn: int | None = None, gated: bool = False, norm: str = "layernorm",
          bias: bool = True, dropout: bool = True, rotary: bool = False,
          flash: bool = False, act_bytes: int = AB, experts: int = 1,
          top_k: int = 1) -> Layer:
    """One transformer block per sequence (see the module doc); act_bytes: 4 for a block
    trained in float32 (every tensor kept or moved twice as large); experts, top_k: a
    mixture-of-experts MLP (1, 1: a dense one)."""
    s, h, a, ab = seq, hidden, heads, act_bytes
    kv = a if kv_heads is None else kv_heads
    if h % a or a % kv:
        raise ValueError(f"hidden={h} must divide into heads={a}, and heads into "
                         f"kv_heads={kv} groups")
    if norm not in ("layernorm", "rmsnorm"):
        raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {norm!r}")
    if not (isinstance(experts, int) and isinstance(top_k, int) and 1 <= top_k <= experts):
        raise ValueError(f"experts and top_k must be whole numbers with 1 <= top_k <= "
                         f"experts, got experts={experts!r}, top_k={top_k!r}")
    d, f = h // a, 4 * h if ffn is None else ffn
    kvd = kv * d
    up = (2 if gated else 1) * f
    e, k = experts, top_k
    mlp_params = h * up + f * h + ((up + h) if bias else 0)
    router = h * e if e > 1 else 0
    matrices = h * h + 2 * h * kvd + h * h + e * (h * up + f * h) + router
    biases = ((h + 2 * kvd + h) + e * (up + h)) if bias else 0
    norms = 2 * (2 * h if norm == "layernorm" else h)
    gemms = (Gemm(s, h + 2 * kvd, h, split="n"),
             Gemm(s, s, d, count=a, weights=False, split="count"),
             Gemm(s, d, s, count=a, weights=False, split="count"),
             Gemm(s, h, h, split="k"),
             Gemm(k * s, up, h, split="n"),
             Gemm(k * s, h, f, split="k")) + ((Gemm(s, e, h, split=None),) if e > 1 else ())
    flops = sum(g.flops for g in gemms)
    # kept for backward, bytes (Korthikanti et al., 2022, section 4.1, generalised)
    # (written for 2-byte activations, as the paper counts them; w scales them to ab)
    w = ab / 2
    if flash:
        attention = 4.0 * a * s                       # the softmax's statistics, float32
    else:
        # the softmax's output, and with dropout its 1-byte mask and its output
        attention = w * 2.0 * a * s * s + ((1.0 + 2.0 * w) * a * s * s if dropout else 0.0)
    split = w * (2 * s * h + 4 * s * kvd + 2 * s * h + (6 if gated else 4) * k * s * f) + \
        attention
    replicated = w * (4 * s * h + 4 * s * h) + (2 * s * h if dropout else 0)
    # element-wise traffic, bytes read + written
    softmax = 0.0 if flash else ab * 2.0 * a * s * s * (3 if dropout else 2)
    mlp = ab * (5.0 if gated else 2.0) * k * s * f
    rope = ab * 2.0 * (s * h + s * kvd) if rotary else 0.0
    repeated = ab * (2 * 2 + 2 * 3 + (2 * 2 if dropout else 0)) * s * h
    return Layer(name, matrices + biases + norms, flops, out_elems=s * h,
                 saved_elems=split / ab, elementwise_bytes=softmax + mlp + rope,
                 replicated_bytes=repeated, tp_all_reduces=2, gemms=gemms,
                 saved_replicated_elems=replicated / ab, attention_elems=attention / ab,
                 attention_bytes=softmax, backward_gemms=gemms[1:2] if flash else (),
                 replicated_params=norms + (2 * h if bias else 0),   # + proj's, down's bias
                 expert_params=e * mlp_params if e > 1 else 0,
                 routed_elems=k * s * h if e > 1 else 0.0, experts=e)


def embedding(seq: int, hidden: int, vocab: int, *, act_bytes: int = AB) -> Layer:
    """The token embedding (vocab x h, split over tp by vocabulary; its output all-reduced,
    Megatron-LM's VocabParallelEmbedding): a lookup, no matrix work; keeps nothing."""
    return Layer("embedding", vocab * hidden, 0.0, out_elems=seq * hidden, saved_elems=0.0,
                 elementwise_bytes=act_bytes * 2.0 * seq * hidden, tp_all_reduces=1)


def head(seq: int, hidden: int, vocab: int, *, tied: bool, norm: str = "layernorm",
         act_bytes: int = AB) -> Layer:
    """The final norm and the logits (s x V x h, split by vocabulary; tied: the embedding's
    matrix, no parameters of its own). Kept: the norm's and the product's inputs (whole on
    every tp rank) and the softmax of the logits in float32 for the loss, 4 s V bytes
    split by vocabulary (Megatron-LM's vocabulary-parallel cross-entropy). Its input's
    gradient is summed over tp (one all-reduce; forward, the parallel cross-entropy
    exchanges only s numbers, counted as one all-reduce too)."""
    gemm = Gemm(seq, vocab, hidden, split="n")
    params = (0 if tied else vocab * hidden) + (2 if norm == "layernorm" else 1) * hidden
    return Layer("head", params, gemm.flops, out_elems=seq * hidden,
                 saved_elems=4.0 * seq * vocab / act_bytes,
                 elementwise_bytes=(4.0 + 4.0) * seq * vocab,      # softmax: float32 r + w
                 replicated_bytes=act_bytes * 2.0 * seq * hidden, tp_all_reduces=1, gemms=(gemm,),
                 saved_replicated_elems=2.0 * seq * hidden,
                 replicated_params=params - (0 if tied else vocab * hidden))   # the norm


def is_block(layer) -> bool:
    """Whether a layer is one of ``block``'s (dense or mixture-of-experts)."""
    return (layer.tp_all_reduces == 2 and len(layer.gemms) in (6, 7)
            and not layer.gemms[1].weights and layer.gemms[1].split == "count")


def check_expert_parallel(net, ep: int, owner: str) -> None:
    """Refuse an ep that does not divide a mixture's experts: each of the ep ranks holds
    whole experts, experts / ep of them (as ``sim.experts`` requires)."""
    for x in net.layers:
        if ep > 1 and x.experts > 1:
            whole_experts(owner, x.experts, ep)


def ring_attention(net):
    """The network with each block's attention as ring attention keeps it (context
    parallelism, ``sim.context``): no s x s tensor, one float32 log-sum-exp per query and
    head."""
    layers = []
    for x in net.layers:
        if is_block(x):
            scores = x.gemms[1]
            statistics = STATISTIC_BYTES * scores.m * scores.count / net.act_bytes
            x = replace(x, saved_elems=x.saved_elems - x.attention_elems + statistics,
                        attention_elems=0.0)
        layers.append(x)
    return replace(net, layers=tuple(layers))
