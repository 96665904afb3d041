"""Published figures of pipelines, convolutional networks, collectives and ZeRO's memory.

The companion of ``published_runs_lm`` (see ``published_runs``): each source's rows as
printed, one function per source.
"""
from __future__ import annotations

from .published_setups import (Cite, Collective, ConvNet, Parallel, Parameters, Run, Setup,
                               Transformer)

# ------------------------------------------------------------------ GPipe (2019)
GPIPE = Cite("Huang, Cheng, Bapna, Firat, Chen, Chen, Lee, Ngiam, Le, Wu, Chen", 2019,
             "arXiv:1811.06965", "Table 2")
GPIPE_T3 = Cite(GPIPE.authors, 2019, GPIPE.ref, "Table 3")
_GPIPE_VERIFIED = "stored paper text (GPipe section 3, Tables 1-3)"
_TFM48 = Transformer("Transformer-48", 48, 2048, 32, 32, 8192, 1024, 32000)
_AMOEBA = ConvNet("AmoebaNet-D (18, 256)", "AmoebaNet-D", (("L", 18), ("D", 256)),
                  (3, 224, 224), 1000, "kakaobrain/torchgpipe benchmarks/models/amoebanet")
# model, K, M, normalised throughput (Table 2; K=2 M=1 is 1; the Transformer's M=32 row
# is the in-sample check of parlab.sim.published and is left out)
_GPIPE_T2 = (("transformer", 4, 1, 1.07), ("transformer", 8, 1, 1.3),
             ("transformer", 2, 4, 1.7), ("transformer", 4, 4, 3.2),
             ("transformer", 8, 4, 4.8),
             ("amoebanet", 4, 1, 1.13), ("amoebanet", 8, 1, 1.38), ("amoebanet", 2, 4, 1.07),
             ("amoebanet", 4, 4, 1.26), ("amoebanet", 8, 4, 1.72), ("amoebanet", 2, 32, 1.21),
             ("amoebanet", 4, 32, 1.84), ("amoebanet", 8, 32, 3.48))
_GPIPE_NOTE = ("Normalised to K = 2, M = 1 of the same model. Batch and sequence are not "
               "stated ('batch size was adjusted to fit memory if necessary'); Table "
               "1's Transformer runs used sequence 1024, vocabulary 32k, batch 32, and its "
               "AmoebaNet runs 224 x 224 images, batch 128. 'TPUs' unspecified: v3 assumed "
               "(Table 1 ran AmoebaNet on v2). GPipe re-materialises every partition.")


def gpipe_2019() -> list[Run]:
    runs = []
    for name, k, m, value in _GPIPE_T2:
        model = _TFM48 if name == "transformer" else _AMOEBA
        setup = Setup(model, Parallel(k, None, None, pp=k, micro_batches=m, schedule="gpipe",
                                      recompute="full", precision="bf16"), "tpu_v3")
        base = Setup(model, Parallel(2, None, None, pp=2, micro_batches=1, schedule="gpipe",
                                     recompute="full", precision="bf16"), "tpu_v3")
        runs.append(Run(f"gpipe-{name}-k{k}-m{m}", "pipeline",
                        f"GPipe Table 2: {model.name}, K = {k} partitions, M = {m} "
                        "micro-batches, on TPUs", GPIPE, "normalised training throughput",
                        value, "x (K=2, M=1)", setup, base, "", (), _GPIPE_VERIFIED,
                        _GPIPE_NOTE))
    amoeba128 = ConvNet("AmoebaNet-D (18, 128)", "AmoebaNet-D", (("L", 18), ("D", 128)),
                        (3, 224, 224), 1000, _AMOEBA.code)
    tfm24 = Transformer("Transformer-24", 24, 2048, 32, 32, 8192, 1024, 32000)
    for model, short in ((amoeba128, "amoebanet"), (tfm24, "transformer")):
        base = Setup(model, Parallel(2, None, None, pp=2, micro_batches=32, schedule="gpipe",
                                     recompute="full", precision="fp32"), "p100_pcie")
        for k, value in ((4, 1.7 if short == "amoebanet" else 1.8),
                         (8, 2.7 if short == "amoebanet" else 3.3)):
            setup = Setup(model, Parallel(k, None, None, pp=k, micro_batches=32,
                                          schedule="gpipe", recompute="full",
                                          precision="fp32"), "p100_pcie")
            runs.append(Run(
                f"gpipe-p100-{short}-k{k}", "pipeline",
                f"GPipe Table 3: {model.name}, K = {k}, M = 32, P100 without NVLink",
                GPIPE_T3, "normalised training throughput", value, "x (K=2, M=32)", setup,
                base, "", (), _GPIPE_VERIFIED,
                "One host, P100s over PCIe through host memory; M = 32 throughout. Batch, "
                "precision (fp32 assumed) and the Transformer's widths (Table 1's 2048 / "
                "8192 / 32 heads assumed) are not stated."))
    return runs


