"""Memory per device for each strategy: does it fit?

A device holds, for the parameters it owns, their weights, gradients and optimizer
state (``Network.state``: 4 + 4 + 0 bytes for SGD in float32; 2 + 2 + 12 = 16 bytes for
Adam in mixed precision, Rajbhandari et al., ZeRO, 2020, section 3.1), plus the
activations its layers keep for the backward pass, for every micro-batch in flight:

* one device, data parallel: the replica's whole batch (batch / dp);
* tensor parallel: the layers' parameters and activations divided by tp (an unpaired
  last layer of column-then-row stays whole);
* pipelines: a stage's layers only; GPipe keeps all m micro-batches, 1F1B at most
  p - s on stage s (``pipeline.peak_in_flight``), interleaved 1F1B, ZB-H1 and DualPipeV
  what their schedules hold at their peak, a chunk's layers per micro-batch and chunk
  (peak_in_flight / chunks stage-loads); where a backward is split, a micro-batch is
  held until its W, which still reads the inputs its F saved (counted whole: Qi et al.,
  2024, section 2.3, keep a little less, M_W < M_B, after the B).

What a layer keeps is ``Layer.saved_elems`` (sliced by tp) and
``saved_replicated_elems`` (whole on every tp rank); Korthikanti et al., 2022 (table 2)
for a GPT block per sequence: s h (10 + 24/t + 5 a s/(h t)) bytes. Options:

* ``sequence_parallel``: the replicated part is split too: s h/t (34 + 5 a s/h);
* ``recompute="selective"``: attention's s^2 tensors are not kept (recomputed):
  s h (10 + 24/t), or 34 s h/t with sequence parallelism;
* ``recompute="full"``: only each layer's input is kept, 2 s h (/t with sequence
  parallelism), plus, during the backward pass, one layer's activations rebuilt;
* ``schedule="pipedream"``: stage s also keeps p - s versions of its weights (weight
  stashing, Narayanan et al., 2019);
* ``zero`` (ZeRO, Rajbhandari et al., 2020, figure 1; ``parlab.zero``'s table): stage 1
  shares out the optimizer state over the dp replicas, stage 2 the gradients too,
  stage 3 (FSDP) the parameters too, plus the whole parameters of the layer in use and
  of the next, gathered (``Memory.buffers``).

``Memory.check()`` raises ``DoesNotFit`` saying what to change.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import counted
from .blocks import check_expert_parallel, ring_attention
from .checks import expert_ranks
from .costs import Network, Roofline
from ..pipeline import virtual_stage
from .program import CHUNKED, Mesh, Stage, divides, stage_layers, stage_orders
from .sharding import check_zero, sharded_states

GB = 1e9


class DoesNotFit(ValueError):
    """The busiest device needs more memory than it has."""


@dataclass(frozen=True)
class Memory:
    """Bytes on one device (PREDICTED): its share of the states, and its activations."""

    device: str
    params: float
    grads: float
    optimizer: float
    activations: float
    capacity: float = float("inf")
    buffers: float = 0.0             # ZeRO-3 / FSDP: whole parameters gathered for a pass

    @property
    def states(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.states + self.activations + self.buffers

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def parts(self) -> dict:
        """{"parameters", "gradients", "optimizer state", "activations"} in bytes (for plots)."""
        out = {"parameters": self.params, "gradients": self.grads,
               "optimizer state": self.optimizer, "activations": self.activations}
        if self.buffers:
            out["gathered parameters"] = self.buffers
        return out

    def __str__(self) -> str:
        cap = "" if self.capacity == float("inf") else f" of {self.capacity / GB:.1f} GB"
        return (f"{self.device}: {self.total / GB:.2f} GB{cap} (parameters "
                f"{self.params / GB:.2f}, gradients {self.grads / GB:.2f}, optimizer "
                f"{self.optimizer / GB:.2f}, activations {self.activations / GB:.2f}"
                f"{f', gathered parameters {self.buffers / GB:.2f}' if self.buffers else ''}) "
                f"{'fits' if self.fits else 'DOES NOT FIT'}")

    def check(self) -> "Memory":
        """Return self if it fits; else raise ``DoesNotFit`` naming what to change."""
        if not self.fits:
            raise DoesNotFit(
                f"{self}: needs {(self.total - self.capacity) / GB:.2f} GB more. Split the "
                "states over more devices (tensor parallel, more pipeline stages), keep "
                "fewer activations (smaller micro-batches, 1F1B instead of GPipe, "
                "activation checkpointing), or shard the states (ZeRO / FSDP, lab 08)")
        return self


def memory_per_device(net: Network, batch: int, *, dp: int = 1, tp: int = 1, pp: int = 1,
                      micro_batches: int = 1, schedule: str = "1f1b", chunks: int | None = None,
                      scheme: str = "column_row", bounds=None, cluster=None,
                      costs=None, zero: int = 0, recompute=None,
                      sequence_parallel: bool = False, cp: int = 1, ep: int = 1) -> list[Memory]:
    """Memory of each pipeline stage's device (every dp replica and tp rank alike).

    cp: context parallelism, each sequence split over cp ranks: every per-position tensor
    kept is 1/cp as large, attention keeps no s x s tensor (ring attention,
    ``sim.context``), and the states are sharded over dp x cp. ep: expert parallelism,
    a mixture-of-experts block's experts spread over ep of those ranks (their states
    sharded over the dp x cp / ep that hold the same experts).

    cluster: its ``memory_bytes`` is the capacity (and, with no ``costs``, its rates
    balance the stages as the timelines do); without one, stages are balanced by FLOPs.
    zero, recompute, sequence_parallel: see the module doc (the network's own
    ``recompute`` and ``sequence_parallel`` hold where these are not given).
    chunks: per device; default 2 for "interleaved" and "dualpipev" with a pipeline, else 1.
    """
    batch, dp, tp, pp = (counted(batch, "batch"), counted(dp, "dp"), counted(tp, "tp"),
                         counted(pp, "pp"))
    cp, ep = counted(cp, "cp"), counted(ep, "ep")
    expert_ranks("memory", dp, cp, ep)
    check_expert_parallel(net, ep, "memory")
    m = counted(micro_batches, "micro_batches")
    if chunks is None:
        chunks = CHUNKED.get(schedule, 1) if pp > 1 else 1
    chunks = counted(chunks, "chunks")
    zero = check_zero(zero)
    if recompute is not None or sequence_parallel:
        net = net.trained(recompute=recompute or net.recompute,
                          sequence_parallel=sequence_parallel or net.sequence_parallel)
    mb = divides(divides(batch, dp, "data-parallel replicas"), m, "micro-batches") / cp
    kept_net = ring_attention(net) if cp > 1 else net
    capacity = cluster.memory_bytes if cluster is not None else float("inf")
    if costs is None:
        costs = Roofline(net, cluster) if cluster is not None else _FlopCosts(net)
    mesh = Mesh(_Unbounded(), dp, pp, tp) if cluster is None else Mesh(cluster, dp, pp, tp)
    ops = stage_orders(schedule, pp, m, chunks) if pp > 1 else [[("F", 0, 0), ("B", 0, 0)]]
    cuts = stage_layers(net, costs, pp * chunks, bounds, mb)     # one per virtual stage
    placement = getattr(ops, "placement", "loop")
    st, out = net.state, []
    for s in range(pp):
        parts = [Stage(net, costs, cuts[virtual_stage(s, c, pp, placement)], mesh, scheme)
                 for c in range(chunks)]
        experts = sum(net.layers[i].expert_params / p._sliced(i) for p in parts
                      for i in p.layers)
        params = sum(p.params() for p in parts) - experts * (1 - 1 / ep)
        per_chunk = [sum(kept_net.kept_elems(i, p._sliced(i), tp) for i in p.layers)
                     * mb * net.act_bytes for p in parts]
        acts = _peak_activations(ops[s], per_chunk)
        if net.recompute == "full":     # one layer's activations, rebuilt for its backward
            acts += max(kept_net.kept_elems(i, p._sliced(i), tp, rebuilt=True)
                        for p in parts for i in p.layers) * mb * net.act_bytes
        largest = max(net.layers[i].params / p._sliced(i) for p in parts for i in p.layers)
        buffers = 2 * largest * st["params"] if zero == 3 and dp > 1 else 0.0
        # PipeDream stashes a version of the weights per micro-batch in flight, p - s on
        # stage s (Narayanan et al., 2019, section 3.3)
        stash = pp - s if schedule == "pipedream" else 1
        kept = sharded_states(params - experts / ep, st, dp * cp, zero)
        if experts:
            mine = sharded_states(experts / ep, st, dp * cp // ep, zero)
            kept = {k: kept[k] + mine[k] for k in kept}
        out.append(Memory(f"stage {s}" if pp > 1 else "each device",
                          stash * kept["params"], kept["grads"], kept["optimizer"], acts,
                          capacity, buffers))
    return out


def memory(net: Network, batch: int, **plan) -> Memory:
    """The busiest device's memory (see ``memory_per_device`` for the arguments)."""
    return max(memory_per_device(net, batch, **plan), key=lambda mem: mem.total)


