"""Launch again after a rank dies, resuming from the last checkpoint: torchrun's
``--max-restarts`` for ``parlab.launch``.

torchrun restarts every worker when one fails, and the training script resumes from its
newest checkpoint (torch.distributed.elastic, "Train script": "load the latest
checkpoint" on every start). ``launch_with_restarts`` does the same with the course's
launcher: a ``WorkerError`` (a rank raised or died) is followed by a new launch of all
ranks with ``resume=True``. A ``LaunchTimeout`` is not retried: a hung run would hang
again, and its report says where.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .errors import WorkerError, counted
from .launcher import LaunchResult, launch


def one_line(err: WorkerError) -> str:
    """'rank 1 of 2: killed by SIGKILL (exit code -9)': which rank failed, and how."""
    first = (err.summary or "").strip().splitlines()
    return f"rank {err.rank} of {err.world_size}: {first[0] if first else 'failed'}"


def launch_with_restarts(fn: Callable, world_size: int, *, restarts: int = 1,
                         args: Sequence = (), kwargs: dict | None = None,
                         resume_kwarg: str = "resume",
                         **launch_kw) -> tuple[LaunchResult, list[str]]:
    """``parlab.launch(fn, world_size, args=args, kwargs=kwargs, **launch_kw)``; when a
    rank fails, launch all ranks again with ``kwargs[resume_kwarg] = True``, at most
    ``restarts`` times.

    The first launch gets ``kwargs`` as given (pass ``resume=True`` there to continue an
    earlier run). Returns ``(result, attempts)``: the launch that succeeded and, for each
    one that failed before it, one line naming the rank and how it failed. When the last
    allowed launch fails too, its ``WorkerError`` is raised with a note saying how many
    launches were made and what ended each.
    """
    restarts = counted(restarts, "restarts=", 0,
                       "the launches to make after the first fails, e.g. restarts=1.")
    kwargs = dict(kwargs or {})
    attempts: list[str] = []
    for attempt in range(restarts + 1):
        try:
            return launch(fn, world_size, args=args, kwargs=kwargs, **launch_kw), attempts
        except WorkerError as err:
            attempts.append(one_line(err))
            if attempt == restarts:
                err.add_note(f"launch_with_restarts: {len(attempts)} attempt(s) made "
                             f"(restarts={restarts}), each failed: " + "; ".join(
                                 f"attempt {i + 1}: {a}" for i, a in enumerate(attempts)))
                raise
        kwargs[resume_kwarg] = True       # the next launch continues from the checkpoint
