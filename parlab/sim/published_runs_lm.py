"""Published figures of GPT-style language-model training (see ``published_runs``).

Each source's table is transcribed as printed, one tuple a row, and turned into ``Run``
records by one function per source, so a row can be read against the source at a glance.
Where a value was read: the ``verified`` field. What the source leaves open: the note.
"""
from __future__ import annotations

from .published_setups import Cite, Parallel, Run, Setup, Transformer, gpt

# ------------------------------------------------------------------ Megatron-LM (2019)
SHOEYBI = Cite("Shoeybi, Patwary, Puri, LeGresley, Casper, Catanzaro", 2019,
               "arXiv:1909.08053", "Table 1 and Figure 5")
_MLM19_VERIFIED = ("stored paper text (Megatron-LM, section 5.1, Table 1, Figure 5 bar "
                   "labels 100/95/82/77 and 96/83/79/74 %)")
_MLM19 = {1: ("1.2B", 1536, 16, 40), 2: ("2.5B", 1920, 20, 54), 4: ("4.2B", 2304, 24, 64),
          8: ("8.3B", 3072, 32, 72)}


def _mlm19_model(tp: int) -> Transformer:
    name, hidden, heads, layers = _MLM19[tp]
    return gpt(f"GPT-2 {name}", layers, hidden, heads, 1024, 51200)


def _mlm19_setup(tp: int, dp: int, batch: int) -> Setup:
    return Setup(_mlm19_model(tp), Parallel(tp * dp, batch, batch // dp, tp=tp, dp=dp,
                                            recompute="full"), "dgx2h")


_MLM19_NOTE = ("Weak scaling: per-GPU FLOP/s over the 1.2B model's on one V100 (39 TFLOP/s, "
               "30 % of peak; the abstract's 15.1 PFLOP/s on 512 GPUs is 76 % of 512 x 39). "
               "Batch 8 for model parallel, 512 (64-way data parallel) for "
               "model+data. Recomputation after every layer: from memory, unverified. The "
               "8-way point (77 %) is the in-sample check and is not repeated here.")


def megatron_2019() -> list[Run]:
    base = _mlm19_setup(1, 1, 8)
    runs = [Run(f"shoeybi19-tp{tp}", "tp_scaling",
                f"Megatron-LM Figure 5: {_MLM19[tp][0]} on {tp}-way tensor parallel",
                SHOEYBI, "weak scaling efficiency", value, "fraction of linear",
                _mlm19_setup(tp, 1, 8), base, "unstated", (), _MLM19_VERIFIED, _MLM19_NOTE)
            for tp, value in ((2, 0.95), (4, 0.82))]
    runs += [Run(f"shoeybi19-tp{tp}-dp64", "dp_scaling",
                 f"Megatron-LM Figure 5: {_MLM19[tp][0]}, {tp}-way tensor x 64-way data "
                 f"parallel on {64 * tp} GPUs", SHOEYBI, "weak scaling efficiency", value,
                 "fraction of linear", _mlm19_setup(tp, 64, 512), base, "unstated", (),
                 _MLM19_VERIFIED, _MLM19_NOTE)
             for tp, value in ((1, 0.96), (2, 0.83), (4, 0.79), (8, 0.74))]
    return runs


# ------------------------------------------------------------------ Megatron-LM README (2020)
README_2020 = Cite("NVIDIA Megatron-LM maintainers", 2020,
                   "https://github.com/NVIDIA/Megatron-LM (README at commit 5281919420)",
                   "images/cases.png, scaling-mp.png, scaling-dp.png")
_README_VERIFIED = "NVIDIA/Megatron-LM git history, commit 5281919420, README images"
_CASES = {"1B": (1920, 15, 24), "2B": (2304, 18, 30), "4B": (3072, 24, 36),
          "8B": (4096, 32, 42)}
_PARAMS_B = {"1B": 1.16, "2B": 2.03, "4B": 4.24, "8B": 8.67}       # cases.png, billions
_TP_OF = {"1B": 1, "2B": 2, "4B": 4, "8B": 8}
# case, GPUs, iteration ms, scaling, TFLOP/s per GPU -- as printed
_README_V100 = (("1B", 1, 1121, 1.0, 71.9), ("2B", 2, 1093, 0.896, 64.2),
                ("4B", 4, 1238, 0.825, 58.5), ("8B", 8, 1407, 0.743, 52.2))
