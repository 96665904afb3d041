"""Clusters the learner does not own, and this machine, as the cost model sees them.

Every figure names its source. Datasheets give PEAKS; a training step sees less, so
each preset derates them, and says so: these are sustained figures, not peak.

* matrix products: the device's maximum ACHIEVABLE matrix rate, measured on large
  products (A100 SXM 271.2, H100 SXM 794.5 TFLOP/s bf16: ``sim.gemm``'s source), and
  a ``MatrixUnit`` that prices each product by its shape (smaller products, e.g. sliced
  by tensor parallelism, run slower). This is a matrix rate, not an end-to-end
  utilisation: element-wise work (at the memory bandwidth), collectives and fixed
  costs come on top, in the timelines. (Before, 40 % of the peak stood for all of it,
  and then had those added again: large models' steps came out 1.5-1.7x too long.)
  The T4 and the V100 have no published maximum: 40 % of the peak, as before (Megatron-
  LM sustains 30 % of a V100's on one GPU end to end, 39 of 125 TFLOP/s, Shoeybi et al.,
  2019, abstract).
* memory bandwidth: 90 % of the datasheet's: a 1 GiB copy on an H100 SXM moved
  3.0 TB/s counting reads and writes (of 3.35; ours, 2026-11-25, ``sim.gemm``).
* links: 80 % of the per-direction peak, about what nccl-tests' all-reduce bus
  bandwidth reaches on NVLink (e.g. ~230 of 300 GB/s on a DGX A100); latencies are
  assumptions of the order nccl-tests reports for small messages, not measurements.

This machine is measured, never assumed: ``calibrate.this_machine(link, flops=...)``
takes what a lab measured, ``calibrated(calibration, sizes)`` what
``parlab.torch.hybrid.calibrate`` measured.
"""
from __future__ import annotations

from dataclasses import replace

from .checks import count
from .gemm import MatrixUnit
from .model import Cluster, Link

SUSTAINED_COMPUTE = 0.40         # of the peak, where no maximum achievable rate is published
SUSTAINED_MEMORY = 0.90
SUSTAINED_LINK = 0.80
KERNEL_OVERHEAD_S = 20e-6        # one layer pass: a few kernel launches (assumption)
MAX_ACHIEVABLE = {"A100": 271.2e12, "H100": 794.5e12}    # bf16 matrix FLOP/s (sim.gemm)


def _gpu(name, devices, per_node, memory_gb, matrix_flops, sms, mem_bw, intra_Bps,
         intra_alpha, inter_Bps, inter_alpha) -> Cluster:
    bandwidth = SUSTAINED_MEMORY * mem_bw
    return Cluster(name, devices, memory_gb * 1e9, flops=matrix_flops,
                   layer_overhead_s=KERNEL_OVERHEAD_S, devices_per_node=per_node,
                   intra=Link(intra_alpha, SUSTAINED_LINK * intra_Bps),
                   inter=Link(inter_alpha, SUSTAINED_LINK * inter_Bps),
                   collective_overhead_s=0.0, memory_bandwidth_Bps=bandwidth,
                   matrix=MatrixUnit(sms, matrix_flops, bandwidth))


def t4_pcie(devices: int = 2) -> Cluster:
    """Two T4s on PCIe: the free two-GPU runtime of Kaggle notebooks ("GPU T4 x2").

    NVIDIA T4 datasheet (https://www.nvidia.com/en-us/data-center/tesla-t4/): 16 GB
    GDDR6 at 320 GB/s; 65 TFLOP/s FP16 mixed precision (8.1 FP32); 40 SMs; PCIe Gen3 x16
    (15.75 GB/s each way). No NVLink; cloud VMs rarely allow peer-to-peer, so a transfer
    goes through host memory and crosses PCIe twice: half the PCIe rate (an
    assumption), and 10 us.
    """
    devices = count("t4_pcie", "devices", devices)
    through_host = 15.75e9 / 2
    return _gpu(f"{devices} × T4 (PCIe)", devices, devices, 16, SUSTAINED_COMPUTE * 65e12, 40,
                320e9,
                through_host, 10e-6, through_host, 10e-6)


