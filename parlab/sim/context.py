"""Context parallelism (CP) next to tensor and sequence parallelism: what one rank keeps
for the backward pass and what it hands to communication per step (PREDICTIONS).

Context parallelism splits every sequence by position over cp ranks, through every
layer (``parlab.torch.transformer_cp``): each rank holds the whole model (tp-sliced) and
s/cp positions of every activation. Everything but attention works position by
position; attention needs every earlier position's keys and values, so the ranks pass
their chunk's K and V round a ring (ring attention: Liu et al., 2023), merging the
partial results by their log-sum-exp (blockwise attention: Rabe & Staats, 2021; Dao et
al., 2022). The cp ranks hold the same weights, so their gradients are summed over the
cp group once a step, as in data parallel.

Memory (``activation_bytes``): the sim's count of what each layer keeps
(``sim.blocks``, after Korthikanti et al., 2022, section 4.1; ``sim.memory``): tp slices
the heads' and the MLP's tensors, sequence parallelism also the norms' regions, and cp
divides every per-position tensor by cp. Under cp > 1 attention keeps no s x s tensor
whatever the network's ``flash``: ring attention computes its blocks as flash attention
does and keeps, besides Q, K, V and the output (the projection's input), one float32
log-sum-exp per query and head, 4 (a / tp)(s / cp) bytes a sequence, and recomputes the
scores block by block in the backward pass (``_RingAttention`` saves exactly q, k, v, the
output and the log-sum-exp); the K and V chunks received from the other ranks are not
kept (the backward passes them round again). Selective recomputation then has nothing of
attention's to drop. The count leaves out small things autograd also keeps (the norms'
statistics, index tensors): the course's GPT keeps 0.4-6 % more than predicted.

Bytes (``bytes``), per rank and step, counted as ``parlab.torch.comm`` records them: an
all-reduce by its buffer, an all-gather by this rank's part, a reduce-scatter by its
whole input, a point-to-point message at both ends (its isend and its recv), so that the
course's measured runs check them to the byte. ``sent`` gives the bytes a rank puts on
the wire for the same work with ring algorithms (all-reduce 2 (n - 1)/n of its buffer,
all-gather and reduce-scatter (n - 1)/n of the whole, a pass its message once). Keys:

* "tp": tensor parallelism's collectives on activations (Shoeybi et al., 2019): per
  block two all-reduces of the local s h forward, two of the input's gradient backward;
  the embedding's output all-reduced forward; the logits' vocabulary-parallel
  cross-entropy all-reduces three float32 numbers a position (the maximum, the sum of
  exponentials, the target's logit: Megatron-LM's), and the head's input gradient one
  s h. With sequence parallelism (Korthikanti et al., 2022, section 4.2.2) each
  all-reduce becomes a reduce-scatter and an all-gather, and the backward gathers each
  gathered input again (it was kept by position). The sim's timelines price the loss's
  exchange as one s h all-reduce; here it is counted as it is.
* "tp_grads": sequence parallelism's all-reduce over tp of the gradients of what every tp
  rank holds whole (``Layer.replicated_params``: norms, row-parallel biases): each rank's
  is a sum over its positions only. 0 without it.
* "cp": ring attention's passes, per block: forward the local K and V (only the kv heads
  under grouped-query attention, this rank's tp share of them) cp - 1 times; backward K
  and V cp - 1 times again and their gradients cp times, the last pass bringing them
  home. Llama 3 all-gathers K and V instead (Dubey et al., 2024, section 3.3.2): the
  same bytes on a ring.
* "cp_grads": the all-reduce over cp of this rank's parameter gradients (cp ranks hold
  the same weights). Kept apart because with data parallelism it is the same all-reduce
  as data parallel's, over the dp x cp ranks (Megatron-LM reduces over that group): the
  buffer a rank hands over does not grow with cp, only the ring does.

The loss's value summed over the cp ranks for printing (the course's 4 bytes) is not
counted: the loss is a sum over positions, and its gradient needs no exchange.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import counted
from .blocks import STATISTIC_BYTES, is_block as _is_block, ring_attention as _ring_attention
from .memory import GB, memory_per_device
from .network import Network

LAYOUTS = ("contiguous", "zigzag")
AXES = ("tp", "tp_grads", "cp", "cp_grads")
LOSS_NUMBERS = 3         # a vocabulary-parallel cross-entropy's all-reduces a position


@dataclass(frozen=True)
class _Attention:
    """A block's attention as ``sim.blocks`` lays out its matrix products: QKV
    (s x (h + 2 kv d) x h) first, then the scores (a products of s x s x d)."""

    seq: int
    hidden: int
    heads: int
    kv_heads: int

    @classmethod
    def of(cls, layer) -> "_Attention":
        qkv, scores = layer.gemms[0], layer.gemms[1]
        d = int(scores.k)
        return cls(int(scores.m), int(qkv.k), int(scores.count), int((qkv.n - qkv.k) // (2 * d)))

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.hidden // self.heads


class _Tally:
    """Bytes per axis: handed to communication (``comm``'s count) and sent by rings."""

    def __init__(self):
        self.handed, self.sent = dict.fromkeys(AXES, 0.0), dict.fromkeys(AXES, 0.0)

    def _add(self, axis, handed, sent):
        self.handed[axis] += handed
        self.sent[axis] += sent

    def all_reduce(self, axis, nbytes, n, times=1):
        self._add(axis, times * nbytes, times * 2 * (n - 1) / n * nbytes)

    def all_gather(self, axis, whole, n, times=1):
        self._add(axis, times * whole / n, times * (n - 1) / n * whole)

    def reduce_scatter(self, axis, whole, n, times=1):
        self._add(axis, times * whole, times * (n - 1) / n * whole)

    def passes(self, axis, nbytes, times):
        self._add(axis, 2 * times * nbytes, times * nbytes)     # isend + recv; sent once


def split_transformer(net: Network, batch: int, *, tp: int = 1, cp: int = 1,
                      sequence_parallel: bool = False, layout: str = "zigzag") -> dict:
    """PREDICTED per rank and training step of a transformer ``net`` (``Network.transformer``,
    ``.llama`` or ``.decoder``) whose ``batch`` sequences (one micro-batch; with data
    parallelism, one replica's) are split over tp x cp ranks.

    tp: tensor parallelism (heads, MLP, vocabulary); cp: context parallelism (positions,
    ring attention); sequence_parallel: tp's norm regions split by position too (also on
    where ``net.trained(sequence_parallel=True)``); layout: cp's chunks, "contiguous" (seq
    divisible by cp) or "zigzag" (2 cp chunks, rank r the r-th from each end, so that a
    causal mask leaves every rank the same work; seq divisible by 2 cp). See the module
    doc for what is counted. Returns:

    * "activation_bytes": kept for the backward pass, one rank, all layers;
    * "bytes": {"tp", "tp_grads", "cp", "cp_grads"} handed to communication (comm's count);
    * "sent": the same, bytes put on the wire by ring algorithms;
    * "params_per_rank": parameters one rank holds (the sim's count: all sliced by tp);
    * "memory": a ``Memory`` of one rank (states without ZeRO, these activations);
    * "positions_per_rank": seq / cp, per sequence;
    * "attention_imbalance": the busiest cp rank's causal attention over the average's,
      (2 cp - 1) / cp contiguous, 1 zig-zag.
    """
    batch, tp, cp = counted(batch, "batch"), counted(tp, "tp"), counted(cp, "cp")
    sp = bool(sequence_parallel) or net.sequence_parallel
    shape = _check(net, tp, cp, sp, layout)
    ring = _ring_attention(net) if cp > 1 else net
    mem = memory_per_device(ring, batch, tp=tp, sequence_parallel=sp)[0]
    activations = mem.activations / cp
    params = net.params / tp
    tally = _Tally()
    _tensor_parallel(tally, net, batch, tp, cp, sp)
    _context_parallel(tally, net, batch, tp, cp, params)
    where = f"each of tp {tp}{' + sp' if sp and tp > 1 else ''} x cp {cp} ranks (PREDICTED)"
    return {"activation_bytes": activations, "bytes": tally.handed, "sent": tally.sent,
            "params_per_rank": params,
            "memory": replace(mem, device=where, activations=activations),
            "positions_per_rank": shape.seq // cp,
            "attention_imbalance": (2 * cp - 1) / cp if layout == "contiguous" else 1.0}


def _check(net: Network, tp: int, cp: int, sp: bool, layout: str) -> _Attention:
    """The blocks' attention shape, once every argument is known to fit the network."""
    if not isinstance(net, Network):
        raise ValueError(f"net must be a sim Network (Network.transformer, .llama or "
                         f".decoder), got {type(net).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    odd = [x.name for x in net.layers if not _is_block(x) and x.name not in ("embedding", "head")]
    blocks = [x for x in net.layers if _is_block(x)]
    if odd or not blocks:
        raise ValueError(f"split_transformer needs a transformer built by Network.transformer, "
                         f".llama or .decoder; {net.name!r} has layers that are not "
                         f"transformer blocks: {odd[:3] or 'no blocks'}")
    shape = _Attention.of(blocks[0])
    if shape.heads % tp or shape.kv_heads % tp:
        raise ValueError(f"tp={tp} must divide the {shape.heads} heads and {shape.kv_heads} "
                         f"key-value heads: pick a tp that divides {shape.kv_heads}")
    chunks = cp * (2 if layout == "zigzag" and cp > 1 else 1)
    if shape.seq % chunks:
        raise ValueError(f"a sequence of {shape.seq} positions does not split into {chunks} "
                         f"{layout} chunks for cp={cp}: use a sequence length divisible by "
                         f"{chunks}, another cp, or layout='contiguous' (cp chunks)")
    if sp and tp > 1 and (shape.seq // cp) % tp:
        raise ValueError(f"sequence parallelism splits each rank's {shape.seq // cp} "
                         f"positions over tp={tp}: use a tp that divides them")
    return shape


def _tensor_parallel(tally: _Tally, net: Network, batch: int, tp: int, cp: int, sp: bool):
    """tp's collectives on this rank's positions (module doc, "tp" and "tp_grads")."""
    if tp == 1:
        return
    ab = net.act_bytes
    positions = batch * _Attention.of(next(x for x in net.layers if _is_block(x))).seq / cp
    again = 2 if net.recompute == "full" else 1      # full recomputation: blocks' forward twice
    for i, x in enumerate(net.layers):
        whole = batch * x.out_elems / cp * ab            # this rank's positions, every feature
        grad = batch * net.out_elems(i - 1) / cp * ab    # its input's gradient
        if x.name == "embedding":
            if sp:
                tally.reduce_scatter("tp", whole, tp)
                tally.all_gather("tp", whole, tp)        # the scatter's gradient
            else:
                tally.all_reduce("tp", whole, tp)        # the input (tokens) needs no gradient
        elif x.name == "head":
            tally.all_reduce("tp", positions * STATISTIC_BYTES, tp, LOSS_NUMBERS)
            if sp:
                tally.all_gather("tp", grad, tp, 2)      # forward, and again backward
                tally.reduce_scatter("tp", grad, tp)
            else:
                tally.all_reduce("tp", grad, tp)
        elif sp:
            tally.all_gather("tp", grad, tp, 2 * again)           # before QKV and the MLP
            tally.reduce_scatter("tp", whole, tp, 2 * again)      # after the proj., down
            tally.reduce_scatter("tp", grad, tp, 2)               # the gathers' backward
            tally.all_gather("tp", whole, tp, 2)                  # the scatters' backward
            tally.all_gather("tp", grad, tp, 2)                   # the inputs gathered again
        else:
            tally.all_reduce("tp", whole, tp, 2 * again)
            tally.all_reduce("tp", grad, tp, 2)
    if sp:
        replicated = sum(x.replicated_params for x in net.layers)
        tally.all_reduce("tp_grads", replicated * net.grad_wire_bytes, tp)


def _context_parallel(tally: _Tally, net: Network, batch: int, tp: int, cp: int,
                      params: float):
    """cp's ring passes and gradient all-reduce (module doc, "cp" and "cp_grads")."""
    if cp == 1:
        return
    again = 2 if net.recompute == "full" else 1
    for x in net.layers:
        if not _is_block(x):
            continue
        a = _Attention.of(x)
        chunk = batch * a.seq / cp * a.kv_width / tp * net.act_bytes   # this rank's K (or V)
        tally.passes("cp", chunk, 2 * (cp - 1) * again)     # K and V, forward
        tally.passes("cp", chunk, 2 * (cp - 1) + 2 * cp)    # K, V and (home too) dK, dV
    tally.all_reduce("cp_grads", params * net.grad_wire_bytes, cp)


# ------------------------------------------------------------------ a table of choices
@dataclass(frozen=True)
class Choice:
    """One way to split a model's sequences over tp x cp ranks (PREDICTED, per rank and
    step): activations kept, states (weights, gradients, optimizer; no ZeRO, no pipeline),
    GB sent per axis by ring algorithms (the "tp" column with sequence parallelism's
    gradient all-reduce; "cp grads" the weights' gradients over cp), and whether the
    activations alone fit a GPU."""

    plan: str
    tp: int
    cp: int
    sequence_parallel: bool
    activation_bytes: float
    state_bytes: float
    sent: dict
    fits: bool | None = None

    @property
    def devices(self) -> int:
        return self.tp * self.cp

    def __str__(self) -> str:
        fits = "" if self.fits is None else ("yes" if self.fits else "no")
        s = self.sent
        return (f"{self.plan:<20} {self.devices:>7} {self.activation_bytes / GB:>10.1f} "
                f"{self.state_bytes / GB:>9.1f} {(s['tp'] + s['tp_grads']) / GB:>8.1f} "
                f"{s['cp'] / GB:>8.1f} {s['cp_grads'] / GB:>9.1f}  {fits}")


HEADER = (f"{'PREDICTED plan':<20} {'devices':>7} {'acts GB':>10} {'states GB':>9} "
          f"{'tp GB':>8} {'cp GB':>8} {'cp grads':>9}  acts fit")


def choices(net: Network, batch: int = 1, *, node: int = 8, devices: int = 128,
            gpu_bytes: float | None = None, layout: str = "zigzag", plans=None) -> list[Choice]:
    """PREDICTED rows for a table: one device; tp ``node`` (a server's GPUs on NVLink),
    with and without sequence parallelism; cp devices/node and cp devices; tp node x cp
    devices/node, with and without sequence parallelism. plans: your own
    ((label, tp, cp, sequence_parallel), ...) instead. gpu_bytes: a GPU's memory, to say
    whether the activations alone fit (pipeline stages and ZeRO share the states out;
    context parallelism does not)."""
    node, devices = counted(node, "node"), counted(devices, "devices")
    if devices % node:
        raise ValueError(f"devices={devices} must be a multiple of node={node} (tp stays "
                         f"within a node, cp spans the nodes)")
    if plans is None:
        c = devices // node
        plans = (("one device", 1, 1, False), (f"tp {node}", node, 1, False),
                 (f"tp {node} + sp", node, 1, True), (f"cp {c}", 1, c, False),
                 (f"cp {devices}", 1, devices, False), (f"tp {node} x cp {c}", node, c, False),
                 (f"tp {node} + sp x cp {c}", node, c, True))
    rows = []
    for label, tp, cp, sp in plans:
        out = split_transformer(net, batch, tp=tp, cp=cp, sequence_parallel=sp, layout=layout)
        acts = out["activation_bytes"]
        rows.append(Choice(label, tp, cp, sp, acts, out["memory"].states, out["sent"],
                           None if gpu_bytes is None else acts <= gpu_bytes))
    return rows


def table(rows: list[Choice], title: str = "") -> str:
    """The rows as text, GB per rank and step; sent: by ring algorithms (module doc)."""
    lines = [title] if title else []
    return "\n".join(lines + [HEADER] + [str(r) for r in rows])


def llama3_405b(seq: int = 131072) -> Network:
    """Llama 3 405B as the published runs record it (``published_runs_lm``: Dubey et al.,
    2024, Table 3: 126 layers, hidden 16384, 128 heads, 8 key-value heads, ffn 53248, the
    vocabulary printed as 128,000; SwiGLU, RMSNorm, rotary, untied), with flash attention,
    in bf16 with Adam; ``seq`` tokens a sequence (131072: the 128K context stage)."""
    from .published_runs_lm import llama3_2024
    seq = counted(seq, "seq")
    m = next(r.setup.model for r in llama3_2024() if r.setup.parallel.cp > 1)
    return Network.llama(f"{m.name.split(' (')[0]} at {seq} tokens", m.layers, m.hidden,
                         m.heads, seq, m.vocab, kv_heads=m.kv_heads, ffn=m.ffn, flash=True)
