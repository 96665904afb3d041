"""The cost model's inputs: clusters (devices and links), workloads, calibration, presets.

The summary model that turns them into one number per part of a step (compute, bubble,
tp, pp, dp) is ``sim.summary`` (``predict``, ``Plan``; importable from here as before);
``sim.timelines`` draws timelines; the links, clusters and closed forms here serve both.

Everything here is a PREDICTION, from a handful of numbers about a model and a cluster;
labs print and plot it labelled as such, next to what was measured where they can.

Communication follows the alpha-beta (Hockney) model: a message of S bytes over a link
of latency alpha and bandwidth beta takes alpha + S / beta. A ring all-reduce over n
ranks takes 2(n - 1) steps, each moving S / n bytes (Patarasuk & Yuan, 2009; Thakur,
Rabenseifner & Gropp, 2005):

    t_all_reduce(S, n) = 2(n - 1) alpha + 2(n - 1)/n * S / beta

Compute takes flops / rate plus a fixed cost per layer and pass (launching kernels,
Python). A pipeline of p stages and m micro-batches idles a share (p - 1)/(m + p - 1)
of its time (GPipe, Huang et al., 2019).

Mesh axes are laid out as in ``parlab.mesh``: the last axis varies fastest, so its
groups are neighbouring devices. An axis uses the fast link (inside a node) when its
group, together with every faster axis, fits in one node; otherwise the slow one.

Framework-free: no torch, no tensorflow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..metrics import fit_link, pipeline_bubble
from .calibrate import fit_compute
from .checks import amount, count
from .gemm import MatrixUnit
from .links import Link, all_reduce_s, send_s  # noqa: F401 (sim.model.Link, as before)
# the summary model's plans and predictions live in sim.summary (importable from here too)
from .summary import AXES, Plan, Prediction, plans, predict  # noqa: F401


# ------------------------------------------------------------------ links and collectives
# Link, send_s and all_reduce_s live in sim.links (sim.collectives builds on them)


def bubble(stages: int, micro_batches: int) -> float:
    """Idle share of a GPipe / 1F1B pipeline: (p - 1)/(m + p - 1)."""
    return pipeline_bubble(count("bubble", "stages", stages),
                           count("bubble", "micro_batches", micro_batches))


# ------------------------------------------------------------------ what runs, and where
@dataclass(frozen=True)
class Cluster:
    """Devices and the links between them, as the cost model sees them."""

    name: str
    devices: int
    memory_bytes: float             # per device
    flops: float                    # sustained FLOP/s per device (not the datasheet peak)
    layer_overhead_s: float         # fixed cost of one layer's forward or backward pass
    devices_per_node: int
    intra: Link                     # between devices of one node
    inter: Link                     # between nodes
    collective_overhead_s: float = 0.0   # software cost of one collective call
    memory_bandwidth_Bps: float = math.inf   # sustained, per device: the roofline's slope
    wake_latency_s: float = 0.0     # a rank that blocked on a peer resumes this late (CPU)
    # measured (seconds blocked, seconds late) points: a receive's wake-up by how long it
    # blocked (sim.engine.wake_after); empty: wake_latency_s after any block
    wake_curve: tuple = ()
    # measured (before, after): a background collective (a DDP bucket's all-reduce) starts
    # this long after it is posted (the bucket filled, the hook called) and its result
    # reaches the waiting rank this long after it ends (copied back, the thread woken);
    # empty: neither (sim.engine)
    handoff_s: tuple = ()
    # measured: the share of isends whose data waited for its sender's core until the
    # sender blocked (its gloo thread shares the pinned core); 0: none (the presets).
    # sim.shared_cores.held_s
    held_send_share: float = 0.0
    # measured (forward, backward): what a data-parallel wrapper (DDP) adds to a step's
    # passes beyond the model's own work: its forward hooks (the reducer's preparation)
    # and its gradient hooks (each gradient marked ready, copied into its bucket); paid by
    # data parallelism with overlapped buckets (sim.program). Empty: nothing (the presets:
    # beside their models' passes it is lost)
    ddp_wrapper_s: tuple = ()
    # measured: what a collective inside a pass costs its rank beyond the collective (the
    # autograd function that calls it, resuming with cold caches after it): paid after
    # each tensor-parallel collective (sim.stage). 0: nothing (the presets)
    tp_operator_s: float = 0.0
    cores: int = 0                  # processors the devices share (0: each its own, GPUs)
    matrix: MatrixUnit | None = None    # prices matrix products by shape (sim.gemm); None:
                                        # flops for all of them
    fp8_matrix: MatrixUnit | None = None  # 8-bit float products (Hopper on); None: none
    nics_per_node: int = 0          # network cards a node's collectives spread over (0: one
                                    # per device, as DGX nodes have); sim.collectives
    nvls: bool = False              # NVLink SHARP: the NVSwitch reduces (H100 nodes)
    # How far messages measured here strayed from their price (seconds beyond it, one per
    # measured message, negative where quicker): the engine draws each message's from
    # these (sim.engine). Empty: every message at its price, as on the presets.
    message_spread_s: tuple = field(default=(), repr=False)     # point to point, against
                                                                # alpha + S / beta
    collective_spread_s: tuple = field(default=(), repr=False)  # all-reduces, against the
                                                                # ring and the overhead

    def __post_init__(self):
        owner = f"Cluster {self.name!r}"
        count(owner, "devices", self.devices)
        count(owner, "devices_per_node", self.devices_per_node)
        count(owner, "cores", self.cores, minimum=0)
        count(owner, "nics_per_node", self.nics_per_node, minimum=0)
        amount(owner, "memory_bytes", self.memory_bytes, unit="bytes", positive=True,
               infinite=True)
        amount(owner, "flops", self.flops, unit="FLOP/s", positive=True, infinite=True)
        amount(owner, "memory_bandwidth_Bps", self.memory_bandwidth_Bps,
               unit="bytes per second", positive=True, infinite=True)
        for name in ("layer_overhead_s", "collective_overhead_s", "wake_latency_s",
                     "tp_operator_s"):
            amount(owner, name, getattr(self, name), unit="seconds")
        if not isinstance(self.wake_curve, tuple) or not all(
                isinstance(p, tuple) and len(p) == 2 and all(
                    isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in p)
                for p in self.wake_curve):
            raise ValueError(f"{owner}: wake_curve must be a tuple of (seconds blocked, seconds "
                             f"late) pairs, both >= 0, got {self.wake_curve!r}")
        if not (isinstance(self.held_send_share, (int, float))
                and not isinstance(self.held_send_share, bool)
                and 0.0 <= self.held_send_share <= 1.0):
            raise ValueError(f"{owner}: held_send_share is a share of the sends, from 0 to 1, "
                             f"got {self.held_send_share!r}")
        for name, pair in (("handoff_s", "seconds before, seconds after"),
                           ("ddp_wrapper_s", "forward seconds, backward seconds")):
            value = getattr(self, name)
            if not isinstance(value, tuple) or len(value) not in (0, 2) or not all(
                    isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in value):
                raise ValueError(f"{owner}: {name} must be () or ({pair}), both >= 0, "
                                 f"got {value!r}")
        for name in ("message_spread_s", "collective_spread_s"):
            spread = getattr(self, name)
            if not isinstance(spread, tuple) or not all(
                    isinstance(x, (int, float)) and math.isfinite(x) for x in spread):
                raise ValueError(f"{owner}: {name} must be a tuple of seconds (finite numbers, "
                                 f"one per measured message), got {spread!r}")
        if self.matrix is not None and not isinstance(self.matrix, MatrixUnit):
            raise ValueError(f"{owner}: matrix must be a sim.gemm.MatrixUnit or None, got "
                             f"{self.matrix!r}")
        # the matrix unit prices every matrix product by its shape: a flops set apart from
        # its rate would change (next to) nothing, silently
        if self.matrix is not None and not math.isclose(self.flops, self.matrix.rate,
                                                        rel_tol=1e-9):
            raise ValueError(
                f"{owner}: flops={self.flops:.4g} but its matrix unit's rate is "
                f"{self.matrix.rate:.4g} FLOP/s, and the unit prices every matrix product, so "
                f"flops alone changes nothing: set both, replace(cluster, flops=R, "
                f"matrix=replace(cluster.matrix, rate=R)), or matrix=None to price every "
                f"product at flops")
        for name in ("intra", "inter"):
            if not isinstance(getattr(self, name), Link):
                raise ValueError(f"{owner}: {name} must be a Link(latency_s, bandwidth_Bps), "
                                 f"got {getattr(self, name)!r}")

    def link(self, group_span: int) -> Link:
        """The link a group uses when it spans ``group_span`` consecutive devices."""
        return self.intra if group_span <= self.devices_per_node else self.inter


@dataclass(frozen=True)
class Workload:
    """A model and its training step, in the few numbers the cost model needs.

    Per *sample* (a row of the batch, or one sequence of a language model):
    flops (forward + backward), activations kept for the backward pass (split by tensor
    parallel, and not split), the activation handed from one layer to the next (what a
    pipeline stage sends), and the bytes tensor parallel all-reduces in a step.
    """

    name: str
    params: float
    layers: int                     # layers (blocks): where tp exchanges, what pp cuts
    flops_per_sample: float
    act_split_bytes: float          # per sample, divided among tp ranks
    act_whole_bytes: float          # per sample, held whole by every tp rank
    boundary_bytes: float           # per sample, between two consecutive layers
    tp_bytes: float                 # per sample, all-reduced per step over tp
    tp_messages: int                # all-reduces per step (per micro-batch) over tp
    state_bytes_per_param: float    # weights + gradients + optimizer state
    grad_bytes_per_param: float     # a gradient on the wire (data parallel)
    dp_messages: int = 1            # all-reduces per step over dp (1: one bucket)
    network: object = field(default=None, compare=False, repr=False)   # what it summarises

    def __post_init__(self):
        owner = f"Workload {self.name!r}"
        count(owner, "layers", self.layers)
        count(owner, "tp_messages", self.tp_messages, minimum=0)
        count(owner, "dp_messages", self.dp_messages)
        for name in ("params", "flops_per_sample", "act_split_bytes", "act_whole_bytes",
                     "boundary_bytes", "tp_bytes", "state_bytes_per_param",
                     "grad_bytes_per_param"):
            amount(owner, name, getattr(self, name))

    @classmethod
    def of(cls, net, *, dp_messages: int = 1, name: str | None = None) -> "Workload":
        """The summary of a ``Network`` (``sim.network``): one accounting for both models.

        params, the state's and a gradient's bytes: the network's. flops: 3x the forward
        matrix work (forward, and the two products of the backward), plus what
        recomputation runs again (``net.recompute``: the whole forward, or attention's
        products). Activations: what each layer keeps (``Network.kept_elems``), its
        tp-sliced part and the part every tp rank holds whole (split too under sequence
        parallelism; full recomputation keeps each layer's input). boundary: the largest
        cut (skip connections included). tp: Megatron blocks all-reduce their output per
        pass, ``tp_all_reduces`` times forward and backward (not the first layer's input
        gradient); plain layers pair column-then-row, the output of each pair
        all-reduced forward and (but for the first pair) the input's gradient backward.
        """
        ab, layers = net.act_bytes, net.layers
        flops = 3 * sum(x.flops for x in layers)
        if net.recompute == "full":
            flops += sum(x.flops for x in layers)
        elif net.recompute == "selective":
            flops += sum(g.flops for x in layers for g in x.gemms if not g.weights)
        split = sum(net.kept_elems(i, 1, 1) for i in range(len(net)))
        whole = sum(x.saved_replicated_elems for x in layers)
        if net.sequence_parallel or net.recompute == "full":
            whole = 0.0          # split with the rest, or (full) only the inputs are kept
            if net.recompute == "full" and not net.sequence_parallel:
                split, whole = 0.0, sum(net.out_elems(i - 1) for i in range(len(net)))
        else:
            split -= whole
        cuts = [net.cut_elems(at) for at in range(1, len(net))] or [net.in_elems]
        tp_elems, tp_messages = _tp_exchanges(net)
        return cls(name or net.name, net.params, len(net), flops_per_sample=flops,
                   act_split_bytes=split * ab, act_whole_bytes=whole * ab,
                   boundary_bytes=max(cuts) * ab, tp_bytes=tp_elems * ab,
                   tp_messages=tp_messages, state_bytes_per_param=sum(net.state.values()),
                   grad_bytes_per_param=net.grad_wire_bytes, dp_messages=dp_messages,
                   network=net)

    @classmethod
    def mlp(cls, sizes, *, dp_messages: int = 1, name: str | None = None):
        """The course's MLP (Linear/ReLU stack) in float32 trained with plain SGD:
        ``Workload.of(Network.mlp(sizes))``. dp_messages: one bucket per step (lab 05's
        ``average_gradients`` sends one per tensor: 2 per layer)."""
        from .network import Network
        return cls.of(Network.mlp(sizes, name=name), dp_messages=dp_messages)

    @classmethod
    def transformer(cls, name: str, layers: int, hidden: int, heads: int, seq: int,
                    vocab: int = 50257):
        """A GPT-style decoder trained in mixed precision with Adam; a sample = a sequence:
        ``Workload.of(Network.transformer(...))`` (its blocks: ``sim.blocks``; per layer
        and sequence s h (34 + 5 a s / h) bytes kept, 10 s h of them whole on every tp
        rank, Korthikanti et al., 2022, eq. 1; 16 bytes of state a parameter)."""
        from .network import Network
        return cls.of(Network.transformer(name, layers, hidden, heads, seq, vocab))


def _tp_exchanges(net) -> tuple[float, int]:
    """(elements all-reduced over tp per sample and step, how many all-reduces): see
    ``Workload.of``."""
    elems, messages = 0.0, 0
    paired = [i for i, x in enumerate(net.layers) if not x.tp_all_reduces]
    for i, x in enumerate(net.layers):
        if x.tp_all_reduces:
            backward = x.tp_all_reduces if i > 0 else 0
            elems += x.tp_all_reduces * x.out_elems + backward * net.out_elems(i - 1)
            messages += x.tp_all_reduces + backward
    for k, i in enumerate(paired):
        if k % 2 == 1:                              # a row-parallel layer's output
            elems, messages = elems + net.layers[i].out_elems, messages + 1
        elif k > 0 and k + 1 < len(paired):        # a column-parallel layer's input gradient
            elems, messages = elems + net.out_elems(i - 1), messages + 1
    return elems, messages


# ------------------------------------------------------------------ calibration
def calibrated(measured: dict, sizes, *, name: str = "this machine", devices: int = 4,
               memory_bytes: float = 8e9) -> Cluster:
    """A cluster from costs measured here (``parlab.torch.hybrid.calibrate``'s result).

    compute: one dense MLP step at two or more batch sizes: a straight line through
        them (least squares) gives the rate (the slope) and the fixed cost per layer pass
        (the intercept / 2 passes / layers).
    link: one message between two ranks takes alpha + S / beta: a straight line through
        the message sizes (``metrics.fit_link``).
    collective overhead: what an all-reduce within a pair costs beyond the ring model
        on that link (2 alpha + S / beta for n = 2), the median over the sizes: the
        library's own work per call (on CPU, gloo's).
    Every device here talks over the same loopback, so intra and inter are one link.
    """
    w = Workload.mlp(sizes)
    if not isinstance(measured, dict) or not {"compute", "send", "all_reduce"} <= set(measured):
        raise ValueError("calibrated: measured needs 'compute' ({batch: seconds of a step}), "
                         "'send' ({bytes: seconds}) and 'all_reduce' ({2: {bytes: seconds}}), "
                         f"got {sorted(measured) if isinstance(measured, dict) else measured!r}")
    pairs = measured["all_reduce"]
    if not isinstance(pairs, dict) or 2 not in pairs:
        raise ValueError("calibrated: measured['all_reduce'] needs the all-reduces of two "
                         "ranks under key 2 ({2: {bytes: seconds}}), got "
                         f"{sorted(pairs) if isinstance(pairs, dict) else pairs!r}")
    _timings("calibrated", "measured['compute']", measured["compute"], 2, "batch")
    _timings("calibrated", "measured['send']", measured["send"], 2)
    _timings("calibrated", "measured['all_reduce'][2]", pairs[2], 1)
    batches = sorted(measured["compute"])
    xs = [w.flops_per_sample * bt for bt in batches]
    ys = [measured["compute"][bt] for bt in batches]
    rate, per_pass = fit_compute(xs, ys, w.layers)
    link, overhead = measured_link(measured["send"], measured["all_reduce"][2])
    return Cluster(name, devices, memory_bytes, flops=rate, layer_overhead_s=per_pass,
                   devices_per_node=devices, intra=link, inter=link,
                   collective_overhead_s=overhead)


def measured_link(sends: dict, pair_all_reduces: dict) -> tuple[Link, float]:
    """(link, collective overhead) from message times measured here (``calibrated``).

    sends: {bytes: seconds of one message}: a straight line alpha + S / beta through
    them (``metrics.fit_link``). pair_all_reduces: {bytes: seconds of an all-reduce of
    two ranks}: what each costs beyond the ring model on that link, the median over the
    sizes, is the library's own work per call.
    """
    _timings("measured_link", "sends", sends, 2)
    _timings("measured_link", "pair_all_reduces", pair_all_reduces, 1)
    fit = fit_link(list(sends), list(sends.values()))
    link = Link(fit.latency_s, fit.bandwidth_Bps)
    extra = sorted(t - all_reduce_s(size, 2, link) for size, t in pair_all_reduces.items())
    return link, max(extra[len(extra) // 2], 0.0)


def _timings(owner: str, name: str, timed, least: int, key: str = "bytes") -> None:
    """``timed`` must be {size: seconds} with ``least`` entries or more, every size a
    number >= 0 and every time a finite number > 0: a NaN reaches the least-squares fit as
    LAPACK's noise and a bare LinAlgError, naming nothing."""
    if not isinstance(timed, dict) or len(timed) < least:
        raise ValueError(f"{owner}: {name} must be a dict {{{key}: seconds}} with at least "
                         f"{least} entr{'y' if least == 1 else 'ies'}, got {timed!r}")
    for size, seconds in timed.items():
        amount(owner, f"each key of {name}", size, unit=key)
        amount(owner, f"{name}[{size!r}]", seconds, unit="seconds", positive=True)


def with_links(c: Cluster, *, intra: Link | None = None, inter: Link | None = None,
               devices_per_node: int | None = None) -> Cluster:
    """The same cluster with other links (e.g. this machine's compute, GPU links)."""
    return replace(c, intra=intra or c.intra, inter=inter or c.inter,
                   devices_per_node=devices_per_node or c.devices_per_node)


# ------------------------------------------------------------------ presets
def presets() -> dict[str, Workload]:
    """Workloads for the explorer. GPT-2 XL: 48 layers, hidden 1600, 25 heads, 1024
    tokens (Radford et al., 2019, table 2: 1.5 billion parameters). GPT-3:
    96 layers, hidden 12288, 96 heads, 2048 tokens (Brown et al., 2020, table 2.1)."""
    return {
        "lab MLP 64-256-256-128-10": Workload.mlp((64, 256, 256, 128, 10)),
        "GPT-2 XL (1.5 B)": Workload.transformer("GPT-2 XL", 48, 1600, 25, 1024),
        "GPT-3 (175 B)": Workload.transformer("GPT-3", 96, 12288, 96, 2048),
    }
