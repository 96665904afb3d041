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
  The T4, V100, P100 and P40 have no published maximum: their peak times the share of it
  that the A100's and the H100's maxima reach (0.87 and 0.80: 0.84). (They kept 40 %
  before, an end-to-end figure used as a matrix rate: the fitting set's one-V100 step of
  Megatron-LM came out 2.0x too long, the P40's U-Net 4.4x.)
* memory bandwidth: 90 % of the datasheet's: a 1 GiB copy on an H100 SXM moved
  3.0 TB/s counting reads and writes (of 3.35; ours, 2026-11-25, ``sim.gemm``).
* links: 80 % of the per-direction peak inside a node, about what nccl-tests' all-reduce
  bus bandwidth reaches on NVLink (e.g. ~230 of 300 GB/s on a DGX A100); 95 % of a
  network card's line rate between nodes (SUSTAINED_NIC); latencies are assumptions of
  the order nccl-tests reports for small messages, not measurements.

This machine is measured, never assumed: ``calibrate.this_machine(link, flops=...)``
takes what a lab measured, ``calibrated(calibration, sizes)`` what
``parlab.torch.hybrid.calibrate`` measured.
"""
from __future__ import annotations

from dataclasses import replace

from .checks import count
from .gemm import WINOGRAD_F2X2_3X3, MatrixUnit
from .model import Cluster, Link

MAX_ACHIEVABLE = {"A100": 271.2e12, "H100": 794.5e12}    # bf16 matrix FLOP/s (sim.gemm)
# the same table's other measured rows: the A100 PCIe card (its memory part not stated)
# and the H200 (its bf16 rate "the same" as the H100's; FP8 measured on it)
A100_PCIE = 252.9e12
H200_FP8 = 1453.4e12
# of the peak, where no maximum achievable rate is published: the mean share of the two
# measured maxima (271.2 of 312, 794.5 of 989)
ACHIEVABLE_SHARE = (MAX_ACHIEVABLE["A100"] / 312e12 + MAX_ACHIEVABLE["H100"] / 989e12) / 2
# 8-bit float (e4m3) products: the H100 SXM's maximum achievable rate, 1402.6 of its
# 1979 TFLOP/s dense FP8 peak (the same table as MAX_ACHIEVABLE, its FP8 part)
H100_FP8 = 1402.6e12
SUSTAINED_MEMORY = 0.90
SUSTAINED_LINK = 0.80
# network cards: nccl-tests' bus bandwidth across nodes reaches 24 of 25 GB/s on one HDR
# card and 47 of 50 GB/s on four EDR cards (NVIDIA/nccl issues 412 and 307): fitted on
# those two runs of the validation's fitting set (the 80 % above, NVLink's, was 15-17 %
# low on both)
SUSTAINED_NIC = 0.95
KERNEL_OVERHEAD_S = 20e-6        # one layer pass: a few kernel launches (assumption)

def _gpu(name, devices, per_node, memory_gb, matrix_flops, sms, mem_bw, intra_Bps,
         intra_alpha, inter_Bps, inter_alpha, *, nic: bool = True) -> Cluster:
    """A GPU cluster from datasheet figures, derated as the module doc says (inter: a
    network card's rate, or with ``nic=False`` one host's PCIe path)."""
    bandwidth = SUSTAINED_MEMORY * mem_bw
    inter_share = SUSTAINED_NIC if nic else SUSTAINED_LINK
    return Cluster(name, devices, memory_gb * 1e9, flops=matrix_flops,
                   layer_overhead_s=KERNEL_OVERHEAD_S, devices_per_node=per_node,
                   intra=Link(intra_alpha, SUSTAINED_LINK * intra_Bps),
                   inter=Link(inter_alpha, inter_share * inter_Bps),
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
    return _gpu(f"{devices} × T4 (PCIe)", devices, devices, 16, ACHIEVABLE_SHARE * 65e12, 40,
                320e9,
                through_host, 10e-6, through_host, 10e-6, nic=False)


def a100_nvlink(devices: int = 8, *, gb: int = 80) -> Cluster:
    """A DGX A100-like node: 8 × A100 SXM4 80 GB on NVSwitch (``devices`` beyond 8: such
    nodes, each GPU with its own network card).

    NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): 80 GB
    HBM2e at 2039 GB/s (the 40 GB part, ``gb=40``: HBM2 at 1555 GB/s); between nodes 8 HDR
    cards of 200 Gb/s, one per GPU (DGX A100 user guide): 25 GB/s each; 312 TFLOP/s dense
    BF16/FP16 (624 with sparsity), 108 SMs; NVLink 3: 600 GB/s per GPU both directions
    together, 300 GB/s each way.
    """
    devices = count("a100_nvlink", "devices", devices)
    if gb not in (40, 80):
        raise ValueError(f"a100_nvlink: gb must be 40 or 80 (the two A100 SXM4 parts), got {gb!r}")
    return _gpu(f"{devices} × A100 {gb} GB (NVLink)", devices, 8, gb, MAX_ACHIEVABLE["A100"],
                108, 2039e9 if gb == 80 else 1555e9,
                300e9, 3e-6, 25e9, 8e-6)


def h100_nvlink(devices: int = 8) -> Cluster:
    """A DGX H100-like node: 8 × H100 SXM5 80 GB on NVSwitch.

    NVIDIA H100 datasheet (https://www.nvidia.com/en-us/data-center/h100/): 80 GB HBM3
    at 3.35 TB/s, 700 W; 989 TFLOP/s dense BF16 (1979 with sparsity) at 1830 MHz
    (NVIDIA's clock for that peak), 132 SMs; the matrix rates measured at 700 W (the
    maximum achievable; no measurement at a lower power cap is published); NVLink 4:
    900 GB/s per GPU both directions together, 450 GB/s each way; third-generation
    NVSwitch with NVLink SHARP, which NCCL (2.17 and later) uses for all-reduces by
    default (``nvls``; turn it off with ``dataclasses.replace(c, nvls=False)``, as
    NCCL_NVLS_ENABLE=0 does). The node's 8 ConnectX-7 cards: ``h100_infiniband``.
    """
    devices = count("h100_nvlink", "devices", devices)
    c = _gpu(f"{devices} × H100 (NVLink)", devices, 8, 80, MAX_ACHIEVABLE["H100"], 132,
             3.35e12, 450e9, 3e-6, 50e9, 8e-6)
    return replace(c, nvls=True, fp8_matrix=replace(c.matrix, rate=H100_FP8))


def h200_nvlink(devices: int = 8) -> Cluster:
    """An HGX H200-like node: 8 × H200 SXM 141 GB on NVSwitch.

    NVIDIA H200 datasheet (https://www.nvidia.com/en-us/data-center/h200/): 141 GB HBM3e
    at 4.8 TB/s, 700 W; the H100's compute (132 SMs, 989 TFLOP/s dense BF16) and NVLink 4
    with NVLink SHARP. Matrix rates measured: BF16 as the H100's, FP8 1453.4 TFLOP/s
    (``H200_FP8``). What it changes against ``h100_nvlink``: memory, 141 GB at 4.8 TB/s.
    """
    devices = count("h200_nvlink", "devices", devices)
    c = _gpu(f"{devices} × H200 (NVLink)", devices, 8, 141, MAX_ACHIEVABLE["H100"], 132,
             4.8e12, 450e9, 3e-6, 50e9, 8e-6)
    return replace(c, nvls=True, fp8_matrix=replace(c.matrix, rate=H200_FP8))


def a100_pcie(devices: int = 2, *, gb: int = 80) -> Cluster:
    """A100 PCIe cards in one server, without NVLink bridges.

    NVIDIA A100 datasheet: the PCIe card, 80 GB HBM2e at 1935 GB/s and 300 W (``gb=40``:
    HBM2 at 1555 GB/s, 250 W); 312 TFLOP/s dense BF16 at 1410 MHz, 108 SMs; PCIe Gen4 x16,
    31.5 GB/s each way, through which the cards reach each other (peer to peer, 10 us: an
    assumption, as the T4's). Matrix rate measured on the card: 252.9 TFLOP/s
    (``A100_PCIE``), against the 400 W SXM part's 271.2.
    """
    devices = count("a100_pcie", "devices", devices)
    if gb not in (40, 80):
        raise ValueError(f"a100_pcie: gb must be 40 or 80 (the two A100 PCIe cards), got {gb!r}")
    return _gpu(f"{devices} × A100 PCIe {gb} GB", devices, devices, gb, A100_PCIE, 108,
                1935e9 if gb == 80 else 1555e9, 31.5e9, 10e-6, 31.5e9, 10e-6, nic=False)


def h100_infiniband(nodes: int = 2) -> Cluster:
    """``nodes`` DGX H100-like nodes joined by InfiniBand NDR.

    DGX H100 user guide: 8 ConnectX-7 ports of 400 Gb/s per node, one per GPU: 50 GB/s
    per GPU between nodes (each way), against 450 GB/s of NVLink inside a node. A
    collective across nodes uses every card its members drive (``sim.collectives``:
    multi-rail rings; a whole node's 8 cards carry 8 x 47.5 GB/s sustained).
    """
    nodes = count("h100_infiniband", "nodes", nodes)
    inside = h100_nvlink(8)
    return replace(inside, name=f"{nodes} nodes × 8 H100 (InfiniBand NDR)", devices=8 * nodes,
                   inter=Link(8e-6, SUSTAINED_NIC * 50e9))


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
                ACHIEVABLE_SHARE * 125e12, 80, 900e9,
                150e9, 5e-6, 12.5e9, 10e-6)


# ------------------------------------------------------------------ the published runs' machines
# (``published_setups.HARDWARE`` names them; the same derating as above)
def _nodes(what: str, nodes: int) -> int:
    return count(what, "nodes", nodes)


def v100_dgx1(nodes: int = 1) -> Cluster:
    """DGX-1 nodes: 8 × V100 SXM2 16 GB on an NVLink hybrid cube-mesh, 4 EDR cards a node.

    NVIDIA V100 datasheet: 125 TFLOP/s FP16 tensor peak, 16 GB HBM2 at 900 GB/s, 80 SMs;
    NVLink 2: six links of 25 GB/s each way per GPU (150 GB/s each way; a ring over the
    cube-mesh uses them without a switch). DGX-1 datasheet: 4 × 100 Gb/s EDR InfiniBand
    per node (12.5 GB/s each), NVIDIA/nccl issue 307: "~12 GB/s with each NIC".
    """
    nodes = _nodes("v100_dgx1", nodes)
    return replace(_gpu(f"{nodes} DGX-1 × 8 V100 (NVLink mesh, 4 EDR)", 8 * nodes, 8, 16,
                        ACHIEVABLE_SHARE * 125e12, 80, 900e9, 150e9, 5e-6, 12.5e9, 10e-6),
                   nics_per_node=4)


def a800_nodes(nodes: int = 1) -> Cluster:
    """Nodes of 8 × A800 SXM4 80 GB on NVSwitch, one 200 Gb/s HDR card per node.

    The A800 is an A100 whose NVLink carries 400 GB/s both ways together (200 GB/s each
    way, against the A100's 300: the A800 datasheet, from memory, unverified); compute and
    memory as the A100 80 GB. One HDR card per node: NVIDIA/nccl issue 412 (the 12-node
    run of the validation set).
    """
    nodes = _nodes("a800_nodes", nodes)
    base = a100_nvlink(8 * nodes)
    return replace(base, name=f"{nodes} nodes × 8 A800 (NVLink 200 GB/s, 1 HDR card)",
                   intra=Link(3e-6, SUSTAINED_LINK * 200e9), nics_per_node=1)


def a100_omnipath(nodes: int = 1) -> Cluster:
    """Jean Zay's A100 partition (BLOOM's training): 8 × A100 SXM4 80 GB on NVLink per
    node, 4 Omni-Path links of 100 Gb/s per node (bigscience tr11-176B-ml README; the
    100 Gb/s line rate of Omni-Path 100)."""
    nodes = _nodes("a100_omnipath", nodes)
    return replace(a100_nvlink(8 * nodes), name=f"{nodes} nodes × 8 A100 (4 Omni-Path)",
                   inter=Link(8e-6, SUSTAINED_NIC * 12.5e9), nics_per_node=4)


def a100_ethernet(nodes: int = 1) -> Cluster:
    """IBM's Vela (the fms-fsdp runs): 8 × A100 SXM4 80 GB on NVLink per node, 2 × 100 Gb/s
    Ethernet per node at its launch (IBM Research blog, 2023; from memory, unverified)."""
    nodes = _nodes("a100_ethernet", nodes)
    return replace(a100_nvlink(8 * nodes), name=f"{nodes} nodes × 8 A100 (2 × 100 GbE)",
                   inter=Link(10e-6, SUSTAINED_NIC * 12.5e9), nics_per_node=2)


def p100_pcie(devices: int = 8) -> Cluster:
    """One host of Tesla P100 PCIe 16 GB (GPipe's Table 3), float32.

    NVIDIA Tesla P100 datasheet: 9.3 TFLOP/s FP32 (18.7 FP16; no tensor cores), 16 GB
    HBM2 at 732 GB/s, 56 SMs, PCIe Gen3 x16 (15.75 GB/s each way). Without NVLink a copy
    between GPUs goes through host memory and crosses PCIe twice: half the PCIe rate, as
    for ``t4_pcie``.
    """
    devices = count("p100_pcie", "devices", devices)
    through_host = 15.75e9 / 2
    return _winograd(_gpu(f"{devices} × P100 (PCIe, float32)", devices, devices, 16,
                          ACHIEVABLE_SHARE * 9.3e12, 56, 732e9, through_host, 10e-6,
                          through_host, 10e-6, nic=False))


def _winograd(c: Cluster) -> Cluster:
    """float32 on CUDA cores: cuDNN's 3 x 3 convolutions by Winograd (``sim.gemm``)."""
    return replace(c, matrix=replace(c.matrix, winograd=WINOGRAD_F2X2_3X3))


def p100_roce(nodes: int = 1) -> Cluster:
    """Horovod's benchmark cluster: servers of 4 Pascal GPUs (P100 PCIe assumed) with one
    25 Gb/s RoCE card each (horovod docs/benchmarks.rst), float32: 9.3 TFLOP/s FP32 per
    GPU (P100 PCIe datasheet), PCIe inside a server as ``p100_pcie``."""
    nodes = _nodes("p100_roce", nodes)
    inside = p100_pcie(4)
    return replace(inside, name=f"{nodes} servers × 4 P100 (25 Gb/s RoCE)", devices=4 * nodes,
                   inter=Link(10e-6, SUSTAINED_NIC * 25e9 / 8), nics_per_node=1)


def p40_pcie(devices: int = 8) -> Cluster:
    """One host of Tesla P40 24 GB (torchgpipe's benchmarks), float32.

    NVIDIA Tesla P40 datasheet: 12 TFLOP/s FP32 (11.76 at the boost clock), 24 GB GDDR5 at
    346 GB/s, 30 SMs, PCIe Gen3 x16; copies between GPUs through host memory as
    ``p100_pcie`` (whether peer-to-peer was on is not stated).
    """
    devices = count("p40_pcie", "devices", devices)
    through_host = 15.75e9 / 2
    return _winograd(_gpu(f"{devices} × P40 (PCIe, float32)", devices, devices, 24,
                          ACHIEVABLE_SHARE * 11.76e12, 30, 346e9, through_host, 10e-6,
                          through_host, 10e-6, nic=False))


def gpu_presets() -> dict[str, Cluster]:
    """The hardware a learner may ask about, by name (for explorers)."""
    return {c.name: c for c in (t4_pcie(), a100_nvlink(), h100_nvlink(), h100_infiniband(2))}
