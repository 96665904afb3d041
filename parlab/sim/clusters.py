"""Clusters the learner does not own, and this machine, as the cost model sees them.

Every figure names its source. Datasheets give PEAKS; a training step sees less, so
each preset derates them, and says so: these are sustained figures, not peak.

* compute: 40 % of the dense tensor-core peak. Megatron-LM sustains 30 % of a V100's
  peak on one GPU (39 of 125 TFLOP/s, Shoeybi et al., 2019, abstract) and 44-52 % of an
  A100's at scale (Narayanan et al., 2021, section 5.1).
* memory bandwidth: 80 % of the datasheet's (what STREAM-like copies reach on HBM).
* links: 80 % of the per-direction peak, about what nccl-tests' all-reduce bus
  bandwidth reaches on NVLink (e.g. ~230 of 300 GB/s on a DGX A100); latencies are
  assumptions of the order nccl-tests reports for small messages, not measurements.

This machine is measured, never assumed: ``calibrate.this_machine(link, flops=...)``
takes what a lab measured, ``calibrated(calibration, sizes)`` what
``parlab.torch.hybrid.calibrate`` measured.
"""
from __future__ import annotations

from .checks import count
from .model import Cluster, Link

SUSTAINED_COMPUTE = 0.40
SUSTAINED_MEMORY = 0.80
SUSTAINED_LINK = 0.80
KERNEL_OVERHEAD_S = 20e-6        # one layer pass: a few kernel launches (assumption)


def _gpu(name, devices, per_node, memory_gb, peak_flops, mem_bw, intra_Bps, intra_alpha,
         inter_Bps, inter_alpha) -> Cluster:
    return Cluster(name, devices, memory_gb * 1e9, flops=SUSTAINED_COMPUTE * peak_flops,
                   layer_overhead_s=KERNEL_OVERHEAD_S, devices_per_node=per_node,
                   intra=Link(intra_alpha, SUSTAINED_LINK * intra_Bps),
                   inter=Link(inter_alpha, SUSTAINED_LINK * inter_Bps),
                   collective_overhead_s=0.0, memory_bandwidth_Bps=SUSTAINED_MEMORY * mem_bw)


def t4_pcie(devices: int = 2) -> Cluster:
    """Two T4s on PCIe: the free two-GPU runtime of Kaggle notebooks ("GPU T4 x2").

    NVIDIA T4 datasheet (https://www.nvidia.com/en-us/data-center/tesla-t4/): 16 GB
    GDDR6 at 320 GB/s; 65 TFLOP/s FP16 mixed precision (8.1 FP32); PCIe Gen3 x16
    (15.75 GB/s each way). No NVLink; cloud VMs rarely allow peer-to-peer, so a transfer
    goes through host memory and crosses PCIe twice: half the PCIe rate (an
    assumption), and 10 us.
    """
    devices = count("t4_pcie", "devices", devices)
    through_host = 15.75e9 / 2
    return _gpu(f"{devices} × T4 (PCIe)", devices, devices, 16, 65e12, 320e9,
                through_host, 10e-6, through_host, 10e-6)


def a100_nvlink(devices: int = 8) -> Cluster:
    """A DGX A100-like node: 8 × A100 SXM4 80 GB on NVSwitch.

    NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): 80 GB
    HBM2e at 2039 GB/s; 312 TFLOP/s dense BF16/FP16 (624 with sparsity); NVLink 3:
    600 GB/s per GPU both directions together, 300 GB/s each way.
    """
    devices = count("a100_nvlink", "devices", devices)
    return _gpu(f"{devices} × A100 (NVLink)", devices, 8, 80, 312e12, 2039e9,
                300e9, 3e-6, 25e9, 8e-6)


def h100_nvlink(devices: int = 8) -> Cluster:
    """A DGX H100-like node: 8 × H100 SXM5 80 GB on NVSwitch.

    NVIDIA H100 datasheet (https://www.nvidia.com/en-us/data-center/h100/): 80 GB HBM3
    at 3.35 TB/s; 989 TFLOP/s dense BF16 (1979 with sparsity); NVLink 4: 900 GB/s per
    GPU both directions together, 450 GB/s each way.
    """
    devices = count("h100_nvlink", "devices", devices)
    return _gpu(f"{devices} × H100 (NVLink)", devices, 8, 80, 989e12, 3.35e12,
                450e9, 3e-6, 50e9, 8e-6)


def h100_infiniband(nodes: int = 2) -> Cluster:
    """``nodes`` DGX H100-like nodes joined by InfiniBand NDR.

    DGX H100 user guide: 8 ConnectX-7 ports of 400 Gb/s per node, one per GPU: 50 GB/s
    per GPU between nodes (each way), against 450 GB/s of NVLink inside a node.
    """
    nodes = count("h100_infiniband", "nodes", nodes)
    inside = h100_nvlink(8)
    return Cluster(f"{nodes} nodes × 8 H100 (InfiniBand NDR)", 8 * nodes, inside.memory_bytes,
                   inside.flops, inside.layer_overhead_s, 8, inside.intra,
                   Link(8e-6, SUSTAINED_LINK * 50e9), 0.0, inside.memory_bandwidth_Bps)


def h100_nodes(nodes: int = 1) -> Cluster:
    """``nodes`` DGX H100-like nodes of 8 GPUs: ``h100_nvlink(8)`` for one node,
    ``h100_infiniband(nodes)`` for more (one set of datasheet figures, derated as above)."""
    nodes = count("h100_nodes", "nodes", nodes)
    return h100_nvlink(8) if nodes == 1 else h100_infiniband(nodes)


def v100_dgx2h(devices: int = 16) -> Cluster:
    """The DGX-2H of Megatron-LM's scaling study (Shoeybi et al., 2019, section 5).

    V100 SXM3 32 GB (NVIDIA V100 datasheet): HBM2 at 900 GB/s (1134 GB/s on the
    DGX-2H's 450 W part; we keep 900), 125 TFLOP/s FP16 tensor peak; NVSwitch: 300 GB/s
    per GPU both directions, 150 GB/s each way. Compute is set elsewhere from the
    paper's own single-GPU baseline (``published.megatron_weak_scaling``).
    """
    devices = count("v100_dgx2h", "devices", devices)
    return _gpu(f"{devices} × V100 (DGX-2H, NVSwitch)", devices, 16, 32, 125e12, 900e9,
                150e9, 5e-6, 12.5e9, 10e-6)


def gpu_presets() -> dict[str, Cluster]:
    """The hardware a learner may ask about, by name (for explorers)."""
    return {c.name: c for c in (t4_pcie(), a100_nvlink(), h100_nvlink(), h100_infiniband(2))}
