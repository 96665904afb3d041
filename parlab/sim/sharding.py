"""Sharded data parallelism in the step: ZeRO stages 1-3 (Rajbhandari et al., 2020) and
PyTorch's FSDP (Zhao et al., 2023), as collectives in every rank's program.

With N data-parallel replicas, each keeps 1/N of the optimizer state (stage 1), of the
gradients too (stage 2), and of the parameters too (stage 3 = FSDP's FULL_SHARD;
stage 2 = SHARD_GRAD_OP). The memory: ``sim.memory``. The time:

* stages 1 and 2: the gradients are reduce-scattered (each rank receives the sum of its
  1/N), the rank updates its 1/N of the parameters, then all-gathers the updated ones:
  the bytes of one all-reduce, split in two halves around an update N times smaller
  (Megatron-LM's distributed optimizer is stage 1).
* stage 3: a layer's parameters are all-gathered before its forward pass and again before
  its backward pass, and its gradients reduce-scattered after it: 1.5x the bytes of plain
  data parallel (the ZeRO paper, section 7.2.1). With ``overlap`` (FSDP's prefetch) the
  gather of the next layer runs on the rank's communication lane while this layer
  computes, and a layer's reduce-scatter while the next one's backward runs.

Each collective over the dp group is priced by ``sim.collectives`` (half a ring: (n - 1)
alpha + (n - 1)/n S / B).
"""
from __future__ import annotations

from .engine import Collective, Join

ZERO_STAGES = (0, 1, 2, 3)


def check_zero(zero) -> int:
    if zero not in ZERO_STAGES or isinstance(zero, bool):
        raise ValueError(f"zero must be 0 (plain data parallel), 1, 2 or 3 (FSDP), got {zero!r}")
    return zero


def sharded_states(params: float, state: dict, dp: int, zero: int) -> dict:
    """Bytes of each part of the model states ({"params", "grads", "optimizer"}) a device
    keeps for ``params`` parameters, ``state`` bytes per parameter, under ZeRO ``zero``
    over ``dp`` replicas (Rajbhandari et al., 2020, figure 1): stage 1 divides the
    optimizer state by dp, stage 2 the gradients too, stage 3 the parameters too."""
    check_zero(zero)
    return {k: params * state[k] / (dp if zero >= stage else 1)
            for k, stage in (("params", 3), ("grads", 2), ("optimizer", 1))}


class Sharder:
    """ZeRO-3 / FSDP's collectives around each layer of one rank's stage (``Stage`` calls
    ``before`` and ``after`` each layer's forward and backward pass)."""

    def __init__(self, net, mesh, group: tuple, layers: range, shard_params, overlap: bool):
        self.net, self.mesh, self.group, self.overlap = net, mesh, group, overlap
        self.layers, self.shard_params = layers, shard_params

    def _gather(self, i: int) -> Collective:
        nbytes = self.shard_params(i) * self.net.state["params"]
        return Collective(self.group, nbytes, self.mesh.half_ring_s("dp", nbytes),
                          "all-gather params", "dp", background=self.overlap)

    def _scatter(self, i: int) -> Collective:
        nbytes = self.shard_params(i) * self.net.grad_wire_bytes
        return Collective(self.group, nbytes, self.mesh.half_ring_s("dp", nbytes),
                          "reduce-scatter grads", "dp", background=self.overlap)

    def before(self, i: int, *, forward: bool, scatters: bool = True) -> list:
        """The gathers before layer i's pass. scatters: False in a split backward's B,
        which reduce-scatters nothing (its W does, ``Stage.weight_grads``)."""
        if not self.shard_params(i):
            return []
        if not self.overlap:
            return [self._gather(i)]
        order = [j for j in self.layers if self.shard_params(j)]
        order = order if forward else order[::-1]
        k = order.index(i)
        nxt = order[k + 1] if k + 1 < len(order) else None
        ops = [self._gather(i)] if k == 0 else []
        # posted since this layer's gather: (backward) the previous layer's reduce-scatter
        later = 0 if (forward or k == 0 or not scatters) else 1
        if nxt is not None:
            ops.append(self._gather(nxt))              # prefetch the next layer's
            later += 1
        return ops + [Join("wait for parameters", leave=later)]

    def after(self, i: int, *, forward: bool) -> list:
        if forward or not self.shard_params(i):
            return []
        return [self._scatter(i)]
