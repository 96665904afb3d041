"""Memory per device and bytes per step of sharded data parallel (ZeRO), as formulas.
The ranks' side, measuring them on real tensors: ``parlab.torch.zero`` (lab 08).

Framework-free: plain Python, so a cost model (``parlab.sim``), a widget and a test can
all use it. The formulas are those of the ZeRO paper (Rajbhandari et al., 2020, "ZeRO:
Memory Optimizations Toward Training Trillion Parameter Models", section 5 and figure 1).
With Ψ parameters, N data-parallel devices, and per parameter B_p bytes of weights, B_g
bytes of gradient and K bytes of optimizer state, each device keeps:

=========  ===================  ============  ==================
stage      parameters           gradients     optimizer state
=========  ===================  ============  ==================
0 (DDP)    B_p Ψ                B_g Ψ         K Ψ
1          B_p Ψ                B_g Ψ         K Ψ / N
2          B_p Ψ                B_g Ψ / N     K Ψ / N
3          B_p Ψ / N            B_g Ψ / N     K Ψ / N
=========  ===================  ============  ==================

Mixed-precision Adam, the paper's case: B_p = B_g = 2 (float16 weights and gradients),
K = 12 (a float32 master copy of the weights and Adam's two float32 moments), so DDP keeps
16 Ψ bytes. The course's own runs are plain float32 Adam: B_p = B_g = 4 and K = 8 (the two
moments; the float32 weights are their own master copy), 16 Ψ bytes as well, spread
differently (``FP32_ADAM``).

Bytes per step: ``comm_bytes_per_step`` says how many bytes each device *sends* per step
(ring algorithms): DDP's all-reduce of the gradients 2(N-1)/N · B_g Ψ; stages 1 and 2 the
same (a reduce-scatter of the gradients and an all-gather of the updated parameters, half
each); stage 3 one more all-gather of the parameters (before the backward pass, since they
were freed after the forward one): 3(N-1)/N · B Ψ, 1.5 times DDP.
"""
from __future__ import annotations

import math

from .errors import counted, whole_number

STAGES = (0, 1, 2, 3)
PARTS = ("parameters", "gradients", "optimizer state")
FP32_ADAM = {"bytes_per_param": 4, "optimizer_bytes_per_param": 8}
MIXED_ADAM = {"bytes_per_param": 2, "optimizer_bytes_per_param": 12}
GPUS = {"16 GB GPU": 16e9, "80 GB GPU": 80e9}    # as sold: V100 16 GB, A100 / H100 80 GB


def _size(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise ValueError(f"{name} must be a number of bytes >= 0, got {value!r}")
    return value


def _check(params, devices, stage):
    params = counted(params, "params", 0)
    devices = counted(devices, "devices", 1)
    stage = whole_number(stage)
    if stage not in STAGES:
        raise ValueError(f"stage must be 0 (plain data parallel), 1, 2 or 3, got {stage!r}")
    return params, devices, stage


def per_device_bytes(params, devices, stage, *, bytes_per_param=None,
                     optimizer_bytes_per_param=None, mixed_precision: bool = False) -> dict:
    """What one of ``devices`` data-parallel devices keeps for a model of ``params``
    parameters at ZeRO ``stage`` (0: plain data parallel), in bytes.

    bytes_per_param: of a weight and of a gradient (default 4, float32; 2 when
    ``mixed_precision``); optimizer_bytes_per_param: K (default 8, Adam's two float32
    moments; 12 when ``mixed_precision``: the float32 master weights as well).
    Returns {"parameters", "gradients", "optimizer state", "total"}; shards are exact
    fractions Ψ/N (a real implementation pads each to whole elements).
    """
    params, devices, stage = _check(params, devices, stage)
    mp = MIXED_ADAM if mixed_precision else FP32_ADAM
    b = _size("bytes_per_param", mp["bytes_per_param"] if bytes_per_param is None
              else bytes_per_param)
    k = _size("optimizer_bytes_per_param", mp["optimizer_bytes_per_param"]
              if optimizer_bytes_per_param is None else optimizer_bytes_per_param)
    n = devices
    out = {"parameters": b * params / (n if stage >= 3 else 1),
           "gradients": b * params / (n if stage >= 2 else 1),
           "optimizer state": k * params / (n if stage >= 1 else 1)}
    out["total"] = sum(out[p] for p in PARTS)
    return out


def comm_bytes_per_step(params, devices, stage, *, bytes_per_param=4) -> float:
    """Bytes each device sends per training step at ZeRO ``stage`` (ring algorithms).

    Stages 0-2: 2(N-1)/N · BΨ (an all-reduce, or a reduce-scatter and an all-gather);
    stage 3: 3(N-1)/N · BΨ (the parameters are gathered twice, for each pass).
    """
    params, devices, stage = _check(params, devices, stage)
    b = _size("bytes_per_param", bytes_per_param)
    passes = 3 if stage == 3 else 2
    return passes * (devices - 1) / devices * b * params


def sent_bytes(op: str, traced_bytes: float, devices: int) -> float:
    """Bytes one device sends in a ring ``op``, from the size ``parlab.torch.comm`` traces.

    The traced size is the buffer a rank hands to the operation: the whole tensor of an
    all-reduce, the whole input of a reduce-scatter, this rank's piece of an all-gather.
    A ring all-reduce sends 2(N-1)/N of it, a reduce-scatter (N-1)/N, an all-gather
    passes the piece on N-1 times.
    """
    n = counted(devices, "devices", 1)
    factors = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n,
               "all_gather": float(n - 1)}
    try:
        return factors[op] * traced_bytes
    except KeyError:
        raise ValueError(f"op must be one of {sorted(factors)}, got {op!r}") from None


def op_of(span_name: str) -> str | None:
    """The collective a traced span's name mentions (e.g. "grad reduce_scatter"), or None."""
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        if op in span_name:
            return op
    return None


def fits(params, devices, stage, memory_bytes, **kwargs) -> bool:
    """True when the model states of ``per_device_bytes`` fit in ``memory_bytes``
    (activations and buffers not counted: a lower bound on what is needed)."""
    return per_device_bytes(params, devices, stage, **kwargs)["total"] <= memory_bytes


def largest_model(devices, stage, memory_bytes, **kwargs) -> int:
    """The most parameters whose model states fit in ``memory_bytes`` per device."""
    per_param = per_device_bytes(1, devices, stage, **kwargs)["total"]
    return int(memory_bytes // per_param)
