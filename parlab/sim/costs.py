"""What one layer costs: a network as a list of layers, and the seconds each pass takes.

A :class:`Network` lists its layers with the few numbers the timelines need, per
*sample* (a row of the batch, or one sequence): parameters, forward FLOPs, the elements
of the activation handed to the next layer, the elements kept for the backward pass,
and the bytes its element-wise work reads and writes.

The seconds come from one of two sources, both answering ``forward_s(layer, batch,
shard)``, ``backward_s(...)`` and ``update_s(params)``:

* :class:`Roofline`: from a device's sustained FLOP/s and memory bandwidth. A pass
  takes ``max(flops / rate, bytes / bandwidth)`` for its matrix products (the roofline,
  Williams, Waterman & Patterson, 2009), plus the bytes of its element-wise work over
  the bandwidth, plus a fixed cost per pass (launching kernels, Python). Backward: twice
  the forward's FLOPs and bytes (a gradient for the input and one for the weights).
* :class:`Measured`: seconds measured here, per layer at one batch size (or fitted over
  two: a fixed part per pass and a part per sample). ``from_timeline`` turns a measured
  single-device Timeline into them.

``shard`` is the tensor-parallel degree: matrix products and the element-wise work on
sliced activations divide by it; the fixed cost and the ``replicated_bytes`` (layer
norms, dropout, residual adds that Megatron-LM repeats on every rank) do not.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import counted
from ..metrics import fit_line
from .checks import amount, count


# ------------------------------------------------------------------ the network
@dataclass(frozen=True)
class Layer:
    """One layer (or block), per sample. ``flops``: its forward matrix products."""

    name: str
    params: int
    flops: float
    out_elems: float                 # the activation handed on (what a stage sends)
    saved_elems: float               # kept for the backward pass
    elementwise_bytes: float = 0.0   # read + written by element-wise work, split by tp
    replicated_bytes: float = 0.0    # read + written by work every tp rank repeats
    tp_all_reduces: int = 0          # a Megatron block: all-reduces of its output per pass
                                     # (0: a plain linear layer, paired column-then-row)

    def __post_init__(self):
        owner = f"Layer {self.name!r}"
        count(owner, "params", self.params, minimum=0)
        count(owner, "tp_all_reduces", self.tp_all_reduces, minimum=0)
        for name in ("flops", "out_elems", "saved_elems", "elementwise_bytes",
                     "replicated_bytes"):
            amount(owner, name, getattr(self, name))


@dataclass(frozen=True)
class Network:
    """A model as a sequence of layers, and how many bytes its numbers take.

    act_bytes: one activation element (4 float32, 2 fp16). state: bytes per parameter
    on a device without ZeRO, split as {"params", "grads", "optimizer"}: plain SGD in
    float32 is 4 + 4 + 0; Adam in mixed precision 2 + 2 + 12 (fp16 weights and
    gradients; fp32 master weights, momentum and variance: Rajbhandari et al., ZeRO,
    2020, section 3.1, "16 bytes per parameter"). grad_wire_bytes: a gradient as data
    parallel sends it. update_bytes: bytes the optimizer step reads and writes per
    parameter.
    """

    name: str
    layers: tuple
    in_elems: float
    act_bytes: int = 4
    state: dict = field(default_factory=lambda: {"params": 4, "grads": 4, "optimizer": 0})
    grad_wire_bytes: int = 4
    update_bytes: float = 12.0

    def __post_init__(self):
        owner = f"Network {self.name!r}"
        if not self.layers or not all(isinstance(x, Layer) for x in self.layers):
            raise ValueError(f"{owner}: layers must be a non-empty tuple of Layer, got "
                             f"{self.layers!r}")
        amount(owner, "in_elems", self.in_elems)
        amount(owner, "act_bytes", self.act_bytes, unit="bytes", positive=True)
        amount(owner, "grad_wire_bytes", self.grad_wire_bytes, unit="bytes")
        amount(owner, "update_bytes", self.update_bytes, unit="bytes")
        for part in ("params", "grads", "optimizer"):
            amount(owner, f"state[{part!r}]", self.state.get(part), unit="bytes")

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    @classmethod
    def mlp(cls, sizes, *, optimizer: str = "sgd", name: str | None = None) -> "Network":
        """The course's MLP: Linear layers (each with its ReLU) in float32.

        A Linear a -> b: a b + b parameters, 2 a b FLOPs forward per sample; it keeps
        its input (and the ReLU its output) for the backward pass. optimizer: "sgd"
        (4 + 4 bytes per parameter) or "adam" (+ 8 for the two moments, float32).
        """
        sizes = tuple(counted(s, "a layer width") for s in sizes)
        if len(sizes) < 2:
            raise ValueError(f"an MLP needs an input and an output width, got sizes={sizes}")
        layers = tuple(
            Layer(f"linear{k}", a * b + b, 2.0 * a * b, out_elems=b, saved_elems=a + b,
                  elementwise_bytes=4.0 * 2 * b)            # ReLU: read and write b floats
            for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])))
        adam = {"sgd": False, "adam": True}.get(optimizer)
        if adam is None:
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        state = {"params": 4, "grads": 4, "optimizer": 8 if adam else 0}
        return cls(name or f"MLP {'-'.join(map(str, sizes))}", layers, sizes[0], 4, state,
                   grad_wire_bytes=4, update_bytes=28.0 if adam else 12.0)

    @classmethod
    def transformer(cls, name: str, layers: int, hidden: int, heads: int, seq: int,
                    vocab: int = 0) -> "Network":
        """A GPT-style decoder in mixed precision with Adam; a sample = one sequence.

        Per block: 12 h^2 parameters; forward FLOPs 24 s h^2 (the four projections and
        the MLP) + 4 s^2 h (scores and their use) (Narayanan et al., 2021, eq. 3, /3
        for the forward alone); kept for backward s h (34 + 5 a s / h) bytes
        (Korthikanti et al., 2022, eq. 1). Element-wise: softmax and dropout over a s^2
        scores and GeLU over 4 s h split by tp; two layer norms, two dropouts and two
        residual adds over s h repeated on every tp rank (what sequence parallelism
        later removed). Under tensor parallelism a block all-reduces its s h output twice
        forward and its input's gradient twice backward (Shoeybi et al., 2019, fig. 4).
        The embedding (vocab h) is a layer of its own when vocab > 0.
        """
        s, h, a = seq, hidden, heads
        block = Layer("block", 12 * h * h + 13 * h, 24.0 * s * h * h + 4.0 * s * s * h,
                      out_elems=s * h, saved_elems=s * h * (34 + 5 * a * s / h) / 2,
                      elementwise_bytes=2.0 * (3 * 2 * a * s * s + 2 * 4 * s * h),
                      replicated_bytes=2.0 * (2 * 2 + 2 * 2 + 2 * 3) * s * h,
                      tp_all_reduces=2)
        body = tuple(Layer(f"block{k}", block.params, block.flops, block.out_elems,
                           block.saved_elems, block.elementwise_bytes, block.replicated_bytes,
                           block.tp_all_reduces)
                     for k in range(counted(layers, "layers")))
        if vocab:       # its matrix also gives the logits: 2 s h V FLOPs, sliced by vocab
            head = Layer("embedding", vocab * h, 2.0 * s * h * vocab, out_elems=s * h,
                         saved_elems=s * h, tp_all_reduces=1)
            body = (head, *body)
        return cls(name, body, s * h, 2, {"params": 2, "grads": 2, "optimizer": 12},
                   grad_wire_bytes=2, update_bytes=32.0)


# ------------------------------------------------------------------ where the seconds come from
class Roofline:
    """Seconds per pass from a device's sustained FLOP/s and memory bandwidth.

    cluster: anything with ``flops`` (sustained FLOP/s), ``memory_bandwidth_Bps``
    (sustained) and ``layer_overhead_s`` (fixed cost of one layer's pass), e.g. a
    ``sim.Cluster``.
    """

    source = "roofline"

    def __init__(self, net: Network, cluster):
        self.net, self.cluster = net, cluster

    def _pass_s(self, i: int, batch: float, shard: int, factor: float) -> float:
        layer, c, ab = self.net.layers[i], self.cluster, self.net.act_bytes
        matmul_bytes = (layer.params * ab + (layer.out_elems + _in_elems(self.net, i))
                        * batch * ab) / shard
        matmul = max(layer.flops * batch / shard / c.flops, matmul_bytes / c.memory_bandwidth_Bps)
        elementwise = (layer.elementwise_bytes / shard + layer.replicated_bytes) * batch
        return c.layer_overhead_s + factor * (matmul + elementwise / c.memory_bandwidth_Bps)

    def forward_s(self, i: int, batch: float, shard: int = 1) -> float:
        return self._pass_s(i, batch, shard, 1.0)

    def backward_s(self, i: int, batch: float, shard: int = 1) -> float:
        return self._pass_s(i, batch, shard, 2.0)

    def update_s(self, params: float) -> float:
        return self.cluster.layer_overhead_s + params * self.net.update_bytes / \
            self.cluster.memory_bandwidth_Bps


def _in_elems(net: Network, i: int) -> float:
    return net.in_elems if i == 0 else net.layers[i - 1].out_elems


@dataclass(frozen=True)
class Measured:
    """Seconds per pass measured here: per layer, for ``batch`` samples.

    fixed_s: the part of each layer's pass that does not grow with the batch or shrink
    with tp (0 when only one batch size was measured). update_s: the optimizer step of
    the whole model; a device holding a share of the parameters takes that share.
    """

    forward: tuple
    backward: tuple
    update: float
    batch: int
    params: int
    fixed_s: float = 0.0
    source: str = "measured"

    def _scaled(self, t: float, batch: float, shard: int) -> float:
        return self.fixed_s + max(t - self.fixed_s, 0.0) * batch / self.batch / shard

    def forward_s(self, i: int, batch: float, shard: int = 1) -> float:
        return self._scaled(self.forward[i], batch, shard)

    def backward_s(self, i: int, batch: float, shard: int = 1) -> float:
        return self._scaled(self.backward[i], batch, shard)

    def update_s(self, params: float) -> float:
        return self.update * params / max(self.params, 1)

    @classmethod
    def from_timeline(cls, timelines, net: Network, *, rank: int | None = None,
                      skip: int = 1, cluster=None) -> "Measured":
        """Per-layer costs from measured single-device timelines (lab 01's step).

        timelines: {batch size: Timeline} with "forward", "backward" and "update" spans
        per step. Each phase's median over the steps after the first ``skip`` is shared
        among the layers in proportion to their roofline time (``cluster``'s rates; by
        FLOPs if none is given): the timeline times the whole pass, not each layer.
        With two or more batch sizes, a straight line through each phase's times gives
        the fixed part (its intercept, shared equally by the layers' passes).
        """
        if not isinstance(timelines, dict) or not timelines:
            raise ValueError("give {batch size: measured Timeline}, e.g. {64: run.timeline}")
        phases = {b: _median_phases(tl, rank, skip) for b, tl in timelines.items()}
        batches = sorted(phases)
        ref = batches[-1]
        fixed = 0.0
        if len(batches) > 1:
            intercepts = [fit_line(batches, [phases[b][p] for b in batches])[1]
                          for p in ("forward", "backward")]
            fixed = max(sum(intercepts) / (2 * len(net)), 0.0)
            # noise can make the intercept exceed a measured pass: keep both parts >= 0
            fixed = min(fixed, min(phases[ref]["forward"], phases[ref]["backward"]) / len(net))
        weights = _layer_weights(net, cluster, ref)
        share = [w / sum(weights) for w in weights]
        n = len(net)
        fwd = tuple(fixed + (phases[ref]["forward"] - n * fixed) * s for s in share)
        bwd = tuple(fixed + (phases[ref]["backward"] - n * fixed) * s for s in share)
        return cls(fwd, bwd, phases[ref]["update"], ref, net.params, fixed,
                   source=f"measured at batch {', '.join(map(str, batches))}")


def _median_phases(timeline, rank, skip: int) -> dict:
    from ..steps import median_phase
    rank = timeline.ranks[0] if rank is None else rank
    try:
        return {p: median_phase(timeline, p, rank, skip) for p in ("forward", "backward", "update")}
    except ValueError as exc:
        raise ValueError(f"{exc}: give a single-device step timeline (lab 01's "
                         "step_timeline)") from None


def _layer_weights(net: Network, cluster, batch: int) -> list[float]:
    if cluster is None:
        return [max(layer.flops, 1.0) for layer in net.layers]
    from dataclasses import replace
    rates = Roofline(net, replace(cluster, layer_overhead_s=0.0))
    return [rates.forward_s(i, batch) for i in range(len(net))]
