"""The ranks a strategy runs on: all of them, or one line of a device mesh.

Every strategy of the course takes ``group=`` (default: every rank) and speaks only to
that group's ranks: its collectives, its neighbours, its slice of the data. The same
code then runs alone on the whole world, or as one of several groups of a larger launch
(lab 07: tensor parallel inside each pair of ranks while data parallel runs across).

``Group`` is a small view of a ``torch.distributed`` process group in the course's
vocabulary: ``index`` (this rank's position), ``size``, ``ranks`` (global ranks in
order) and the neighbours a pipeline or a ring needs. Point-to-point calls address
global ranks (``torch.distributed`` does), so ``Group`` translates positions to them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ..split import share

# Mesh axis names of process groups, so a traced collective can say which axis its bytes
# travelled on. Keyed by id(): ProcessGroup objects are not hashable in every version.
_AXIS_OF: dict[int, str] = {}


def name_group(pg, axis: str) -> None:
    """Remember that process group ``pg`` is a line along mesh axis ``axis``."""
    _AXIS_OF[id(pg)] = axis


def axis_of(pg) -> str | None:
    """The mesh axis ``pg`` was built for, or None (the whole world, or unnamed)."""
    return None if pg is None else _AXIS_OF.get(id(pg))


@dataclass(frozen=True)
class Group:
    """A process group seen from one of its ranks."""

    pg: object                   # the torch ProcessGroup; None means the default group
    ranks: tuple[int, ...]       # global ranks, in group order
    index: int                   # this rank's position in ``ranks``
    axis: str | None = None      # the mesh axis it is a line of, if any

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def rank(self) -> int:
        """This rank's global rank."""
        return self.ranks[self.index]

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.size - 1

    def global_rank(self, index: int) -> int:
        """Global rank of position ``index`` of the group."""
        return self.ranks[index]

    @property
    def prev(self) -> int | None:
        """Global rank of the previous position; None for the first (a pipeline's start)."""
        return None if self.first else self.ranks[self.index - 1]

    @property
    def next(self) -> int | None:
        """Global rank of the next position; None for the last (a pipeline's end)."""
        return None if self.last else self.ranks[self.index + 1]

    @property
    def left(self) -> int:
        """Previous position on a ring (wraps around)."""
        return self.ranks[(self.index - 1) % self.size]

    @property
    def right(self) -> int:
        """Next position on a ring (wraps around)."""
        return self.ranks[(self.index + 1) % self.size]

    def rows(self, total: int, what: str = "batch") -> slice:
        """This rank's contiguous share of ``total`` rows (a data shard).

        Position i of n takes rows i·total/n to (i+1)·total/n, so the shards in group
        order are the whole batch, and an average over the group equals the whole
        batch's mean.
        """
        b = share(total, self.size, f"{self.size} ranks", what)
        return slice(self.index * b, (self.index + 1) * b)


def as_group(group=None) -> Group:
    """A ``Group`` from None (every rank), a torch ProcessGroup or a ``Group``."""
    if isinstance(group, Group):
        return group
    if not dist.is_initialized():
        raise RuntimeError("no process group: run this inside parlab.launch or torchrun")
    if group is None or group is dist.group.WORLD:
        n = dist.get_world_size()
        return Group(None, tuple(range(n)), dist.get_rank())
    ranks = tuple(dist.get_process_group_ranks(group))
    me = dist.get_rank()
    if me not in ranks:
        raise ValueError(f"rank {me} is not a member of the group of ranks {list(ranks)}")
    return Group(group, ranks, ranks.index(me), axis_of(group))


def pg_of(group):
    """The torch ProcessGroup to hand to ``torch.distributed`` (None: the default)."""
    return group.pg if isinstance(group, Group) else group
