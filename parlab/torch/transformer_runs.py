"""The transformer's strategies one after the other in one launch, on the same batches.

Tensor parallelism (``transformer_tp``), sequence parallelism (``transformer_sp``),
context parallelism with contiguous and with zig-zag chunks (``transformer_cp``) and the
library's tensor parallelism (``transformer_tp.library_step``, one step): each starts
after a barrier, behind a zero-length span "<strategy> begins", so that its part of the
timeline can be cut out (``zero.variant_windows``). Starting ranks once for all of them
saves the few seconds each launch costs.
"""
from __future__ import annotations

import gc
import time

from ..trace import COMPUTE, recorder
from . import comm, runtime
from .groups import as_group
from .transformer import GPTConfig
from .zero import variant_windows  # noqa: F401 (transformer_runs.variant_windows)

STRATEGIES = ("tp", "sp", "cp_contiguous", "cp_zigzag", "library")
LABELS = {"tp": "tensor parallel", "sp": "tensor + sequence parallel",
          "cp_contiguous": "context parallel, contiguous", "cp_zigzag": "context parallel, zig-zag",
          "library": "DTensor tensor parallel"}


def _one(name: str, rank: int, world_size: int, g, **kwargs) -> dict:
    from . import transformer_cp, transformer_sp, transformer_tp
    if name == "tp":
        return transformer_tp.train_tp(rank, world_size, group=g, **kwargs)
    if name == "sp":
        return transformer_sp.train_sp(rank, world_size, group=g, **kwargs)
    if name.startswith("cp_"):
        return transformer_cp.train_cp(rank, world_size, group=g, layout=name[3:], **kwargs)
    kwargs = {k: kwargs[k] for k in ("cfg", "batch_size", "seed")}
    return transformer_tp.library_step(rank, world_size, group=g, **kwargs)


def train_all(rank: int, world_size: int, cfg: GPTConfig = GPTConfig(), batch_size: int = 8,
              steps: int = 3, lr: float = 0.1, seed: int = 0, strategies=STRATEGIES,
              *, group=None) -> dict:
    """Rank function: each of ``strategies`` trained ``steps`` SGD steps from the same
    weights on the same batches (the library's: one step). Returns, per strategy, what its
    own rank function returns; ``seconds``: each one's wall time on this rank; and
    ``settings``: the arguments, for whoever reads the results."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"strategies must be among {STRATEGIES}, got {unknown}")
    g = as_group(group)
    out = {"seconds": {}, "settings": {"cfg": cfg, "batch_size": batch_size, "steps": steps,
                                       "strategies": tuple(strategies)}}
    for name in strategies:
        comm.barrier(group=g, name="between strategies")
        started = time.perf_counter()
        recorder().add(f"{name} begins", COMPUTE, started, started)
        out[name] = _one(name, rank, world_size, g, cfg=cfg, batch_size=batch_size,
                         steps=steps, lr=lr, seed=seed)
        runtime.synchronize()
        out["seconds"][name] = time.perf_counter() - started
        gc.collect()
    comm.barrier(group=g, name="between strategies")
    return out
