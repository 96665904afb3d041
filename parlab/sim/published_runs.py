"""A validation set for the cost model: published figures with every configuration stated.

Each ``Run`` (``published_setups``) is one published number -- a paper's table cell or a
maintainer's benchmark -- with its source, the metric and its printed value, the full
configuration that produced it (model, parallel layout, batch, recomputation, sharding,
precision), the hardware as its datasheets describe it, and the sim preset that stands
in for that hardware. Nothing here predicts: the model reads these records and is
compared with ``value``. Framework-free: no torch, no tensorflow.

Kinds (``KINDS``): tensor-parallel scaling, data-parallel scaling, absolute throughput
of large language models, sharded data parallelism (ZeRO, FSDP), pipelines (GPipe,
torchgpipe; Transformers and convolutional networks) and collectives (nccl-tests).

In-sample, in neither set: the three figures ``parlab.sim.published`` was built
against -- GPipe Table 2's Transformer-48 at M = 32 (K = 2, 4, 8), Megatron-LM's 8-way
weak scaling (77 %), the nccl-tests identity busbw = 2(n - 1)/n algbw. Other rows and
figures of the same sources are here.

Verification: ``Run.verified`` names the stored copy each value was read in (a paper's
text, a README or its images in the repository's history, an issue thread). Where a
value or a configuration number could not be read in a stored source, the note says
"from memory, unverified". Left out for want of a readable number: PipeDream, the
PyTorch DDP paper (Li et al., 2020; its scaling figures are plots), the FSDP paper (Zhao
et al., 2023; plots), MLPerf (time to train, not a step).

The split (decided on SPLIT_DATE, before any prediction of these runs existed)
    SPLIT_RULE, applied by ``split_by_rule``; the result is frozen in FITTING and
    HELD_OUT. The model may be tuned on FITTING; HELD_OUT is predicted once, at the end,
    and reported as it comes. A run added later joins neither set until a new, dated
    split says where it goes.
"""
from __future__ import annotations

import hashlib

from . import published_runs_lm, published_runs_other
from .published_setups import FLOPS, HARDWARE, Run, Transformer

KINDS = {
    "tp_scaling": "weak scaling of tensor parallelism (per-GPU throughput vs one GPU)",
    "dp_scaling": "scaling with data parallelism (and tensor parallel inside)",
    "llm_throughput": "absolute throughput, MFU or step time of large GPT-style models",
    "sharded": "ZeRO / FSDP: memory per device and throughput",
    "pipeline": "GPipe-style pipelines of Transformers and convolutional networks",
    "collective": "nccl-tests all-reduce bus bandwidth inside and across nodes",
}

SPLIT_DATE = "2026-11-25"
SPLIT_RULE = ("Within each kind, order the runs by (cite.ref, sha256(id) in hex) and deal "
              "them alternately to HELD_OUT and FITTING, HELD_OUT first. Every kind, and "
              "every source with two runs or more, lands in both sets; the hash decides "
              "which row of a source goes where, not its value.")


def runs() -> tuple[Run, ...]:
    """Every published run, in source order."""
    return tuple(published_runs_lm.runs() + published_runs_other.runs())


def by_id() -> dict[str, Run]:
    return {r.id: r for r in runs()}