def _peak_activations(ops, per_chunk) -> float:
    """Most activation bytes held at once: F adds its chunk's, B frees them, or W where
    the backward is split (as ``pipeline.peak_in_flight`` counts)."""
    split = {(i, chunk) for kind, i, chunk in ops if kind == "W"}
    live = peak = 0.0
    for kind, i, chunk in ops:
        if kind == "F":
            live += per_chunk[chunk]
        elif (kind == "W") == ((i, chunk) in split):
            live -= per_chunk[chunk]
        peak = max(peak, live)
    return peak


def parameter_server_memory(net: Network, batch: int, *, workers: int = 2, servers: int = 1,
                            cluster=None) -> dict[str, Memory]:
    """A server keeps its shard's weights, a gradient buffer and the optimizer state; a
    worker keeps a whole copy of the weights, its gradients and its batch's activations."""
    workers, servers = counted(workers, "workers"), counted(servers, "servers")
    per = divides(counted(batch, "batch"), workers, "workers")
    capacity = cluster.memory_bytes if cluster is not None else float("inf")
    p, st = net.params, net.state
    shard = p / servers
    acts = sum(layer.saved_elems + layer.saved_replicated_elems
               for layer in net.layers) * per * net.act_bytes
    return {"server": Memory("server", shard * st["params"], shard * st["grads"],
                             shard * st["optimizer"], 0.0, capacity),
            "worker": Memory("worker", p * st["params"], p * st["grads"], 0.0, acts, capacity)}


class _FlopCosts:
    """Stage balance by FLOPs alone, when no cluster is given."""

    def __init__(self, net: Network):
        self.net = net

    def forward_s(self, i, batch, shard=1):
        return self.net.layers[i].flops * batch / shard

    def backward_s(self, i, batch, shard=1):
        return 2 * self.forward_s(i, batch, shard)


class _Unbounded:
    """A cluster with as many devices as asked for (memory alone needs no links)."""

    name = "any cluster"
    devices = float("inf")
    collective_overhead_s = 0.0

    def link(self, span):
        return None