# ------------------------------------------------------------------ torchgpipe (2019)
TORCHGPIPE = Cite("Lee, Jeong, Kim, Lim, Kim, Baek, Yoon (Kakao Brain)", 2019,
                  "https://github.com/kakaobrain/torchgpipe",
                  "benchmarks/amoebanetd-speed and unet-speed README.md")
_TGP_VERIFIED = ("kakaobrain/torchgpipe benchmarks/amoebanetd-speed and unet-speed: README.md "
                 "(results, 8 Tesla P40) and main.py (batch, chunks, balance, checkpoint)")
_UNET = ConvNet("U-Net (5, 64)", "U-Net", (("depth", 5), ("num_convs", 5),
                                           ("base_channels", 64)),
                (3, 192, 192), 1, "kakaobrain/torchgpipe benchmarks/models/unet")
# experiment, model, partitions, micro-batches, batch, balance, checkpoint, samples/s
_TGP = (("n2m1", _AMOEBA, 2, 1, 96, (7, 17), "full", 26.733),
        ("n2m32", _AMOEBA, 2, 32, 1280, (9, 15), "full-except-last", 47.386),
        ("n4m32", _AMOEBA, 4, 32, 1152, (3, 6, 7, 8), "full-except-last", 72.412),
        ("n8m4", _AMOEBA, 8, 4, 480, (2, 2, 2, 3, 3, 4, 4, 4), "full-except-last", 70.065),
        ("n8m32", _AMOEBA, 8, 32, 1280, (2, 2, 2, 3, 3, 4, 4, 4), "full-except-last", 132.413),
        ("baseline", _UNET, 1, 1, 40, (), "none", 28.500),
        ("pipeline-4", _UNET, 4, 16, 512, (30, 66, 84, 61), "full-except-last", 67.042),
        ("pipeline-8", _UNET, 8, 40, 640, (16, 27, 31, 44, 22, 57, 27, 17),
         "full-except-last", 88.497))


def torchgpipe_2019() -> list[Run]:
    runs = []
    for exp, model, k, m, batch, balance, ckpt, value in _TGP:
        par = Parallel(k, batch, batch // m, pp=k, micro_batches=m,
                       schedule="gpipe" if balance else "",
                       balance=balance, recompute=ckpt, precision="fp32")
        short = "amoebanet" if model is _AMOEBA else "unet"
        runs.append(Run(
            f"torchgpipe-{short}-{exp}", "pipeline",
            f"torchgpipe speed benchmark: {model.name}, {exp} (batch {batch}) on P40",
            TORCHGPIPE, "training throughput", value, "samples/s",
            Setup(model, par, "p40_pcie"), None, "", (), _TGP_VERIFIED,
            "FP32, plain SGD, synthetic inputs (AmoebaNet 3 x 224 x 224 over 1000 classes; "
            "U-Net 3 x 192 x 192 to one channel). Balance counts the layers of torchgpipe's "
            "nn.Sequential (AmoebaNet 24, U-Net 241). Mean over epochs 2-10 of 10,000 "
            "samples. The U-Net baseline is plain PyTorch on one GPU."))
    return runs