_README_A100 = (("1B", 1, 1076, 1.0, 149.8), ("2B", 2, 1026, 0.917, 136.8),
                ("4B", 4, 1162, 0.845, 124.7), ("8B", 8, 1343, 0.747, 109.3))
_README_DP = (("1B", 128, 1153, 0.933, 139.8), ("2B", 256, 1101, 0.855, 127.5),
              ("4B", 512, 1242, 0.790, 116.7), ("8B", 1024, 1380, 0.727, 106.5))
_README_NOTE = ("Vocabulary 51,200, sequence 1024 (README text). The TFLOP/s column is "
                "reproduced by the 96 B s l h^2 count, so activations were recomputed. The "
                "scaling column is (parameters / 1B's) x (1B's iteration time / this one) / "
                "GPUs -- a parameter ratio, not the TFLOP/s ratio (checked on every row). "
                "DGX-2 read as the DGX-2H of the 2019 paper; DGX-A100 of September 2020 read "
                "as the 40 GB part; its network (8 HDR cards) is not stated. fp16 assumed.")


def _readme_setup(case: str, gpus: int, batch: int, hardware: str) -> Setup:
    hidden, heads, layers = _CASES[case]
    tp = _TP_OF[case]
    model = gpt(f"GPT-2 {case}", layers, hidden, heads, 1024, 51200)
    dp = gpus // tp
    return Setup(model, Parallel(gpus, batch * dp, batch, tp=tp, dp=dp, recompute="full"),
                 hardware)


def megatron_readme_2020() -> list[Run]:
    runs = []
    for rows, batch, hw, label in ((_README_V100, 8, "dgx2h", "v100"),
                                   (_README_A100, 16, "dgx_a100_40gb", "a100")):
        base = _readme_setup("1B", 1, batch, hw)
        for case, gpus, ms, scaling, tflops in rows:
            cols = (("iteration ms", ms), ("TFLOP/s per GPU", tflops),
                    ("parameters B", _PARAMS_B[case]))
            if gpus == 1:
                runs.append(Run(
                    f"mlm20-{label}-1b-step", "llm_throughput",
                    f"Megatron-LM README 2020: 1B GPT on one {label.upper()}, batch {batch}",
                    README_2020, "iteration time", ms / 1000, "s",
                    _readme_setup(case, 1, batch, hw), None, "megatron-hfu",
                    cols, _README_VERIFIED, _README_NOTE))
                continue
            runs.append(Run(
                f"mlm20-{label}-tp{gpus}", "tp_scaling",
                f"Megatron-LM README 2020: {case} GPT on {gpus}-way tensor parallel "
                f"({label.upper()}, batch {batch})", README_2020, "weak scaling efficiency",
                scaling, "fraction of linear", _readme_setup(case, gpus, batch, hw), base,
                "megatron-hfu", cols, _README_VERIFIED, _README_NOTE))
    base = _readme_setup("1B", 1, 16, "dgx_a100_40gb")
    for case, gpus, ms, scaling, tflops in _README_DP:
        runs.append(Run(
            f"mlm20-a100-dp128-{case.lower()}", "dp_scaling",
            f"Megatron-LM README 2020: {case} GPT, 128-way data x {_TP_OF[case]}-way tensor "
            f"parallel on {gpus} A100, batch 2048", README_2020, "weak scaling efficiency",
            scaling, "fraction of linear", _readme_setup(case, gpus, 16, "dgx_a100_40gb"),
            base, "megatron-hfu", (("iteration ms", ms), ("TFLOP/s per GPU", tflops),
                                   ("parameters B", _PARAMS_B[case])),
            _README_VERIFIED, _README_NOTE))
    return runs


# ------------------------------------------------------------------ Narayanan et al. (2021)
NARAYANAN = Cite("Narayanan, Shoeybi, Casper, LeGresley, Patwary, Korthikanti, Vainbrand, "
                 "Kashinkunti, Bernauer, Catanzaro, Phanishayee, Zaharia", 2021,
                 "arXiv:2104.04473", "Table 1")
