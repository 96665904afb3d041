"""Expert parallelism (EP) in the cost model: a mixture-of-experts layer's parameters,
FLOPs, all-to-all bytes and step per rank, and published MoE runs (PREDICTIONS).

A mixture-of-experts (MoE) layer (Shazeer et al., 2017) holds E expert MLPs (d_model x
d_ff and back; gated: three matrices, SwiGLU) and a router (d_model x E). Each token
goes to its top k experts, so a token costs k experts' FLOPs whatever E is: per token
forward, 2 d E for the router and k 2 d d_ff (2 or 3) for the experts (2 FLOPs a
multiply-add); the backward twice that. With a capacity factor cf (GShard, Lepikhin et
al., 2020; Switch, Fedus et al., 2021) a rank dispatches a buffer of E slots of
C = ceil(cf T k / E) rows each, padded or dropped: E C rows instead of T k.

Expert parallelism puts E / ep experts on each of ep ranks, the rest replicated; each
rank takes its own T tokens, as in data parallel. Per layer and step a rank hands four
all-to-alls (``parlab.torch.moe``): forward, the dispatch (its T k rows of d_model to
their experts' ranks) and the combine (the rows its experts took, back); backward, the
two reversed. Under balanced routing a rank's experts take as many rows as it sends, so
each of the four carries about T k d bytes (``act_bytes`` each), (ep - 1)/ep of which
leave the rank. The replicated weights' gradients (the router's) are all-reduced over
the ep x dp ranks, the experts' over the dp ranks that hold the same experts.

Bytes are counted as ``parlab.torch.comm`` traces them (an all-to-all by its input: what
the rank hands over, its own share included) under "bytes", and put on the wire under
"sent" ((ep - 1)/ep of an all-to-all; 2 (n - 1)/n of a ring all-reduce). "routing" is
what the course's implementation also sends: the counts (one int64 per rank) before the
dispatch, and each row's expert id (int64) beside it. ``traced_all_to_all_bytes``
reproduces the course's traced bytes for a given routing exactly
(``parlab.torch.moe.expected_all_to_all_bytes``); ``expert_parallel`` predicts them for
balanced routing. Time (``sim.collectives.all_to_all_time``: pairwise exchange, the
network's share across nodes) and compute (FLOPs at the cluster's matrix rate) are
added without overlap.

Published runs (``published_moe_rows``, ``lines``): DeepSeek-V3 (DeepSeek-AI, 2024) and
Megatron-Core's MoE Parallel Folding runs (Liu et al., 2025) with their stated layouts:
per-GPU all-to-all GB a step, its time with the EP group inside one NVLink domain, as
run, and one rank per node over InfiniBand, and the published figure against ours.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import counted
from .checks import amount, whole_experts
from .clusters import MAX_ACHIEVABLE, SUSTAINED_LINK, h100_infiniband
from .collectives import all_reduce_time, all_to_all_time
from .layers import optimizer_state
from .memory import GB, Memory
from .model import Cluster, Link
from .published_setups import Cite

ID_BYTES = 8          # the course sends each row's expert id as int64
COUNT_BYTES = 8       # and one int64 count per rank before the dispatch
ROUTER_PROB_BYTES = 4  # the router's softmax kept in float32 for the backward
AXES = ("all_to_all", "routing", "dp_grads")


@dataclass(frozen=True)
class MoELayer:
    """One MoE layer as the cost model sees it, for ``tokens`` tokens a rank a step."""

    name: str
    tokens: int
    d_model: int
    d_ff: int
    experts: int
    top_k: int
    gated: bool = False
    act_bytes: int = 2
    capacity_factor: float | None = None
    bias: bool = False

    @property
    def matrices(self) -> int:
        return 3 if self.gated else 2

    @property
    def expert_params(self) -> int:
        """One expert: (2 or 3) d d_ff weights, with ``bias`` d_ff (per up matrix) + d."""
        extra = (self.matrices - 1) * self.d_ff + self.d_model if self.bias else 0
        return self.matrices * self.d_model * self.d_ff + extra

    @property
    def router_params(self) -> int:
        return self.d_model * self.experts

    @property
    def params(self) -> int:
        return self.router_params + self.experts * self.expert_params

    @property
    def capacity(self) -> int | None:
        """Rows an expert takes from one rank (GShard's C), None without a limit."""
        cf = self.capacity_factor
        return None if cf is None else math.ceil(cf * self.tokens * self.top_k / self.experts)

    @property
    def rows(self) -> int:
        """Rows a rank dispatches a step: T k, or the E C slots of a capacity buffer."""
        c = self.capacity
        return self.tokens * self.top_k if c is None else self.experts * c

    @property
    def forward_flops(self) -> float:
        """Forward FLOPs of a rank's tokens: router 2 T d E + experts 2 rows d d_ff (2|3)."""
        return (2 * self.tokens * self.d_model * self.experts
                + 2 * self.rows * self.matrices * self.d_model * self.d_ff)

    def __str__(self) -> str:
        return (f"{self.name}: {self.experts} experts of {self.d_model} x {self.d_ff}"
                f"{' (gated)' if self.gated else ''}, top {self.top_k}, {self.tokens} tokens "
                f"a rank: {self.params / 1e6:,.1f} M parameters, "
                f"{3 * self.forward_flops / 1e9:,.2f} GFLOP a step (PREDICTED)")


def moe_layer(name: str, tokens: int, d_model: int, d_ff: int, experts: int, top_k: int, *,
              gated: bool = False, act_bytes: int = 2, capacity_factor: float | None = None,
              bias: bool = False) -> MoELayer:
    """An MoE layer: ``tokens`` a rank a step (one rank's own, as in data parallel), E
    ``experts`` of d_model x d_ff (``gated``: SwiGLU's three matrices), top ``top_k``
    routing, ``capacity_factor`` (None: no limit, every assignment kept), ``act_bytes``
    per activation (2 bf16, 4 float32, as the course's), ``bias`` (the course's experts
    have biases)."""
    what = f"moe_layer {name!r}"
    tokens = counted(tokens, f"{what}: tokens")
    d_model, d_ff = counted(d_model, f"{what}: d_model"), counted(d_ff, f"{what}: d_ff")
    experts = counted(experts, f"{what}: experts")
    top_k = counted(top_k, f"{what}: top_k")
    if top_k > experts:
        raise ValueError(f"{what}: top_k must be at most experts ({experts}), got {top_k}: "
                         f"pick a top_k between 1 and {experts}")
    act_bytes = counted(act_bytes, f"{what}: act_bytes")
    if capacity_factor is not None:
        amount(what, "capacity_factor", capacity_factor, positive=True)
    return MoELayer(name, tokens, d_model, d_ff, experts, top_k, bool(gated), act_bytes,
                    capacity_factor, bool(bias))


# ------------------------------------------------------------------ bytes a rank hands over
def traced_all_to_all_bytes(per_expert, rank: int, ep: int, *, tokens: int, d_model: int,
                            top_k: int, act_bytes: int = 4) -> int:
    """Bytes rank ``rank`` of ``ep`` hands to all-to-alls in one step of the course's
    expert parallelism (``parlab.torch.moe.ExpertParallelMoE``), given the step's routing
    (``per_expert``: assignments each expert took over every rank; ``tokens``: this
    rank's). As ``comm`` counts each call by its input: the counts (ep int64), the
    dispatch (tokens k rows) and its ids (int64 each), the combine (the rows this rank's
    experts took); backward, the combine's and the dispatch's reverse. Exact, not a
    prediction: it is what the course's trace records."""
    ep = counted(ep, "traced_all_to_all_bytes: ep")
    per_expert = [counted(c, "traced_all_to_all_bytes: each count in per_expert", 0)
                  for c in per_expert]
    local = whole_experts("traced_all_to_all_bytes", len(per_expert), ep)
    rank = counted(rank, "traced_all_to_all_bytes: rank", 0)
    if rank >= ep:
        raise ValueError(f"traced_all_to_all_bytes: rank must be below ep={ep}, got {rank}")
    owner = "traced_all_to_all_bytes"
    sent = counted(tokens, f"{owner}: tokens") * counted(top_k, f"{owner}: top_k")
    received = sum(per_expert[rank * local:(rank + 1) * local])
    row = counted(d_model, f"{owner}: d_model") * counted(act_bytes, f"{owner}: act_bytes")
    return COUNT_BYTES * ep + sent * (row + ID_BYTES) + 2 * received * row + sent * row


def all_to_all_bytes(layer: MoELayer, ep: int) -> dict:
    """PREDICTED bytes one rank hands to all-to-alls a step for one layer, balanced routing
    (its experts take as many rows as it sends): {"all_to_all": 4 rows d act_bytes (the
    dispatch and the combine, forward and backward), "routing": the course's counts and
    ids}. Nothing where ep = 1: no exchange is needed."""
    ep = counted(ep, "all_to_all_bytes: ep")
    whole_experts("all_to_all_bytes", layer.experts, ep)
    if ep == 1:
        return {"all_to_all": 0.0, "routing": 0.0}
    row = layer.d_model * layer.act_bytes
    return {"all_to_all": 4.0 * layer.rows * row,
            "routing": float(COUNT_BYTES * ep + ID_BYTES * layer.rows)}


# ------------------------------------------------------------------ a rank's step
def expert_parallel(layer: MoELayer, ep: int, *, cluster: Cluster, dp: int = 1,
                    layers: float = 1, stride: int = 1, optimizer: str = "adam") -> dict:
    """PREDICTED per rank and training step of ``layers`` such MoE layers (a pipeline
    stage's share may be fractional) with E / ep experts a rank, ``dp`` copies of each
    expert group (ep x dp ranks in all), the ep group spaced ``stride`` ranks apart
    (``sim.collectives``; 1: packed into nodes). Returns:

    * "experts_per_rank"; "params": parameters a rank holds (router + E / ep experts);
    * "flops": forward and backward (3 x forward), balanced routing;
    * "bytes": {"all_to_all", "routing", "dp_grads"} handed to communication (comm's
      count); "sent": the same put on the wire; both in bytes a step;
    * "seconds": {"compute" (flops at ``cluster.flops``), "all_to_all" (four a layer,
      plus the routing's two small ones), "dp_grads"}; "step_s": their sum (no overlap);
    * "memory": a ``Memory`` of one rank, these layers only (mixed-precision Adam with
      act_bytes 2; activations: each received row's input, its d_ff products and the
      activation's output, after Korthikanti et al. 2022's MLP count, plus the router's
      float32 probabilities and the combined rows).
    """
    ep, dp = counted(ep, "expert_parallel: ep"), counted(dp, "expert_parallel: dp")
    stride = counted(stride, "expert_parallel: stride")
    layers = amount("expert_parallel", "layers", layers, positive=True)
    if not isinstance(cluster, Cluster):
        raise ValueError(f"expert_parallel: cluster must be a sim Cluster (e.g. "
                         f"sim.h100_infiniband(nodes)), got {type(cluster).__name__}")
    if ep * dp > cluster.devices:
        raise ValueError(f"expert_parallel: ep x dp = {ep * dp} ranks do not fit "
                         f"{cluster.name!r} ({cluster.devices} devices): use a larger "
                         f"cluster, e.g. h100_infiniband(nodes={math.ceil(ep * dp / 8)})")
    local = whole_experts("expert_parallel", layer.experts, ep)
    state, _ = optimizer_state(optimizer, layer.act_bytes)
    params = layers * (layer.router_params + local * layer.expert_params)
    expert_grads = layers * local * layer.expert_params * layer.act_bytes
    router_grads = layers * layer.router_params * layer.act_bytes
    moved = all_to_all_bytes(layer, ep)
    handed = {"all_to_all": layers * moved["all_to_all"],
              "routing": layers * moved["routing"],
              "dp_grads": (router_grads if ep * dp > 1 else 0.0)
              + (expert_grads if dp > 1 else 0.0)}
    sent = {"all_to_all": handed["all_to_all"] * (ep - 1) / ep,
            "routing": handed["routing"] * (ep - 1) / ep,
            "dp_grads": router_grads * _ring(ep * dp) + expert_grads * _ring(dp)}
    call = layer.rows * layer.d_model * layer.act_bytes
    a2a = 0.0
    if ep > 1:
        a2a = layers * (4 * all_to_all_time(cluster, call, ep, stride)
                        + all_to_all_time(cluster, COUNT_BYTES * ep, ep, stride)
                        + all_to_all_time(cluster, ID_BYTES * layer.rows, ep, stride))
    seconds = {"compute": layers * 3 * layer.forward_flops / cluster.flops,
               "all_to_all": a2a,
               "dp_grads": all_reduce_time(cluster, router_grads, ep * dp)
               + all_reduce_time(cluster, expert_grads, dp, stride * ep)}
    # a received row keeps its input (d), its d_ff products (2 gated) and the
    # activation's output (d_ff); the sender keeps the combined row (d) for the weights'
    # gradient, and the router its probabilities
    per_row = (2 * layer.d_model + layer.matrices * layer.d_ff) * layer.act_bytes
    activations = layers * (layer.rows * per_row
                            + layer.tokens * layer.experts * ROUTER_PROB_BYTES)
    where = f"each of ep {ep} x dp {dp} ranks, {layers:g} MoE layer(s) (PREDICTED)"
    memory = Memory(where, params * state["params"], params * state["grads"],
                    params * state["optimizer"], activations, cluster.memory_bytes)
    return {"experts_per_rank": local, "params": params, "flops": layers * 3 * layer.forward_flops,
            "bytes": handed, "sent": sent, "seconds": seconds, "step_s": sum(seconds.values()),
            "memory": memory}


def _ring(n: int) -> float:
    """A ring all-reduce puts 2 (n - 1)/n of its buffer on the wire (0 for one rank)."""
    return 2 * (n - 1) / n


# ------------------------------------------------------------------ published MoE runs
@dataclass(frozen=True)
class PublishedMoE:
    """A published MoE training run: its model and layout as the source states them (the
    note names what is not), and one published figure. Widths as ``published_setups``;
    ``d_ff`` one routed expert's, ``shared_ff`` the shared experts' together (0: none);
    ``stated_params`` (total, active) where the source prints them, else counted from
    the widths; ``ep`` over ranks that also hold attention (tp x dp of a stage), one
    expert slice each (expert tp 1); ``nvlink_Bps`` a GPU's NVLink peak each way."""

    id: str
    title: str
    cite: Cite
    layers: int
    moe_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    d_ff: int
    experts: int
    top_k: int
    shared_ff: int
    vocab: int
    seq: int
    stated_params: tuple | None
    gpus: int
    tp: int
    pp: int
    ep: int
    global_batch: int
    capacity_factor: float | None
    nvlink_Bps: float
    metric: str            # "MFU" (of ``PEAK_BF16``) | "GPU hours per trillion tokens"
    value: float
    verified: str
    note: str


PEAK_BF16 = 989.5e12     # H100/H800 SXM dense BF16, as Liu et al. (2025) section 4.1 state

DEEPSEEK_V3 = Cite("DeepSeek-AI", 2024, "arXiv:2412.19437",
                   "sections 3.1, 3.2, 3.2.2, 4.2 and the training-cost table of section 1")
FOLDING = Cite("Liu, He, Khattar, Zhang, Yan, Wang, Korthikanti, et al. (NVIDIA)", 2025,
               "arXiv:2504.14960 (MoE Parallel Folding)", "section 4.1, Table 1, Table 3")
_FOLDING_VERIFIED = ("the paper: section 4.1 (Eos, DGX H100, 989.5 TFLOP/s, 450 GB/s "
                     "NVLink, 400 Gb/s IB, capacity factor 1), Table 3 (layouts, MFU), "
                     "global batch 256, sequence 4096 (appendix 6.4)")
_FOLDING_NOTE = ("MCore with MoE Parallel Folding: attention tp x pp x dp, the MoE layers "
                 "ep x pp x (expert) dp with expert tp 1, token dropping at capacity "
                 "factor 1. Model widths are the released config's (not in the paper, not "
                 "checked against it); micro-batch not stated: 1 sequence assumed for the 1F1B "
                 "bubble; tp's and pp's own messages and overlap are not modelled.")


def published_runs() -> list[PublishedMoE]:
    """The runs, transcribed: DeepSeek-V3, Mixtral 8x22B and Qwen2-57B-A14B."""
    return [
        PublishedMoE(
            "deepseek-v3", "DeepSeek-V3 on 2048 H800: PP 16, EP 64 over 8 nodes, ZeRO-1 DP",
            DEEPSEEK_V3, 61, 58, 7168, 128, 128, 128, 2048, 256, 8, 2048, 129280, 4096,
            (671e9, 37e9), 2048, 1, 16, 64, 15360, None, 200e9,
            "GPU hours per trillion tokens", 180e3,
            "the report: 671B total, 37B activated; 61 layers, hidden "
            "7168, 128 heads of 128; MoE in all but the first 3 layers, 1 shared + 256 "
            "routed experts of 2048, 8 activated, at most 4 nodes a token; 2048 H800, "
            "PP 16, EP 64 spanning 8 nodes, ZeRO-1 DP, no TP; NVLink 160 GB/s, IB 50 GB/s; "
            "180K H800 GPU hours per trillion tokens; batch 15360 sequences of 4K after the "
            "first 469B tokens (section 4.2)",
            "Vocabulary 129,280 from the released config (not in the report; unused: the "
            "parameters are the stated ones). The report overlaps the all-to-all with "
            "compute (DualPipe), dispatches in FP8, sends a token once per node over IB "
            "(at most 4), and runs its GEMMs in FP8; priced here as BF16 all-to-alls and "
            "BF16 GEMMs, without overlap: an upper bound. It states a computation-to-"
            "communication ratio of about 1:1 for cross-node EP (section 3.2.1)."),
        PublishedMoE(
            "mixtral-8x22b", "Mixtral 8x22B on 128 H100: TP 2, PP 8, EP 8 (folded)",
            FOLDING, 56, 56, 6144, 48, 8, 128, 16384, 8, 2, 0, 32768, 4096, None,
            128, 2, 8, 8, 256, 1.0, 450e9, "MFU", 0.493, _FOLDING_VERIFIED, _FOLDING_NOTE),
        PublishedMoE(
            "qwen2-57b-a14b", "Qwen2-57B-A14B on 64 H100: TP 2, PP 4, EP 4 (folded)",
            FOLDING, 28, 28, 3584, 28, 4, 128, 2560, 64, 8, 20480, 151936, 4096, None,
            64, 2, 4, 4, 256, 1.0, 450e9, "MFU", 0.390, _FOLDING_VERIFIED, _FOLDING_NOTE
            + " The paper puts fine-grained models' lower MFU down to more all-to-all "
            "volume and smaller GEMMs (section 4.2); compute here is at the large-product "
            "matrix rate."),
    ]


def model_params(run: PublishedMoE) -> tuple[float, float, float]:
    """(total, active, routed experts') parameters: as stated, else counted from the
    widths (attention's Q, K, V, O; gated experts; the router; untied embedding and
    head). Routed: moe_layers x E x 3 d d_ff, always counted."""
    h, q = run.hidden, run.heads * run.head_dim
    routed = run.moe_layers * run.experts * 3 * h * run.d_ff
    if run.stated_params:
        return (*run.stated_params, routed)
    attention = 2 * h * q + 2 * h * run.kv_heads * run.head_dim
    shared = 3 * h * run.shared_ff + h * run.experts
    total = run.layers * attention + run.moe_layers * shared + routed + 2 * run.vocab * h
    active = total - routed + run.moe_layers * run.top_k * 3 * h * run.d_ff
    return total, active, routed


@dataclass(frozen=True)
class MoERow:
    """One published run, PREDICTED per GPU and step: all-to-all GB handed (comm's count)
    and sent, its seconds with the EP group in one NVLink domain, as run (packed 8 a
    node) and one rank a node (InfiniBand only), compute seconds, the step, the
    weights' and optimizer's GB (ZeRO-1), and the published figure against ours."""

    id: str
    layout: str
    all_to_all_gb: float
    sent_gb: float
    nvlink_s: float
    as_run_s: float
    infiniband_s: float
    compute_s: float
    step_s: float
    states_gb: float
    metric: str
    predicted: float
    published: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.published

    def __str__(self) -> str:
        fmt = "{:.1%}" if self.metric == "MFU" else "{:,.0f}"
        return (f"{self.id:<15} {self.layout:<24} {self.all_to_all_gb:>7.1f} "
                f"{self.sent_gb:>7.1f} {self.nvlink_s:>7.2f} {self.as_run_s:>7.2f} "
                f"{self.infiniband_s:>7.2f} {self.compute_s:>7.2f} {self.step_s:>7.2f} "
                f"{self.states_gb:>6.1f}  {self.metric}: PREDICTED {fmt.format(self.predicted)}"
                f", published {fmt.format(self.published)}, ratio {self.ratio:.2f}")


HEADER = (f"{'PREDICTED run':<15} {'layout':<24} {'a2a GB':>7} {'sent GB':>7} "
          f"{'NVL s':>7} {'run s':>7} {'IB s':>7} {'comp s':>7} {'step s':>7} {'st GB':>6}")


def _cluster(run: PublishedMoE) -> Cluster:
    """DGX H100-like nodes; NVLink at the run's peak each way, derated as the presets."""
    base = h100_infiniband(max(2, math.ceil(run.gpus / 8)))
    return replace(base, intra=Link(base.intra.latency_s, SUSTAINED_LINK * run.nvlink_Bps))


def predict(run: PublishedMoE) -> MoERow:
    """The run's row (``MoERow``): each GPU's tokens per MoE layer are the step's tokens
    over the gpus / pp ranks of a stage (sequence parallel splits them over tp); compute
    is 6 N_active + 12 l (heads d_head) s FLOPs a token (PaLM's count, Chowdhery et al.
    2022, appendix B) at the H100's achievable matrix rate; the step is compute plus the
    all-to-alls as run, stretched by the 1F1B bubble (pp - 1)/m, m micro-batches of one
    sequence per pipeline."""
    cluster = _cluster(run)
    tokens_step = run.global_batch * run.seq
    dp_attention = run.gpus // (run.tp * run.pp)
    dp_expert = run.gpus // (run.ep * run.pp)
    layer = moe_layer(run.id, tokens_step * run.pp // run.gpus, run.hidden, run.d_ff,
                      run.experts, run.top_k, gated=True, act_bytes=2,
                      capacity_factor=run.capacity_factor)
    stage = run.moe_layers / run.pp

    def a2a(c: Cluster, stride: int = 1) -> dict:
        return expert_parallel(layer, run.ep, cluster=c, dp=dp_expert, layers=stage,
                               stride=stride)

    as_run = a2a(cluster)
    one_domain = replace(cluster, devices_per_node=max(cluster.devices_per_node, run.ep))
    nvlink = a2a(one_domain)["seconds"]["all_to_all"]
    infiniband = a2a(cluster, cluster.devices_per_node)["seconds"]["all_to_all"]
    total, active, routed = model_params(run)
    per_token = 6 * active + 12 * run.layers * run.heads * run.head_dim * run.seq
    flops_gpu = per_token * tokens_step / run.gpus
    compute = flops_gpu / MAX_ACHIEVABLE["H100"]
    bubble = 1 + (run.pp - 1) / (run.global_batch / dp_attention)
    step = (compute + as_run["seconds"]["all_to_all"]) * bubble
    if run.metric == "MFU":
        predicted = flops_gpu / (step * PEAK_BF16)
    else:
        predicted = step * run.gpus / 3600 * 1e12 / tokens_step
    # ZeRO-1: weights and gradients (2 + 2 bytes) whole, Adam's 12 shared over the dp
    # ranks that hold the same weights (Rajbhandari et al. 2020)
    dense = (total - routed) / (run.tp * run.pp) * (4 + 12 / dp_attention)
    experts = routed / (run.ep * run.pp) * (4 + 12 / dp_expert)
    layout = f"EP{run.ep} TP{run.tp} PP{run.pp} DP{dp_attention}"
    return MoERow(run.id, layout, as_run["bytes"]["all_to_all"] / GB,
                  as_run["sent"]["all_to_all"] / GB, nvlink, as_run["seconds"]["all_to_all"],
                  infiniband, compute, step, (dense + experts) / GB, run.metric, predicted,
                  run.value)


def published_moe_rows() -> list[MoERow]:
    """PREDICTED rows for every published MoE run (``published_runs``)."""
    return [predict(run) for run in published_runs()]


def lines() -> list[str]:
    """The rows as text, with their sources: GB and seconds per GPU and step."""
    out = ["Expert parallelism, published runs (PREDICTED per GPU and step; a2a: all-to-all "
           "bytes handed over, sent: on the wire; NVL / run / IB: their seconds with the EP "
           "group in one NVLink domain, as run, one rank a node; st GB: weights, gradients "
           "and ZeRO-1 Adam state)", HEADER]
    for run, row in zip(published_runs(), published_moe_rows()):
        out += [str(row), f"    {run.title}. {run.cite}. {run.note}"]
    return out