# ------------------------------------------------------------------ Horovod (2018)
HOROVOD = Cite("Sergeev, Del Balso (Horovod maintainers)", 2018,
               "arXiv:1802.05799; https://github.com/horovod/horovod",
               "docs/benchmarks.rst (512 GPUs); README of 2017 (128 GPUs)")
_CNNS = {"resnet101": ConvNet("ResNet-101", "ResNet", (("depth", 101),), (3, 224, 224), 1000),
         "inception3": ConvNet("Inception V3", "Inception", (("version", 3),), (3, 299, 299),
                               1000),
         "vgg16": ConvNet("VGG-16", "VGG", (("depth", 16),), (3, 224, 224), 1000)}
# model, GPUs, scaling efficiency
_HOROVOD = (("resnet101", 512, 0.90), ("inception3", 512, 0.90), ("vgg16", 512, 0.68),
            ("vgg16", 128, 0.79))


def horovod_2018() -> list[Run]:
    runs = []
    for key, gpus, value in _HOROVOD:
        model = _CNNS[key]
        setup = Setup(model, Parallel(gpus, 64 * gpus, 64, dp=gpus, precision="fp32"),
                      "p100_roce25")
        base = Setup(model, Parallel(1, 64, 64, precision="fp32"), "p100_roce25")
        runs.append(Run(
            f"horovod-{key}-{gpus}", "dp_scaling",
            f"Horovod benchmark: {model.name} on {gpus} Pascal GPUs ({gpus // 4} servers), "
            "25 Gb/s RoCE", HOROVOD, "scaling efficiency", value, "fraction of linear",
            setup, base, "", (),
            "horovod/horovod docs/benchmarks.rst and README (stored; the 128-GPU VGG-16 "
            "figure in the 2017 README)",
            "tf_cnn_benchmarks, synthetic data, batch 64 per GPU (the reproduction "
            "command). Not stated: the Pascal model (P100 assumed), precision (fp32 "
            "assumed), TensorFlow version; efficiency = throughput over N x one GPU's."))
    return runs


# ------------------------------------------------------------------ ZeRO (2020) memory
ZERO = Cite("Rajbhandari, Rasley, Ruwase, He", 2020, "arXiv:1910.02054", "Table 1")
_ZERO_VERIFIED = "stored paper text (ZeRO section 5, Table 1)"
# parameters, stage, data-parallel degree, GB per device
_ZERO = ((7.5e9, 1, 64, 31.4), (7.5e9, 2, 64, 16.6), (7.5e9, 3, 64, 1.88),
         (1e12, 3, 1024, 15.6))


def zero_2020() -> list[Run]:
    runs = []
    stages = {1: "P_os", 2: "P_os+g", 3: "P_os+g+p"}
    for count, stage, nd, gb in _ZERO:
        name = "7.5B" if count < 1e10 else "1T"
        setup = Setup(Parameters(f"{name} parameters", count),
                      Parallel(nd, None, None, dp=nd, zero=stage), "dgx2h")
        runs.append(Run(
            f"zero-{name.lower().replace('.', 'p')}-stage{stage}-dp{nd}", "sharded",
            f"ZeRO Table 1: {name} model, {stages[stage]}, {nd}-way data parallel", ZERO,
            "model-state memory per device", gb, "GB", setup, None, "", (), _ZERO_VERIFIED,
            "Model states only: 2 (fp16 parameters) + 2 (fp16 gradients) + K = 12 (Adam in "
            "mixed precision) bytes per parameter, the sharded parts divided by N_d; "
            "activations and buffers excluded. GB = 1e9 bytes (120 GB unsharded for 7.5B)."))
    return runs