# size, heads, hidden, layers, t, p, GPUs, batch, micro-batch, chunks per rank,
# TFLOP/s per GPU, % of peak, aggregate PFLOP/s
_PTDP = (("1.7b", 24, 2304, 24, 1, 1, 32, 512, 16, 1, 137, 44, 4.4),
         ("3.6b", 32, 3072, 30, 2, 1, 64, 512, 16, 1, 138, 44, 8.8),
         ("7.5b", 32, 4096, 36, 4, 1, 128, 512, 16, 1, 142, 46, 18.2),
         ("18b", 48, 6144, 40, 8, 1, 256, 1024, 8, 1, 135, 43, 34.6),
         ("39b", 64, 8192, 48, 8, 2, 512, 1536, 4, 1, 138, 44, 70.8),
         ("76b", 80, 10240, 60, 8, 4, 1024, 1792, 2, 3, 140, 45, 143.8),
         ("145b", 96, 12288, 80, 8, 8, 1536, 2304, 2, 2, 148, 47, 227.1),
         ("310b", 128, 16384, 96, 8, 16, 1920, 2160, 1, 2, 155, 50, 297.4),
         ("530b", 128, 20480, 105, 8, 35, 2520, 2520, 1, 3, 163, 52, 410.2),
         ("1t", 160, 25600, 128, 8, 64, 3072, 3072, 1, 1, 163, 52, 502.0))
_PTDP_VERIFIED = ("NVIDIA/Megatron-LM README image cases_april2021.png (commit e64507f06d) "
                  "and examples/sc21/run_table_1.sh (heads, micro-batch, virtual stages)")
_PTDP_NOTE = ("Selene, 80 GB A100. Sequence 2048, vocabulary 51,200, fp16, activations "
              "recomputed (--activations-checkpoint-method uniform). Chunks per rank from "
              "--num-layers-per-virtual-pipeline-stage. FLOP/s count recomputation.")


def narayanan_2021() -> list[Run]:
    runs = []
    for (size, heads, hidden, layers, t, p, gpus, batch, micro, chunks, tflops, pct,
         pflops) in _PTDP:
        par = Parallel(gpus, batch, micro, tp=t, pp=p, dp=gpus // (t * p), interleave=chunks,
                       schedule="interleaved" if chunks > 1 else ("1f1b" if p > 1 else ""),
                       recompute="full")
        runs.append(Run(
            f"narayanan21-{size}", "llm_throughput",
            f"Narayanan et al. Table 1: {size.upper()} GPT on {gpus} A100 (t={t}, p={p})",
            NARAYANAN, "achieved TFLOP/s per GPU", tflops, "TFLOP/s",
            Setup(gpt(f"GPT {size.upper()}", layers, hidden, heads, 2048, 51200), par,
                  "selene"), None, "megatron-hfu",
            (("% of peak", pct), ("aggregate PFLOP/s", pflops)), _PTDP_VERIFIED, _PTDP_NOTE))
    return runs


# ------------------------------------------------------------------ Korthikanti et al. (2022)
KORTHIKANTI = Cite("Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi, Catanzaro", 2022,
                   "arXiv:2205.05198", "Tables 3 and 5")
# size, heads, hidden, layers, t, p, GPUs (= batch), MFU %, HFU %, iteration s with
# sequence parallel + selective recompute, iteration s with full recompute
_SP = (("22b", 64, 6144, 48, 8, 1, 8, 4, 41.5, 43.7, 1.10, 1.42),
       ("175b", 96, 12288, 96, 8, 8, 64, 64, 51.4, 52.8, 13.75, 18.13),
       ("530b", 128, 20480, 105, 8, 35, 280, 280, 56.0, 57.0, 37.83, 49.05),
       ("1t", 160, 25600, 128, 8, 64, 512, 512, 56.3, 57.0, 71.49, 94.42))
_SP_VERIFIED = ("NVIDIA/Megatron-LM README at commit 2e90a342f5 (2022-05-19): MFU / HFU "
                "table, 'measured using a data parallel size of one'")
_SP_NOTE = ("MFU verified; model sizes, layout, batch and iteration times are Tables 3 and 5 "
            "from memory, unverified -- they reproduce the verified MFU to 0.1 % with the "
            "72 B s l h^2 count. Sequence 2048, vocabulary 51,200, micro-batch 1, 80 GB A100 "
            "(Selene), fp16 assumed. Whether the pipeline was interleaved is not recorded here.")