def split_by_rule(all_runs=None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(fitting ids, held-out ids) by SPLIT_RULE, each sorted."""
    fitting, held_out = [], []
    for kind in KINDS:
        group = sorted((r for r in (all_runs or runs()) if r.kind == kind),
                       key=lambda r: (r.cite.ref, hashlib.sha256(r.id.encode()).hexdigest()))
        for i, run in enumerate(group):
            (held_out if i % 2 == 0 else fitting).append(run.id)
    return tuple(sorted(fitting)), tuple(sorted(held_out))


FITTING = (
    "bloom-176b", "fmsfsdp-13b", "fmsfsdp-7b", "gpipe-amoebanet-k2-m32",
    "gpipe-amoebanet-k2-m4", "gpipe-amoebanet-k4-m32", "gpipe-amoebanet-k8-m4",
    "gpipe-p100-amoebanet-k4", "gpipe-p100-amoebanet-k8", "gpipe-transformer-k4-m4",
    "gpipe-transformer-k8-m4", "horovod-resnet101-512", "horovod-vgg16-128",
    "korthikanti22-1t", "korthikanti22-22b", "korthikanti22-22b-fullrecompute",
    "llama3-405b-8k", "mcore24-16b", "mcore24-314b", "mcore24-32b", "mcore24-7.1b",
    "mcore24-70b", "mlm20-a100-dp128-2b", "mlm20-a100-dp128-4b", "mlm20-a100-tp2",
    "mlm20-a100-tp4", "mlm20-a100-tp8", "mlm20-v100-1b-step", "narayanan21-1.7b",
    "narayanan21-18b", "narayanan21-1t", "narayanan21-3.6b", "narayanan21-7.5b",
    "nccl-a800-12node-1hdr", "nccl-dgx1-4edr", "nccl-h100-8gpu-nvls", "shoeybi19-tp1-dp64",
    "shoeybi19-tp4", "shoeybi19-tp4-dp64", "torchgpipe-amoebanet-n2m1",
    "torchgpipe-amoebanet-n8m32", "torchgpipe-unet-baseline", "torchgpipe-unet-pipeline-4",
    "zero-7p5b-stage1-dp64", "zero-7p5b-stage3-dp64",
)
HELD_OUT = (
    "fmsfsdp-34b", "fmsfsdp-70b", "gpipe-amoebanet-k4-m1", "gpipe-amoebanet-k4-m4",
    "gpipe-amoebanet-k8-m1", "gpipe-amoebanet-k8-m32", "gpipe-p100-transformer-k4",
    "gpipe-p100-transformer-k8", "gpipe-transformer-k2-m4", "gpipe-transformer-k4-m1",
    "gpipe-transformer-k8-m1", "horovod-inception3-512", "horovod-vgg16-512",
    "korthikanti22-175b", "korthikanti22-175b-fullrecompute", "korthikanti22-530b",
    "llama3-405b-16k", "llama3-405b-16k-cp16", "mcore24-1.7b", "mcore24-119b", "mcore24-177b",
    "mcore24-177b-4608gpu", "mcore24-177b-96gpu", "mcore24-462b", "mlm20-a100-1b-step",
    "mlm20-a100-dp128-1b", "mlm20-a100-dp128-8b", "mlm20-v100-tp2", "mlm20-v100-tp4",
    "mlm20-v100-tp8", "narayanan21-145b", "narayanan21-310b", "narayanan21-39b",
    "narayanan21-530b", "narayanan21-76b", "nccl-a100-8gpu", "nccl-a100-multinode-8hdr",
    "nccl-a800-8gpu", "nccl-h100-8gpu-ring", "opt-175b", "shoeybi19-tp2",
    "shoeybi19-tp2-dp64", "shoeybi19-tp8-dp64", "torchgpipe-amoebanet-n2m32",
    "torchgpipe-amoebanet-n4m32", "torchgpipe-amoebanet-n8m4", "torchgpipe-unet-pipeline-8",
    "zero-1t-stage3-dp1024", "zero-7p5b-stage2-dp64",
)


def fitting() -> tuple[Run, ...]:
    table = by_id()
    return tuple(table[i] for i in FITTING)


def held_out() -> tuple[Run, ...]:
    table = by_id()
    return tuple(table[i] for i in HELD_OUT)


# ------------------------------------------------------------------ FLOP counts of the sources
def megatron_flops(model: Transformer, batch: int, recompute: bool) -> float:
    """FLOPs of one step of a GPT model as Megatron-LM's papers count them (FLOPS).

    With recomputation (Narayanan et al. 2021): 96 B s l h^2 (1 + s/6h + V/16lh); without
    (Korthikanti et al. 2022, model FLOPs): 72 B s l h^2 (1 + s/6h + V/12lh). Both assume
    an MLP of 4h and no grouped-query attention."""
    b, s, lay, h, v = batch, model.seq, model.layers, model.hidden, model.vocab
    if recompute:
        return 96 * b * s * lay * h * h * (1 + s / (6 * h) + v / (16 * lay * h))
    return 72 * b * s * lay * h * h * (1 + s / (6 * h) + v / (12 * lay * h))


def implied_step_s(run: Run) -> float | None:
    """The step time a Megatron-counted FLOP/s or MFU figure implies (None otherwise):
    the step's FLOPs over (per-GPU rate x GPUs). Lets a model that predicts step times be
    compared with a figure printed as a rate."""
    if run.flops not in ("megatron-hfu", "megatron-mfu") or run.setup.parallel.global_batch is None:
        return None
    par = run.setup.parallel
    if run.baseline is not None:
        return None
    flops = megatron_flops(run.setup.model, par.global_batch, run.flops == "megatron-hfu")
    if run.unit == "TFLOP/s":
        return flops / (run.value * 1e12 * par.gpus)
    if run.unit == "fraction of peak":
        return flops / (run.value * HARDWARE[run.setup.hardware].peak_tflops * 1e12 * par.gpus)
    return None


def table() -> list[str]:
    """One line a run: id, kind, set, value and unit, source, verified or not."""
    sets = {**{i: "fitting" for i in FITTING}, **{i: "held-out" for i in HELD_OUT}}
    return [f"{r.id:34s} {r.kind:15s} {sets.get(r.id, '-'):9s} {r.value:>10g} {r.unit:20s} "
            f"{r.cite.authors.split(',')[0]} {r.cite.year}, {r.cite.where}"
            f"{'' if r.verified else '  [unverified]'}" for r in runs()]


__all__ = ["FITTING", "FLOPS", "HARDWARE", "HELD_OUT", "KINDS", "SPLIT_DATE", "SPLIT_RULE",
           "by_id", "fitting", "held_out", "implied_step_s", "megatron_flops", "runs",
           "split_by_rule", "table"]