# ------------------------------------------------------------------ nccl-tests bus bandwidth
_GIB = 2 ** 30
_SJ = "Jeaugey (NVIDIA NCCL team)"
_NCCL_TESTS_149 = Cite(_SJ, 2023, "https://github.com/NVIDIA/nccl-tests/issues/149",
                       "comment of 2023-07-05")
_NCCL_TESTS_212 = Cite(_SJ, 2024, "https://github.com/NVIDIA/nccl-tests/issues/212",
                       "comment of 2024-05-06")
_NCCL_812 = Cite("AddyLaddy (NVIDIA NCCL team)", 2023, "https://github.com/NVIDIA/nccl/issues/812",
                 "comment quoted in NVIDIA/nccl#1576")
_NCCL_412 = Cite(_SJ, 2023, "https://github.com/NVIDIA/nccl/issues/412", "comment of 2023-04-24")
_NCCL_307 = Cite(_SJ, 2020, "https://github.com/NVIDIA/nccl/issues/307", "comment of 2020-03-20")
# id, cite, hardware, GPUs (None: not stated), message bytes, algorithm, busbw GB/s, note
_NCCL = (
    ("nccl-a100-8gpu", _NCCL_TESTS_149, "selene", 8, 8 * _GIB, "default", 230,
     "'The total effective bandwidth should therefore be 240GB/s on A100, but some other "
     "bottlenecks on the GPUs limits it to ~230GB/s', at 8 GB messages."),
    ("nccl-h100-8gpu-ring", _NCCL_TESTS_212, "dgx_h100", 8, 8 * _GIB, "ring", 370,
     "'an effective NVLink bandwidth of 370GB/s ... when running with NCCL_ALGO=RING' "
     "(line rate 450). Message size: 'larger sizes' than 256 MB, 8 GB assumed."),
    ("nccl-h100-8gpu-nvls", _NCCL_TESTS_212, "dgx_h100", 8, 8 * _GIB, "nvls", 480,
     "All-reduce uses NVLink SHARP by default: 'peak busBw of ~480GB/s (algbw ~275GB/s)'. "
     "Message size 8 GB assumed."),
    ("nccl-a100-multinode-8hdr", _NCCL_812, "selene", None, 8 * _GIB, "ring", 192,
     "'On an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s "
     "AllReduce BusBW' (across nodes, rings). Node count and message size not stated."),
    ("nccl-a800-8gpu", _NCCL_412, "a800_1hdr", 8, 8 * _GIB, "default", 160,
     "'looking at the BusBW at a size of 8G, you should get ~160GB/s intra-node'."),
    ("nccl-a800-12node-1hdr", _NCCL_412, "a800_1hdr", 96, 8 * _GIB, "default", 24,
     "12 nodes of 8 A800, one 200 Gb/s HDR card each: '24GB/s inter-node' at 8 GB."),
    ("nccl-dgx1-4edr", _NCCL_307, "dgx1_v100", None, 2 * _GIB, "ring", 47,
     "'I always get 47 GB/s on DGX-1 nodes (except with 2 nodes / trees where I get 58)'; "
     "'~12 GB/s with each NIC'. Node count not stated (more than 2); 2 GB assumed."),
)


def nccl() -> list[Run]:
    return [Run(rid, "collective", f"nccl-tests all_reduce_perf bus bandwidth: {rid[5:]}",
                cite, "all-reduce bus bandwidth (nccl-tests busbw)", busbw, "GB/s",
                Setup(Collective("all_reduce", nbytes, "float32", algo),
                      Parallel(gpus, None, None, dp=gpus or 1, precision="fp32"), hw),
                None, "", (), f"stored issue thread {cite.ref.split('github.com/')[1]}",
                "busbw = algbw x 2(n - 1)/n (nccl-tests doc/PERFORMANCE.md); for NVLink "
                "SHARP and trees it is not a wire bandwidth. " + note)
            for rid, cite, hw, gpus, nbytes, algo, busbw, note in _NCCL]


def runs() -> list[Run]:
    return gpipe_2019() + torchgpipe_2019() + horovod_2018() + zero_2020() + nccl()