def _sp_setup(row, recompute: str, sequence_parallel: bool) -> Setup:
    size, heads, hidden, layers, t, p, gpus, batch = row[:8]
    return Setup(gpt(f"GPT {size.upper()}", layers, hidden, heads, 2048, 51200),
                 Parallel(gpus, batch, 1, tp=t, pp=p, dp=1, interleave=None,
                          schedule="1f1b" if p > 1 else "", recompute=recompute,
                          sequence_parallel=sequence_parallel), "selene")


def korthikanti_2022() -> list[Run]:
    runs = [Run(f"korthikanti22-{row[0]}", "llm_throughput",
                f"Korthikanti et al.: {row[0].upper()} GPT, sequence parallel and selective "
                f"recomputation on {row[6]} A100", KORTHIKANTI, "model FLOPs utilisation",
                row[8] / 100, "fraction of peak", _sp_setup(row, "selective", True), None,
                "megatron-mfu", (("HFU %", row[9]), ("iteration s (memory)", row[10])),
                _SP_VERIFIED, _SP_NOTE) for row in _SP]
    runs += [Run(f"korthikanti22-{row[0]}-fullrecompute", "llm_throughput",
                 f"Korthikanti et al. Table 5: {row[0].upper()} GPT, full recomputation, "
                 f"{row[6]} A100", KORTHIKANTI, "iteration time", row[11], "s",
                 _sp_setup(row, "full", False), None, "megatron-mfu", (), "",
                 "Iteration time from memory, unverified (Table 5 'full recompute' column); "
                 "tensor parallel without sequence parallelism. " + _SP_NOTE)
             for row in _SP[:2]]
    return runs


# ------------------------------------------------------------------ Megatron-Core on H100 (2024)
MCORE = Cite("NVIDIA Megatron-LM maintainers", 2024,
             "https://github.com/NVIDIA/Megatron-LM (README at commit f2e5db402c)",
             "images/model_table.png and the strong-scaling paragraph")
_MCORE_VERIFIED = "NVIDIA/Megatron-LM git history, commit f2e5db402c, README and model_table.png"
# size, heads, hidden, layers, TP, PP, DP, GPUs, batch, TFLOP/s per GPU, MFU %, PFLOP/s
_MCORE_ROWS = (("1.7b", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8, 41, 19.6),
               ("7.1b", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9, 47, 44.7),
               ("16b", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1, 49, 93.9),
               ("32b", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6, 46, 176.5),
               ("70b", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7, 42, 322.3),
               ("119b", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5, 43, 645.9),
               ("177b", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8, 44, 997.2),
               ("314b", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4, 48, 1457.4),
               ("462b", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9, 47, 2825.6))
_MCORE_NOTE = ("Megatron-Core r0.8.0 on H100 (DGX H100 assumed). Vocabulary 131,072, "
               "sequence 4096, BF16; data-parallel gradient reduce and parameter gather "
               "overlapped (a parameter gather implies the distributed optimizer, ZeRO-1-"
               "like: inferred), tensor-parallel "
               "communication overlapped. Not stated: micro-batch, interleaving, "
               "recomputation, FFN width (4h assumed), the FLOP count (72 B s l h^2 assumed).")


def _mcore_setup(row, gpus: int) -> Setup:
    size, heads, hidden, layers, tp, pp, _, _, batch = row[:9]
    return Setup(gpt(f"GPT {size.upper()}", layers, hidden, heads, 4096, 131072),
                 Parallel(gpus, batch, None, tp=tp, pp=pp, dp=gpus // (tp * pp),
                          interleave=None, schedule="1f1b" if pp > 1 else "", zero=1,
                          recompute=None, precision="bf16"), "dgx_h100")