def a100_nvlink(devices: int = 8) -> Cluster:
    """A DGX A100-like node: 8 × A100 SXM4 80 GB on NVSwitch.

    NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): 80 GB
    HBM2e at 2039 GB/s; between nodes 8 HDR cards of 200 Gb/s, one per GPU (DGX A100 user
    guide): 25 GB/s each; 312 TFLOP/s dense BF16/FP16 (624 with sparsity), 108 SMs;
    NVLink 3: 600 GB/s per GPU both directions together, 300 GB/s each way.
    """
    devices = count("a100_nvlink", "devices", devices)
    return _gpu(f"{devices} × A100 (NVLink)", devices, 8, 80, MAX_ACHIEVABLE["A100"], 108,
                2039e9,
                300e9, 3e-6, 25e9, 8e-6)


def h100_nvlink(devices: int = 8) -> Cluster:
    """A DGX H100-like node: 8 × H100 SXM5 80 GB on NVSwitch.

    NVIDIA H100 datasheet (https://www.nvidia.com/en-us/data-center/h100/): 80 GB HBM3
    at 3.35 TB/s; 989 TFLOP/s dense BF16 (1979 with sparsity), 132 SMs; NVLink 4:
    900 GB/s per GPU both directions together, 450 GB/s each way; third-generation
    NVSwitch with NVLink SHARP, which NCCL (2.17 and later) uses for all-reduces by
    default (``nvls``; turn it off with ``dataclasses.replace(c, nvls=False)``, as
    NCCL_NVLS_ENABLE=0 does). The node's 8 ConnectX-7 cards: ``h100_infiniband``.
    """
    devices = count("h100_nvlink", "devices", devices)
    return replace(_gpu(f"{devices} × H100 (NVLink)", devices, 8, 80, MAX_ACHIEVABLE["H100"],
                        132, 3.35e12, 450e9, 3e-6, 50e9, 8e-6), nvls=True)


def h100_infiniband(nodes: int = 2) -> Cluster:
    """``nodes`` DGX H100-like nodes joined by InfiniBand NDR.

    DGX H100 user guide: 8 ConnectX-7 ports of 400 Gb/s per node, one per GPU: 50 GB/s
    per GPU between nodes (each way), against 450 GB/s of NVLink inside a node. A
    collective across nodes uses every card its members drive (``sim.collectives``:
    multi-rail rings; a whole node's 8 cards carry 8 x 40 GB/s sustained).
    """
    nodes = count("h100_infiniband", "nodes", nodes)
    inside = h100_nvlink(8)
    return replace(inside, name=f"{nodes} nodes × 8 H100 (InfiniBand NDR)", devices=8 * nodes,
                   inter=Link(8e-6, SUSTAINED_LINK * 50e9))


def h100_nodes(nodes: int = 1) -> Cluster:
    """``nodes`` DGX H100-like nodes of 8 GPUs: ``h100_nvlink(8)`` for one node,
    ``h100_infiniband(nodes)`` for more (one set of datasheet figures, derated as above)."""
    nodes = count("h100_nodes", "nodes", nodes)
    return h100_nvlink(8) if nodes == 1 else h100_infiniband(nodes)


def v100_dgx2h(devices: int = 16) -> Cluster:
    """The DGX-2H of Megatron-LM's scaling study (Shoeybi et al., 2019, section 5).

    V100 SXM3 32 GB (NVIDIA V100 datasheet): HBM2 at 900 GB/s (1134 GB/s on the
    DGX-2H's 450 W part; we keep 900), 125 TFLOP/s FP16 tensor peak, 80 SMs; NVSwitch: 300 GB/s
    per GPU both directions, 150 GB/s each way. Compute is set elsewhere from the
    paper's own single-GPU baseline (``published.megatron_weak_scaling``).
    """
    devices = count("v100_dgx2h", "devices", devices)
    return _gpu(f"{devices} × V100 (DGX-2H, NVSwitch)", devices, 16, 32,
                SUSTAINED_COMPUTE * 125e12, 80, 900e9,
                150e9, 5e-6, 12.5e9, 10e-6)


def gpu_presets() -> dict[str, Cluster]:
    """The hardware a learner may ask about, by name (for explorers)."""
    return {c.name: c for c in (t4_pcie(), a100_nvlink(), h100_nvlink(), h100_infiniband(2))}
