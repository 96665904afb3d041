"""What a published run was: its model, its parallel layout and its hardware, as plain data.

The records of ``published_runs`` are built from these types. Nothing here predicts
anything: a field holds what the source states, ``None`` where the source does not
state it (the run's note then says so), and every hardware record names the sim preset
that stands in for it. Framework-free: no torch, no tensorflow, no sim model.

Conventions
    sizes       ``hidden``, ``ffn`` are widths; ``seq`` tokens per sequence; ``vocab`` the
                embedding rows (padded, as trained)
    batches     ``global_batch`` sequences (images) per optimizer step, ``micro_batch``
                per pipeline micro-batch and data-parallel rank; ``micro_batches`` (GPipe's
                M) where the source gives the count but not the sizes
    layout      ``gpus = tp * pp * dp * cp``; ``interleave`` model chunks per pipeline
                rank (Narayanan et al., 2021, section 2.2.2), 1 without interleaving
    sharding    ``zero`` the ZeRO stage (Rajbhandari et al., 2020): 1 optimizer states,
                2 and gradients, 3 and parameters; ``sharding`` "fsdp" (over all data-
                parallel ranks) or "hsdp" (within a node, replicated across nodes)
    recompute   "none", "full" (every layer's forward again in backward), "selective"
                (attention's core only, Korthikanti et al., 2022), "full-except-last"
                (GPipe: all micro-batches but the last), or None (not stated)
    hardware    datasheet PEAKS, not sustained figures (the presets derate them)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cite:
    """Where a figure is printed: authors, year, arXiv id or URL, and table/figure."""

    authors: str
    year: int
    ref: str
    where: str

    def __str__(self) -> str:
        return f"{self.authors} ({self.year}), {self.ref}, {self.where}"


@dataclass(frozen=True)
class Transformer:
    """A decoder-style language model (or GPipe's Transformer-L), every width explicit."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int          # == heads without grouped-query attention
    ffn: int               # MLP width: 4 * hidden for GPT, the gated width for SwiGLU
    seq: int
    vocab: int
    mlp: str = "gelu"      # "gelu" | "relu" | "swiglu" (gated: three hidden x ffn matrices)


def gpt(name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int,
        mlp: str = "gelu") -> Transformer:
    """A GPT-2/3-style block: multi-head attention, MLP of 4 * hidden."""
    return Transformer(name, layers, hidden, heads, heads, 4 * hidden, seq, vocab, mlp)


@dataclass(frozen=True)
class ConvNet:
    """A convolutional network, named by its architecture and hyper-parameters.

    ``params`` are the architecture's own knobs as the source names them, e.g.
    (("L", 18), ("D", 256)) for AmoebaNet-D (L, D): L normal-cell layers, D filters.
    ``code`` points at the definition that fixes every layer (the source's own code)."""

    name: str
    arch: str
    params: tuple
    image: tuple           # (channels, height, width) of one input
    outputs: int           # classes, or output channels of a segmentation map
    code: str = ""


@dataclass(frozen=True)
class Parameters:
    """A model known only by its parameter count (ZeRO's memory analysis)."""

    name: str
    count: float
    optimizer_bytes_per_param: int = 12      # K in ZeRO: mixed-precision Adam


@dataclass(frozen=True)
class Collective:
    """One collective as nccl-tests runs it."""

    op: str                # "all_reduce"
    nbytes: int
    dtype: str
    algorithm: str         # "ring" | "nvls" (NVLink SHARP) | "default" (NCCL's choice)


@dataclass(frozen=True)
class Parallel:
    """How the run spread its work; None where the source does not say."""

    gpus: int
    global_batch: int | None
    micro_batch: int | None
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    interleave: int | None = 1
    micro_batches: int | None = None   # per step and pipeline (GPipe's M), where stated
    schedule: str = ""             # "" (no pipeline) | "gpipe" | "1f1b" | "interleaved"
    balance: tuple = ()            # layers per pipeline stage, where the source fixes it
    zero: int = 0
    sharding: str = ""             # "" | "fsdp" | "hsdp"
    recompute: str | None = "none"
    sequence_parallel: bool = False
    precision: str = "fp16"        # "fp16" | "bf16" | "fp32" mixed-precision training


@dataclass(frozen=True)
class Setup:
    """One configuration: what ran, how, on which hardware (a key of ``HARDWARE``)."""

    model: object
    parallel: Parallel
    hardware: str


#: How a FLOP/s figure counts FLOPs (B global batch, s seq, l layers, h hidden, V vocab).
FLOPS = {
    "megatron-hfu": "96 B s l h^2 (1 + s/6h + V/16lh) per step: forward, backward and the "
                    "recomputed forward (Narayanan et al. 2021, section 5.1)",
    "megatron-mfu": "72 B s l h^2 (1 + s/6h + V/12lh) per step: forward and backward only "
                    "(Korthikanti et al. 2022, model FLOPs)",
    "palm-mfu": "6 N + 12 l h s per token, N the parameters (Chowdhery et al. 2022, appendix "
                "B), over the BF16 dense peak",
    "8N": "8 N per token (forward, backward and recomputed forward), bigscience "
          "math/README.md 'calculate TFLOPs'",
    "unstated": "the source gives the figure without its FLOP count",
}


@dataclass(frozen=True)
class Run:
    """One published figure and everything needed to predict it.

    ``value`` is as printed (a fraction for percentages). ``baseline`` is the setup a
    relative metric divides by (weak scaling: per-GPU throughput over the baseline's;
    normalised throughput: samples/s over the baseline's). ``columns`` keeps the row's
    other printed numbers, (label, value), so that transcription can be cross-checked.
    ``verified`` names the stored copy the value was read in; "" means it was not, and
    the note then says "from memory, unverified".
    """

    id: str
    kind: str
    title: str
    cite: Cite
    metric: str
    value: float
    unit: str
    setup: Setup
    baseline: Setup | None = None
    flops: str = ""
    columns: tuple = ()
    verified: str = ""
    note: str = ""

    @property
    def hardware(self) -> "Hardware":
        return HARDWARE[self.setup.hardware]

    @property
    def preset(self) -> str:
        """The sim preset that stands in for this run's hardware."""
        return self.hardware.preset


@dataclass(frozen=True)
class Hardware:
    """A machine as its datasheets describe it, and the preset that stands in for it.

    ``preset`` names the function of ``parlab.sim.clusters`` (or ``parlab.sim.published``)
    that stands in for it (``parlab.sim.validate`` builds it at the run's size).
    """

    gpu: str
    peak_tflops: float     # dense tensor peak per device, in the precision its runs used
    memory_gb: float
    memory_gbs: float      # memory bandwidth, GB/s
    per_node: int
    intra: str             # "NVSwitch" | "NVLink mesh" | "PCIe" | "TPU interconnect"
    intra_gbs: float       # per device, each direction, GB/s
    nics: int              # network cards per node (0: one node only)
    nic_gbps: float        # per card, Gb/s
    network: str
    preset: str
    source: str


_A100 = ("NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): 312 "
         "TFLOP/s dense FP16/BF16, 80 GB HBM2e at 2039 GB/s, NVLink 3 300 GB/s each way")
_H100 = ("NVIDIA H100 datasheet: 989 TFLOP/s dense BF16, 80 GB HBM3 at 3.35 TB/s, NVLink 4 "
         "450 GB/s each way")

HARDWARE: dict[str, Hardware] = {
    "dgx2h": Hardware(
        "V100 SXM3 32GB", 125, 32, 900, 16, "NVSwitch", 150, 8, 100, "InfiniBand EDR",
        "v100_dgx2h",
        "Shoeybi et al. 2019, section 5: 512 V100 in 32 DGX-2H, 300 GB/s between GPUs via "
        "NVSwitch, 8 InfiniBand adapters per server (100 GB/s per server)"),
    "dgx1_v100": Hardware(
        "V100 SXM2", 125, 16, 900, 8, "NVLink mesh", 150, 4, 100, "InfiniBand EDR",
        "v100_dgx1",
        "NVIDIA DGX-1 datasheet (from memory, unverified): 8 V100 SXM2, NVLink 2 hybrid "
        "cube-mesh, 4 x 100 Gb/s EDR InfiniBand"),
    "dgx_a100_40gb": Hardware(
        "A100 SXM4 40GB", 312, 40, 1555, 8, "NVSwitch", 300, 8, 200, "InfiniBand HDR",
        "a100_nvlink",
        _A100 + " (40 GB part: 1555 GB/s); DGX A100 datasheet: 8 ConnectX-6 HDR 200 Gb/s"),
    "selene": Hardware(
        "A100 SXM4 80GB", 312, 80, 2039, 8, "NVSwitch", 300, 8, 200, "InfiniBand HDR",
        "a100_nvlink",
        _A100 + "; Selene = DGX A100 SuperPOD, 8 ConnectX-6 HDR 200 Gb/s per node for "
        "compute (DGX A100 datasheet); Megatron-LM README (2022): 8 80GB A100 per node"),
    "a800_1hdr": Hardware(
        "A800 SXM4 80GB", 312, 80, 2039, 8, "NVSwitch", 200, 1, 200, "InfiniBand HDR",
        "a800_nodes",
        "A800: an A100 whose NVLink carries 400 GB/s both ways together (datasheet, from "
        "memory); NVIDIA/nccl#412: 8 NVLink A800 per node, one 200G HDR card per node"),
    "jean_zay_a100": Hardware(
        "A100 SXM4 80GB", 312, 80, 2039, 8, "NVSwitch", 300, 4, 100, "Omni-Path",
        "a100_omnipath",
        _A100 + "; bigscience tr11-176B-ml README: 8 GPUs per node, NVLink, 4 OmniPath "
        "links per node (100 Gb/s each: Omni-Path line rate, from memory)"),
    "azure_ndm_a100": Hardware(
        "A100 SXM4 80GB", 312, 80, 2039, 8, "NVSwitch", 300, 8, 200, "InfiniBand HDR",
        "a100_nvlink",
        _A100 + "; OPT-175B's cluster: Azure NDm A100 v4, 8 x 200 Gb/s HDR per VM "
        "(from memory, unverified: the OPT paper names only 992 80GB A100)"),
    "vela_a100": Hardware(
        "A100 SXM4 80GB", 312, 80, 2039, 8, "NVSwitch", 300, 2, 100, "Ethernet",
        "a100_ethernet",
        _A100 + "; IBM Vela nodes: 2 x 100 Gb/s Ethernet at launch (IBM Research blog "
        "2023, from memory, unverified; the network was upgraded later)"),
    "dgx_h100": Hardware(
        "H100 SXM5 80GB", 989, 80, 3350, 8, "NVSwitch", 450, 8, 400, "InfiniBand NDR",
        "h100_nodes", _H100 + "; DGX H100 user guide: 8 ConnectX-7 400 Gb/s per node"),
    "grand_teton_h100": Hardware(
        "H100 SXM5 80GB (700 W)", 989, 80, 3350, 8, "NVSwitch", 450, 8, 400, "RoCE",
        "h100_infiniband",
        _H100 + "; Llama 3 paper section 3.3.1: 8 GPUs per server on NVLink, RoCE, "
        "400 Gbps interconnects between GPUs"),
    "tpu_v3": Hardware(
        "TPU v3 core", 61.5, 16, 450, 8, "TPU interconnect", 50, 0, 0, "",
        "tpu_v3_cores (parlab.sim.published)",
        "Google Cloud TPU v3: 123 TFLOP/s bf16 and 32 GiB HBM per chip of 2 cores; 900 GB/s "
        "HBM per chip (from memory); the inter-core link is tpu_v3_cores' assumption"),
    "p100_pcie": Hardware(
        "Tesla P100 PCIe 16GB", 18.7, 16, 732, 8, "PCIe", 15.75, 0, 0, "",
        "p100_pcie",
        "NVIDIA Tesla P100 datasheet: 18.7 TFLOP/s FP16 (9.3 FP32), 16 GB HBM2 at 732 GB/s, "
        "PCIe Gen3 x16; GPipe Table 3: one host, no NVLink"),
    "p100_roce25": Hardware(
        "Pascal (P100 assumed)", 9.3, 16, 732, 4, "PCIe", 15.75, 1, 25, "RoCE",
        "p100_roce",
        "Horovod docs/benchmarks.rst: 128 servers with 4 Pascal GPUs each, RoCE-capable "
        "25 Gbit/s network; P100 PCIe datasheet: 9.3 TFLOP/s FP32"),
    "p40_pcie": Hardware(
        "Tesla P40 24GB", 11.76, 24, 346, 8, "PCIe", 15.75, 0, 0, "",
        "p40_pcie",
        "torchgpipe benchmarks/*/README.md: 8 Tesla P40 GPUs; NVIDIA Tesla P40 datasheet: "
        "12 TFLOP/s FP32 (11.76 at base boost), 24 GB GDDR5 at 346 GB/s, PCIe Gen3 x16"),
}
