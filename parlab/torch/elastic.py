"""Elastic restart: a rank dies mid-training, the job starts again and resumes from the
newest complete checkpoint, losing only the steps since.

Two ways to restart, both around ``checkpoint.train``:

- torchrun restarts the whole worker group when a worker fails, up to ``--max-restarts``
  times, and tells each attempt its number in ``TORCHELASTIC_RESTART_COUNT`` ("0" on the
  first; torch.distributed.run's docs, "Environment Variables")::

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node 2 \\
        --max-restarts 1 -m parlab run parlab.torch.elastic:train_elastic \\
        --args '[{}, 6, 2, "ckpt", 1, 5]'

  The variable gives each attempt a store of its own: in the store torchrun shares by
  default, a restarted rank may read the previous attempt's gloo addresses and fail to
  connect (pytorch issue #135712). Unlike ``parlab.launch``'s file store, torchrun's
  stores (``TCPStore``) listen on every interface, whatever host they are given; gloo
  listens where ``GLOO_SOCKET_IFNAME`` says (``lo``: the loopback only).

- ``parlab.restarts.launch_with_restarts`` launches again, with ``resume=True``, after a
  ``WorkerError``; ``train_killed_once`` dies once, remembered by a marker file.

A rank dies by SIGKILL, as the out-of-memory killer or a lost machine would end it: no
exception, no cleanup, its peers learn of it only from a broken connection.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np

from . import checkpoint

RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"      # set by torchrun's local elastic agent
MARKER = "killed-once"


def restart_count() -> int | None:
    """Which attempt this is under torchrun (0 the first), or None when not under it."""
    value = os.environ.get(RESTART_ENV)
    return int(value) if value is not None else None


def die() -> None:
    """End this process at once, as SIGKILL from outside would: no handler, no cleanup."""
    os.kill(os.getpid(), signal.SIGKILL)


class KillAt:
    """An ``after_step`` hook for the rank that is to die: it dies right after ``step``.

    With ``marker`` (a path) it dies only while the marker does not exist, and creates it
    first, so the next attempt, which finds it, runs through.
    """

    def __init__(self, step: int, marker=None):
        self.step, self.marker = step, marker

    def __call__(self, step: int) -> None:
        if step != self.step:
            return
        if self.marker is not None:
            marker = Path(self.marker)
            if marker.exists():
                return
            with open(marker, "w") as f:        # on disk before the process is gone
                f.write(f"killed after step {step}\n")
                f.flush()
                os.fsync(f.fileno())
        die()


def _config(cfg) -> checkpoint.Config:
    """A Config from a Config or from a dict of its fields (JSON has no tuples)."""
    if isinstance(cfg, checkpoint.Config):
        return cfg
    cfg = dict(cfg or {})
    if "sizes" in cfg:
        cfg["sizes"] = tuple(cfg["sizes"])
    return checkpoint.Config(**cfg)


def train_elastic(rank: int, world_size: int, cfg_dict, steps: int, every: int, folder,
                  kill_rank: int, kill_step: int) -> dict:
    """Rank function for torchrun: ``checkpoint.train`` resuming from the newest complete
    checkpoint in ``folder``; on the first attempt only, rank ``kill_rank`` is killed
    right after step ``kill_step``.

    Returns what ``checkpoint.train`` returns plus "attempt" (torchrun's restart count;
    None outside torchrun, where nothing is killed). Rank 0 also writes its result to
    ``folder/result-attempt<N>.npz`` (weights) and ``.json`` (the rest): ``parlab run``
    prints results as JSON, where arrays do not survive.
    """
    attempt = restart_count()
    hook = KillAt(kill_step) if attempt == 0 and rank == kill_rank else None
    out = checkpoint.train(rank, world_size, _config(cfg_dict), steps=steps, every=every,
                           folder=folder, resume=True, after_step=hook)
    out["attempt"] = attempt
    if rank == 0:
        _write_result(Path(folder), attempt, out)
    return out


def _write_result(folder: Path, attempt, out: dict) -> None:
    name = f"result-attempt{attempt if attempt is not None else 'none'}"
    np.savez(folder / f"{name}.npz", **out["state"])
    rest = {k: v for k, v in out.items() if k != "state"}
    tmp = folder / f".{name}.json.tmp"
    tmp.write_text(json.dumps(rest))
    os.replace(tmp, folder / f"{name}.json")         # whole or absent


def train_killed_once(rank: int, world_size: int, cfg, *, kill_rank: int, kill_step: int,
                      folder, marker=None, **train_kw) -> dict:
    """Rank function for ``parlab.launch``: ``checkpoint.train`` in which rank
    ``kill_rank`` is killed after step ``kill_step`` the first time only, remembered by
    the file ``marker`` (default ``folder/killed-once``). ``train_kw`` go to
    ``checkpoint.train`` (steps, every, resume, ...)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    hook = KillAt(kill_step, marker or Path(folder) / MARKER) if rank == kill_rank else None
    return checkpoint.train(rank, world_size, _config(cfg), folder=folder,
                            after_step=hook, **train_kw)
