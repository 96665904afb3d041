"""What one layer costs: the seconds each pass of a ``Network``'s layers takes.

The network and its layers are ``sim.network`` and ``sim.layers`` (re-exported here).

The seconds come from one of two sources, both answering ``forward_s(layer, batch,
shard)``, ``backward_s(...)`` and ``update_s(params)``:

* :class:`Roofline`: from a device's matrix rate and memory bandwidth. A pass takes
  its matrix products' time, plus the bytes of its element-wise work over the bandwidth,
  plus a fixed cost per pass (launching kernels, Python). On a device with a
  ``matrix`` unit (``sim.gemm.MatrixUnit``: the GPU presets) each product of the layer
  (``Layer.gemms``) is priced by its shape, tiles and waves, so a product sliced thin by
  tensor parallelism runs below the full rate; otherwise (or for a layer without
  ``gemms``) ``max(flops / rate, bytes / bandwidth)`` (the roofline, Williams, Waterman
  & Patterson, 2009). Backward: each product becomes two (a gradient for the input and
  one for the weights: twice the FLOPs), the element-wise bytes twice, plus what the
  layer recomputes there (``Layer.backward_gemms``: flash attention's scores).
* :class:`Measured`: seconds measured here, per layer at one batch size (or fitted over
  two: a fixed part per pass and a part per sample), and what each call of a pass costs
  whatever layers it runs (``call_s``). ``from_timeline`` turns a measured single-device
  Timeline into them.

``call_s`` (forward, backward, update): a rank pays the framework's own work once per
call of a pass, however few layers it holds: zeroing the gradients and the module call,
starting autograd's engine, the optimizer's step. Split over two ranks, lab 02's MLP
pays it twice: measured here in one process, the two halves' passes took 0.12 ms
(forward), 0.09 ms (backward) and 0.09 ms (update) longer than the whole MLP's, over
and above its layers. ``Roofline`` has none (its fixed cost is per layer).

``shard`` is the tensor-parallel degree: matrix products and the element-wise work on
sliced activations divide by it; the fixed cost and the ``replicated_bytes`` (layer
norms, dropout, residual adds that Megatron-LM repeats on every rank) do not.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..metrics import fit_line
from .gemm import layer_products, pass_s
from .layers import Gemm, Layer  # noqa: F401 (sim.costs.Layer, as before)
from .network import Network


# an FP8 product's operand, per element: its absolute maximum read (2 bytes), then read
# again and written in one byte (dynamic tensor-wise scaling, as torchao's Float8Linear)
CAST_BYTES = 2 + 2 + 1


# ------------------------------------------------------------------ where the seconds come from
class Roofline:
    """Seconds per pass from a device's sustained FLOP/s and memory bandwidth.

    cluster: anything with ``flops`` (sustained FLOP/s), ``memory_bandwidth_Bps``
    (sustained) and ``layer_overhead_s`` (fixed cost of one layer's pass), e.g. a
    ``sim.Cluster``; with a ``matrix`` unit, matrix products are priced by their shape.
    """

    source = "roofline"
    call_s = (0.0, 0.0, 0.0)

    def __init__(self, net: Network, cluster):
        self.net, self.cluster = net, cluster

    def _pass_s(self, i: int, batch: float, shard: int, factor: float) -> float:
        layer, c, ab = self.net.layers[i], self.cluster, self.net.act_bytes
        return c.layer_overhead_s + self._matmul_s(i, batch, shard, factor) + factor * (
            self._elementwise_bytes(layer, shard) * batch / c.memory_bandwidth_Bps)

    def _matmul_s(self, i: int, batch: float, shard: int, factor: float) -> float:
        layer, c, ab = self.net.layers[i], self.cluster, self.net.act_bytes
        unit = getattr(c, "matrix", None)
        again = layer.backward_gemms if factor > 1 else ()     # flash attention's scores
        if unit is not None and layer.gemms:
            if self.net.fp8 and layer.name != "head":
                return self._fp8_matmul_s(layer, batch, shard, factor > 1) + \
                    pass_s(unit, again, batch, shard, ab)
            return pass_s(unit, layer.gemms, batch, shard, ab, backward=factor > 1) + \
                pass_s(unit, again, batch, shard, ab)
        matmul_bytes = (layer.params * ab + (layer.out_elems + _in_elems(self.net, i))
                        * batch * ab) / shard
        return factor * max(layer.flops * batch / shard / c.flops,
                            matmul_bytes / c.memory_bandwidth_Bps) + \
            sum(g.flops for g in again) * batch / shard / c.flops

    def _fp8_matmul_s(self, layer, batch: float, shard: int, backward: bool) -> float:
        """Float8 training: the products with weights on the FP8 unit, 1-byte operands;
        attention's products 16-bit, and the logits' (the head: torchtitan's Float8 leaves
        the output layer out); before each FP8 product its operands are scaled by
        their absolute maximum and cast (per-tensor scaling, Micikevicius et al., 2022):
        CAST_BYTES per element (read for the maximum, read again and written as one byte)
        of the input and the weight forward, of the output's gradient backward."""
        c, ab = self.cluster, self.net.act_bytes
        fast = getattr(c, "fp8_matrix", None)
        if fast is None:
            raise ValueError(f"{getattr(c, 'name', c)!r} has no 8-bit float matrix rate "
                             f"(Cluster.fp8_matrix): train {self.net.name!r} with fp8=False, "
                             f"or use a cluster that has one (H100: sim.h100_nvlink)")
        weighted = tuple(g for g in layer.gemms if g.weights)
        plain = tuple(g for g in layer.gemms if not g.weights)
        cast = 0.0
        for g in weighted:
            for m, n, k, b, a_elems in layer_products(g, batch, shard):
                cast += m * n * b if backward else a_elems + k * n
        return (pass_s(fast, weighted, batch, shard, 1, backward=backward)
                + pass_s(c.matrix, plain, batch, shard, ab, backward=backward)
                + CAST_BYTES * cast / c.memory_bandwidth_Bps)

    def _elementwise_bytes(self, layer, shard: int) -> float:
        """Per sample: the element-wise work tp slices, and the work every tp rank repeats
        (split too under sequence parallelism)."""
        repeated = shard if self.net.sequence_parallel else 1
        return layer.elementwise_bytes / shard + layer.replicated_bytes / repeated

    def recompute_s(self, i: int, batch: float, shard: int = 1) -> float:
        """Selective recomputation of layer i: attention's products (those without
        weights) and element-wise work, forward, once more."""
        layer, c = self.net.layers[i], self.cluster
        if not layer.attention_elems:
            return 0.0
        unit = getattr(c, "matrix", None)
        scores = tuple(g for g in layer.gemms if not g.weights)
        if unit is not None and scores:
            matmul = pass_s(unit, scores, batch, shard, self.net.act_bytes)
        else:
            matmul = sum(g.flops for g in scores) * batch / shard / c.flops
        return c.layer_overhead_s + matmul + layer.attention_bytes * batch / shard / \
            c.memory_bandwidth_Bps

    def forward_s(self, i: int, batch: float, shard: int = 1) -> float:
        return self._pass_s(i, batch, shard, 1.0)

    def backward_s(self, i: int, batch: float, shard: int = 1) -> float:
        return self._pass_s(i, batch, shard, 2.0)

    def update_s(self, params: float) -> float:
        return self.cluster.layer_overhead_s + params * self.net.update_bytes / \
            self.cluster.memory_bandwidth_Bps

    def weight_grad_s(self, i: int, batch: float, shard: int = 1) -> float:
        """The part of ``backward_s`` that computes layer i's weights' gradient: the dB
        product of each product with weights. The rest (every dA, attention's products,
        the element-wise work, the fixed cost) is the input's gradient."""
        layer, c, ab = self.net.layers[i], self.cluster, self.net.act_bytes
        unit = getattr(c, "matrix", None)
        if unit is not None and layer.gemms:
            return pass_s(unit, layer.gemms, batch, shard, ab, backward=True, weights_only=True)
        flops = sum(g.flops for g in layer.gemms if g.weights) if layer.gemms else (
            layer.flops if layer.params else 0.0)
        share = flops / layer.flops if layer.flops else 0.0
        matmul_bytes = (layer.params * ab + (layer.out_elems + _in_elems(self.net, i))
                        * batch * ab) / shard
        return share * max(layer.flops * batch / shard / c.flops,
                           matmul_bytes / c.memory_bandwidth_Bps)


def weight_grad_s(costs, i: int, batch: float, shard: int = 1) -> float:
    """Seconds of layer i's weights' gradient, within its ``backward_s``: a split
    backward's W (Qi et al., 2024), whose B is the rest (the input's gradient). From the
    cost source where it prices the two apart (``Roofline``); else half the backward:
    each product of the forward becomes two of its FLOPs, one in B and one in W (Qi et
    al., 2024, section 2.3, table 1; their handcrafted schedules take B and W as equal)."""
    own = getattr(costs, "weight_grad_s", None)
    return own(i, batch, shard) if own is not None else costs.backward_s(i, batch, shard) / 2


def call_s(costs) -> tuple:
    """(forward, backward, update) seconds of each call of a pass (``Measured.call_s``);
    nothing for a cost source without one."""
    return getattr(costs, "call_s", (0.0, 0.0, 0.0))


def _in_elems(net: Network, i: int) -> float:
    return net.in_elems if i == 0 else net.layers[i - 1].out_elems


@dataclass(frozen=True)
class Measured:
    """Seconds per pass measured here: per layer, for ``batch`` samples.

    fixed_s: the part of each layer's pass that does not grow with the batch or shrink
    with tp (0 when only one batch size was measured). update_s: the optimizer step of
    the whole model; a device holding a share of the parameters takes that share of it
    beyond its call. call_s: (forward, backward, update) seconds of each call of a pass
    whatever its layers (the module doc): not in ``forward`` and ``backward`` (a rank adds
    it once per pass), in ``update`` (``update_s`` keeps it whole for any share).
    """

    forward: tuple
    backward: tuple
    update: float
    batch: int
    params: int
    fixed_s: float = 0.0
    source: str = "measured"
    call_s: tuple = (0.0, 0.0, 0.0)

    def _scaled(self, t: float, batch: float, shard: int) -> float:
        return self.fixed_s + max(t - self.fixed_s, 0.0) * batch / self.batch / shard

    def forward_s(self, i: int, batch: float, shard: int = 1) -> float:
        return self._scaled(self.forward[i], batch, shard)

    def backward_s(self, i: int, batch: float, shard: int = 1) -> float:
        return self._scaled(self.backward[i], batch, shard)

    def update_s(self, params: float) -> float:
        call = self.call_s[2]
        return call + (self.update - call) * params / max(self.params, 1)

    def recompute_s(self, i: int, batch: float, shard: int = 1) -> float:
        """Selective recomputation: nothing measured here has attention to recompute."""
        return 0.0

    @classmethod
    def from_timeline(cls, timelines, net: Network, *, rank: int | None = None,
                      skip: int = 1, cluster=None, calls=None) -> "Measured":
        """Per-layer costs from measured single-device timelines (lab 01's step).

        timelines: {batch size: Timeline} with "forward", "backward" and "update" spans
        per step. Each phase's median over the steps after the first ``skip`` is shared
        among the layers in proportion to their roofline time (``cluster``'s rates; by
        FLOPs if none is given): the timeline times the whole pass, not each layer.
        With two or more batch sizes, a straight line through each phase's times gives
        the fixed part (its intercept, shared equally by the layers' passes).

        calls: the same phases timed on a network of one tiny layer (a Timeline, as
        ``timelines``'): what a pass costs with next to no layer, its call (``call_s``),
        less one layer's fixed part; the layers' fixed part is then what the intercepts
        hold beyond the call, shared by the n layers: (I_f + I_b - T_f - T_b) / 2(n - 1).
        """
        if not isinstance(timelines, dict) or not timelines:
            raise ValueError("give {batch size: measured Timeline}, e.g. {64: run.timeline}")
        phases = {b: _median_phases(tl, rank, skip) for b, tl in timelines.items()}
        batches = sorted(phases)
        ref, n = batches[-1], len(net)
        tiny = _median_phases(calls, rank, skip) if calls is not None else None
        fixed = 0.0
        if len(batches) > 1:
            intercepts = [fit_line(batches, [phases[b][p] for b in batches])[1]
                          for p in ("forward", "backward")]
            if tiny is None:
                fixed = max(sum(intercepts) / (2 * n), 0.0)
            elif n > 1:
                fixed = max((sum(intercepts) - tiny["forward"] - tiny["backward"])
                            / (2 * (n - 1)), 0.0)
            # noise can make the intercept exceed a measured pass: keep both parts >= 0
            fixed = min(fixed, min(phases[ref]["forward"], phases[ref]["backward"]) / n)
        call = (0.0, 0.0, 0.0)
        if tiny is not None:        # each call's part, within what the whole pass took
            per_layer = {"forward": fixed, "backward": fixed, "update": 0.0}
            call = tuple(min(max(tiny[p] - per_layer[p], 0.0), phases[ref][p] - n * per_layer[p])
                         for p in ("forward", "backward", "update"))
        weights = _layer_weights(net, cluster, ref)
        share = [w / sum(weights) for w in weights]
        fwd = tuple(fixed + (phases[ref]["forward"] - call[0] - n * fixed) * s for s in share)
        bwd = tuple(fixed + (phases[ref]["backward"] - call[1] - n * fixed) * s for s in share)
        return cls(fwd, bwd, phases[ref]["update"], ref, net.params, fixed,
                   source=f"measured at batch {', '.join(map(str, batches))}", call_s=call)


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