def megatron_core_2024() -> list[Run]:
    runs = [Run(f"mcore24-{row[0]}", "llm_throughput",
                f"Megatron-Core weak scaling: {row[0].upper()} GPT on {row[7]} H100 "
                f"(TP {row[4]}, PP {row[5]}, DP {row[6]})", MCORE, "model TFLOP/s per GPU",
                row[9], "TFLOP/s", _mcore_setup(row, row[7]), None, "megatron-mfu",
                (("MFU %", row[10]), ("aggregate PFLOP/s", row[11])), _MCORE_VERIFIED,
                _MCORE_NOTE) for row in _MCORE_ROWS]
    gpt3 = _MCORE_ROWS[6]
    strong = ("Strong scaling of the 177B model (GPT-3 with a larger vocabulary), batch 1152 "
              "throughout: MFU 47 % on 96 GPUs, 42 % on 4608. TP 8 x PP 6 assumed as in the "
              "weak-scaling row (not stated for these runs). ")
    runs.append(Run("mcore24-177b-96gpu", "llm_throughput",
                    "Megatron-Core strong scaling: 177B GPT on 96 H100, batch 1152", MCORE,
                    "model FLOPs utilisation", 0.47, "fraction of peak",
                    _mcore_setup(gpt3, 96), None, "megatron-mfu", (), _MCORE_VERIFIED,
                    strong + _MCORE_NOTE))
    runs.append(Run("mcore24-177b-4608gpu", "dp_scaling",
                    "Megatron-Core strong scaling: 177B GPT on 4608 H100, batch 1152", MCORE,
                    "model FLOPs utilisation", 0.42, "fraction of peak",
                    _mcore_setup(gpt3, 4608), None, "megatron-mfu", (), _MCORE_VERIFIED,
                    strong + _MCORE_NOTE))
    return runs


# ------------------------------------------------------------------ Llama 3 (2024)
LLAMA3 = Cite("Llama Team, AI @ Meta", 2024, "arXiv:2407.21783", "Table 4 (and Table 3)")
_LLAMA3_VERIFIED = "stored paper text: Table 3 (architecture), Table 4, section 3.3.1"
_LLAMA3_405B = Transformer("Llama 3 405B", 126, 16384, 128, 8, 53248, 8192, 128000, "swiglu")
# GPUs, TP, CP, PP, DP, sequence, batch per DP group, TFLOP/s per GPU, BF16 MFU %
_LLAMA3_ROWS = ((8192, 8, 1, 16, 64, 8192, 32, 430, 43), (16384, 8, 1, 16, 128, 8192, 16, 400, 41),
                (16384, 8, 16, 16, 8, 131072, 16, 380, 38))
_LLAMA3_NOTE = ("H100 80 GB at 700 W, 8 per server on NVLink, RoCE 400 Gb/s per GPU. 16M "
                "tokens per batch. FSDP shards optimizer states and gradients, parameters are "
                "not resharded after forward (ZeRO-2-like). Interleaved pipeline with a "
                "tunable number of consecutive micro-batches; first and last stages hold one "
                "layer fewer. No recomputation at 8K sequences (section 3.3.2). Not stated: "
                "micro-batch size, chunks per rank. Some stored copies print DP 4 in the last "
                "row; 16384 / (8 * 16 * 16) = 8.")


def llama3_2024() -> list[Run]:
    runs = []
    for gpus, tp, cp, pp, dp, seq, per_dp, tflops, mfu in _LLAMA3_ROWS:
        model = _LLAMA3_405B if seq == 8192 else Transformer(
            "Llama 3 405B (long context)", 126, 16384, 128, 8, 53248, seq, 128000, "swiglu")
        par = Parallel(gpus, per_dp * dp, None, tp=tp, pp=pp, dp=dp, cp=cp, interleave=None,
                       schedule="interleaved", zero=2, sharding="fsdp",
                       recompute="none" if seq == 8192 else None, precision="bf16")
        tag = f"{gpus // 1024}k" + ("-cp16" if cp > 1 else "")
        runs.append(Run(
            f"llama3-405b-{tag}", "llm_throughput",
            f"Llama 3 Table 4: 405B on {gpus} H100 (TP {tp}, CP {cp}, PP {pp}, DP {dp}, "
            f"sequence {seq})", LLAMA3, "TFLOP/s per GPU", tflops, "TFLOP/s",
            Setup(model, par, "grand_teton_h100"), None, "palm-mfu",
            (("BF16 MFU %", mfu), ("tokens per batch (printed 16M)", per_dp * dp * seq)),
            _LLAMA3_VERIFIED, _LLAMA3_NOTE))
    return runs


# ------------------------------------------------------------------ BLOOM, OPT, FSDP at IBM
BLOOM = Cite("BigScience Workshop", 2022,
             "https://github.com/bigscience-workshop/bigscience (train/tr11-176B-ml)",
             "README 'Replica setup' and chronicles.md training log, iteration 12695")
OPT = Cite("Zhang, Roller, Goyal, Artetxe, Chen, Chen, Dewan, Diab, Li, Lin, et al.", 2022,
           "arXiv:2205.01068", "section 2.4 and Table 1")
