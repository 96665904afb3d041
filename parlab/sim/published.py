"""The cost model against published figures: each a deterministic check.

``checks()`` returns one ``Check`` per figure; ``lines()`` prints each as
``sim vs published: NAME predicted X published Y``. The target: within 15 %.

* GPipe (Huang et al., 2019, arXiv:1811.06965, Table 2): normalised training
  throughput of Transformer-48 on TPUs with K = 2, 4, 8 partitions and M = 32
  micro-batches: 1.8, 3.4, 6.3 (K = 2, M = 1 is 1). Predicted: the throughput of a
  predicted GPipe timeline, same global batch, layers spread evenly, re-materialising
  as GPipe does (its recomputation runs before each gradient arrives, section 2.3).
* Megatron-LM (Shoeybi et al., 2019, arXiv:1909.08053, section 5.1 and Figure 5):
  weak scaling of tensor ("model") parallelism, 8.3 B parameters on 8 GPUs against
  1.2 B on one: 77 % of linear scaling. Table 1's configurations (hidden 1536, 16
  heads, 40 layers on 1 GPU; 3072, 32, 72 on 8), batch 8, sequence 1024, vocabulary
  51,200, on a DGX-2H. The single-GPU baseline's 39 TFLOP/s (the abstract) calibrates
  the V100's matrix rate (its matrix unit's too: the 8-way run's thinner products are
  then priced by shape); the 8-way run is then predicted from it.
* nccl-tests (NVIDIA, doc/PERFORMANCE.md): an all-reduce's bus bandwidth is its
  algorithm bandwidth times 2(n - 1)/n, and equals the link's bandwidth B when the
  operation is optimal. Predicted: B / (S / t) with t the model's ring all-reduce of
  1 GiB.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .clusters import ACHIEVABLE_SHARE, v100_dgx2h
from .costs import Network
from .model import Cluster, Link, all_reduce_s
from .timelines import pipeline, single_device, tensor_parallel

TARGET = 0.15


@dataclass(frozen=True)
class Check:
    name: str
    predicted: float
    published: float
    source: str

    @property
    def error(self) -> float:
        """Relative difference, predicted over published minus 1."""
        return self.predicted / self.published - 1

    @property
    def within(self) -> bool:
        return abs(self.error) <= TARGET

    def __str__(self) -> str:
        verdict = "within" if self.within else "OUTSIDE"
        return (f"sim vs published: {self.name} predicted {self.predicted:.3g} published "
                f"{self.published:.3g} ({self.error:+.1%}, {verdict} {TARGET:.0%}; {self.source})")


# ------------------------------------------------------------------ GPipe
GPIPE_TRANSFORMER_M32 = {2: 1.8, 4: 3.4, 8: 6.3}     # Huang et al., 2019, Table 2


def tpu_v3_cores(devices: int = 8) -> Cluster:
    """TPU v3 cores as GPipe used them (one partition per core).

    Google Cloud TPU v3 (https://cloud.google.com/tpu/docs/v3): 123 TFLOP/s bf16 and
    32 GiB HBM per chip of 2 cores. The matrix rate: the peak times the share the A100's
    and H100's maxima reach (``clusters.ACHIEVABLE_SHARE``), as for the GPUs without a
    published maximum; the inter-core link is an assumption (it barely matters: a stage
    hands on one activation per micro-batch).
    """
    return Cluster(f"{devices} TPU v3 cores", devices, 16 * 2**30,
                   flops=ACHIEVABLE_SHARE * 123e12 / 2,
                   layer_overhead_s=20e-6, devices_per_node=devices,
                   intra=Link(5e-6, 50e9), inter=Link(5e-6, 50e9),
                   memory_bandwidth_Bps=0.8 * 900e9 / 2)


def gpipe_throughput(partitions: int, micro_batches: int, *, batch: int = 256) -> float:
    """Predicted throughput of Transformer-48 (GPipe's: model 2048, 32 heads) on
    ``partitions`` cores with GPipe, over K = 2, M = 1 (Table 2's normalisation)."""
    net = Network.transformer("Transformer-48", 48, 2048, 32, seq=256)

    def rate(k, m):
        tl = pipeline(net, tpu_v3_cores(8), batch, stages=k, micro_batches=m, schedule="gpipe",
                      recompute="full")
        return batch / tl.step_s
    return rate(partitions, micro_batches) / rate(2, 1)


# ------------------------------------------------------------------ Megatron-LM
MEGATRON_8WAY_EFFICIENCY = 0.77          # Shoeybi et al., 2019, section 5.1, Figure 5
MEGATRON_BASELINE_FLOPS = 39e12          # the 1.2 B model on one V100, the abstract
MEGATRON_BATCH, MEGATRON_SEQ, MEGATRON_VOCAB = 8, 1024, 51200


def megatron_networks() -> tuple[Network, Network]:
    """Table 1: the 1.2 B model (1 GPU) and the 8.3 B model (8-way)."""
    one = Network.transformer("GPT-2 1.2B", 40, 1536, 16, MEGATRON_SEQ, MEGATRON_VOCAB)
    eight = Network.transformer("GPT-2 8.3B", 72, 3072, 32, MEGATRON_SEQ, MEGATRON_VOCAB)
    return one, eight


def _model_flops(net: Network, batch: int) -> float:
    return 3 * batch * sum(layer.flops for layer in net.layers)     # forward + backward


def megatron_cluster() -> Cluster:
    """The DGX-2H with the V100's sustained rate set so that the 1.2 B baseline's
    predicted step runs at the paper's 39 TFLOP/s (bisection on the rate)."""
    one, _ = megatron_networks()
    base = v100_dgx2h()
    want = _model_flops(one, MEGATRON_BATCH) / MEGATRON_BASELINE_FLOPS    # seconds
    lo, hi = 1e12, 125e12
    for _ in range(60):
        mid = (lo + hi) / 2
        step = single_device(one, _at_rate(base, mid), MEGATRON_BATCH).step_s
        lo, hi = (mid, hi) if step > want else (lo, mid)
    return _at_rate(base, (lo + hi) / 2)


def _at_rate(cluster: Cluster, rate: float) -> Cluster:
    """The cluster with its matrix rate (and its matrix unit's) set to ``rate``."""
    unit = cluster.matrix and replace(cluster.matrix, rate=rate)
    return replace(cluster, flops=rate, matrix=unit)


def megatron_weak_scaling(devices: int = 8) -> float:
    """Predicted per-GPU throughput of the 8.3 B model on 8-way tensor parallel, over
    the 1.2 B model's on one GPU (both in model FLOP/s)."""
    one, eight = megatron_networks()
    cluster = megatron_cluster()
    t1 = single_device(one, cluster, MEGATRON_BATCH).step_s
    t8 = tensor_parallel(eight, cluster, MEGATRON_BATCH, devices=devices).step_s
    return (_model_flops(eight, MEGATRON_BATCH) / (devices * t8)) / (
        _model_flops(one, MEGATRON_BATCH) / t1)


# ------------------------------------------------------------------ nccl-tests
def nccl_bus_factor(n: int, link: Link = Link(3e-6, 360e9), nbytes: float = 2**30) -> float:
    """Link bandwidth over the predicted algorithm bandwidth S / t of an all-reduce."""
    algbw = nbytes / all_reduce_s(nbytes, n, link)
    return link.bandwidth_Bps / algbw


# ------------------------------------------------------------------ all of them
def checks() -> list[Check]:
    out = [Check(f"GPipe Transformer-48 throughput K={k} M=32 (normalised to K=2 M=1)",
                 gpipe_throughput(k, 32), want, "Huang et al. 2019, Table 2")
           for k, want in GPIPE_TRANSFORMER_M32.items()]
    out.append(Check("Megatron-LM weak scaling, 8-way tensor parallel (8.3 B vs 1.2 B on 1 GPU)",
                     megatron_weak_scaling(8), MEGATRON_8WAY_EFFICIENCY,
                     "Shoeybi et al. 2019, section 5.1"))
    out += [Check(f"nccl-tests all-reduce busbw/algbw, n={n} (1 GiB)", nccl_bus_factor(n),
                  2 * (n - 1) / n, "nccl-tests doc/PERFORMANCE.md")
            for n in (2, 4, 8)]
    return out


def lines() -> list[str]:
    return [str(c) for c in checks()]