FMS = Cite("IBM and the PyTorch team (foundation-model-stack)", 2024,
           "https://github.com/foundation-model-stack/fms-fsdp", "README throughput table")
_FMS_VERIFIED = "foundation-model-stack/fms-fsdp README.md and docs/train_details.md"
_LLAMA2 = {"7b": (32, 4096, 32, 32, 11008), "13b": (40, 5120, 40, 40, 13824),
           "34b": (48, 8192, 64, 8, 22016), "70b": (80, 8192, 64, 8, 28672)}
# size, sharding, activation checkpointing, batch per GPU, tokens per GPU per second
_FMS_ROWS = (("7b", "hsdp", False, 2, 3760), ("13b", "hsdp", False, 1, 1700),
             ("34b", "fsdp", True, 8, 772), ("70b", "fsdp", True, 6, 380))


def large_runs_2022_2024() -> list[Run]:
    bloom = Transformer("BLOOM 176B", 70, 14336, 112, 112, 4 * 14336, 2048, 250880)
    runs = [Run("bloom-176b", "llm_throughput",
                "BLOOM 176B on 384 A100: iteration time at global batch 2048", BLOOM,
                "iteration time", 105.22, "s",
                Setup(bloom, Parallel(384, 2048, 2, tp=4, pp=12, dp=8, schedule="1f1b",
                                      zero=1, recompute="full", precision="bf16"),
                      "jean_zay_a100"), None, "8N", (("TFLOP/s per GPU", 149.02),),
                "bigscience-workshop/bigscience train/tr11-176B-ml README.md, chronicles.md",
                "48 nodes of 8 A100 80 GB, 4 Omni-Path links per node. ALiBi positions, "
                "embedding LayerNorm; pipeline stages count the tied embedding as a block "
                "(5 blocks + embedding on the first and last of 12 stages). The log shows "
                "105-107 s per iteration and ~149 TFLOP/s (the 8N count).")]
    opt = Transformer("OPT-175B", 96, 12288, 96, 96, 4 * 12288, 2048, 50272, "relu")
    runs.append(Run("opt-175b", "sharded", "OPT-175B on 992 A100: FSDP with tensor parallel",
                    OPT, "TFLOP/s per GPU", 147, "TFLOP/s",
                    Setup(opt, Parallel(992, None, None, tp=8, dp=124, zero=3,
                                        sharding="fsdp", recompute=None),
                          "azure_ndm_a100"), None, "unstated", (),
                    "stored paper text, section 2.4 ('up to 147 TFLOP/s per GPU') and "
                    "Table 1 (96 layers, 96 heads, 12288, batch 2M tokens)",
                    "'Up to' 147. Batch '2M' tokens: about 1000 sequences of 2048, the exact "
                    "count not stated (1024 does not divide among 124 data-parallel ranks; "
                    "992 = 8 per rank would). FP16 weights, "
                    "FP32 Adam state sharded. Tensor-parallel degree 8, vocabulary 50,272 "
                    "and the Azure cluster are from memory, unverified; micro-batch and "
                    "recomputation not stated."))
    for size, sharding, ac, per_gpu, tokens in _FMS_ROWS:
        layers, hidden, heads, kv, ffn = _LLAMA2[size]
        model = Transformer(f"Llama 2 {size.upper()}", layers, hidden, heads, kv, ffn, 4096,
                            32000, "swiglu")
        par = Parallel(128, 128 * per_gpu, per_gpu, dp=128, zero=3, sharding=sharding,
                       recompute="full" if ac else "none", precision="bf16")
        runs.append(Run(
            f"fmsfsdp-{size}", "sharded",
            f"fms-fsdp: Llama {size.upper()} on 128 A100, {sharding.upper()}, batch "
            f"{per_gpu} per GPU", FMS, "training throughput", tokens, "tokens/s per GPU",
            Setup(model, par, "vela_a100"), None, "", (), _FMS_VERIFIED,
            "HSDP shards within a node of 8 and replicates across the 16 nodes. Sequence "
            "4096 (the 7B model's training, docs/train_details.md). Architectures are Llama "
            "2 (34B: Code Llama 34B) from memory, unverified; the network of the run is "
            "not stated."))
    return runs


def runs() -> list[Run]:
    return (megatron_2019() + megatron_readme_2020() + narayanan_2021() + korthikanti_2022()
            + megatron_core_2024() + llama3_2024() + large_runs_2022_2024())
