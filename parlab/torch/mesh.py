"""The device mesh: ranks arranged in a grid with named axes, one process group per line.

Inside a rank started by ``parlab.launch`` or ``torchrun``::

    mesh = init_mesh(dp=2, tp=2)          # 4 ranks: (dp 0 · tp 0), (dp 0 · tp 1), ...
    tp_pair = mesh.group("tp")            # this rank's tensor-parallel pair
    dp.train_data_parallel(..., group=mesh.group("dp"))

The grid's arithmetic (``parlab.mesh.Grid``) is framework-free; this module builds the
process groups. The design follows picotron's process-group manager: groups derived
from one grid, so a hybrid is assembled from the same strategies, each given the line of
the mesh it runs on. The last axis varies fastest, as in ``init_device_mesh``: put the
axis that talks most (tensor parallel) last, so its ranks are neighbours (on real
hardware: GPUs of one node, joined by the fastest links).
"""
from __future__ import annotations

import torch.distributed as dist

from ..mesh import Grid
from .groups import Group, name_group
from .runtime import library_device

__all__ = ["Mesh", "init_mesh"]


class Mesh:
    """A grid of ranks with a process group for every line along every axis."""

    def __init__(self, grid: Grid, rank: int, groups: dict[str, object]):
        self.grid = grid
        self.rank = rank
        self._groups = groups           # axis -> this rank's ProcessGroup along it
        self._device_mesh = None

    # -- the contract the labs rely on
    @property
    def axes(self) -> tuple[str, ...]:
        return self.grid.axes

    @property
    def shape(self) -> dict[str, int]:
        return dict(self.grid.shape)

    def group(self, axis: str):
        """The process group of this rank's line along ``axis``."""
        self.grid._axis(axis)
        return self._groups[axis]

    def line(self, axis: str) -> Group:
        """The same line as a ``Group`` (position, size, neighbours), as strategies see it."""
        ranks = tuple(self.grid.line(self.rank, axis))
        return Group(self._groups[axis], ranks, ranks.index(self.rank), axis)

    def coord(self, axis: str) -> int:
        """This rank's coordinate along ``axis``."""
        return self.grid.coords(self.rank)[self.grid._axis(axis)]

    def size(self, axis: str) -> int:
        return self.grid.shape[self.grid._axis(axis)]

    def ranks(self, axis: str) -> list[int]:
        """Global ranks of this rank's line along ``axis``, in axis order."""
        return self.grid.line(self.rank, axis)

    def neighbors(self, axis: str) -> tuple[int | None, int | None]:
        """(previous, next) global rank along ``axis``, None at the ends (pipelines)."""
        return self.grid.neighbors(self.rank, axis)

    def label(self, rank: int | None = None) -> str:
        """``"dp 1 · tp 0"`` for ``rank`` (default: this rank)."""
        return self.grid.label(self.rank if rank is None else rank)

    def labels(self) -> dict[int, str]:
        """Timeline lane labels for every rank: ``{0: "rank 0 · dp 0 · tp 0", ...}``."""
        return {r: f"rank {r} · {self.grid.label(r)}" for r in self.grid}

    @property
    def device_mesh(self):
        """The equivalent ``torch.distributed.device_mesh.DeviceMesh`` (for DTensor, FSDP).

        Built from this mesh's own process groups, so no further groups are created; the
        first access must happen on every rank (it checks the groups collectively).
        """
        if self._device_mesh is None:
            import torch
            from torch.distributed.device_mesh import DeviceMesh
            layout = torch.arange(self.grid.world_size).view(*self.grid.shape.values())
            groups = [self._groups[a] for a in self.axes]
            self._device_mesh = DeviceMesh.from_group(
                groups if len(groups) > 1 else groups[0], library_device().type,
                mesh=layout, mesh_dim_names=self.axes)
        return self._device_mesh

    def __repr__(self) -> str:
        return f"Mesh({self.grid.describe()}; rank {self.rank} at {self.label()})"


def init_mesh(**axes: int) -> Mesh:
    """Arrange the launched ranks as a mesh, e.g. ``init_mesh(dp=2, tp=2)``.

    Axes in the order given, the last varying fastest over global ranks. The product of
    the sizes must equal the world size (a ``ValueError`` naming both otherwise, raised
    before any group is built). Building the groups is collective: every rank creates
    every line's group, axis by axis, lines in the order of their smallest rank, so no
    rank waits for a group another rank never makes.
    """
    grid = Grid(**axes)
    if not dist.is_initialized():
        raise RuntimeError("init_mesh needs a process group: call it inside a rank started "
                           "by parlab.launch or torchrun")
    grid.check_world(dist.get_world_size())
    rank = dist.get_rank()
    groups = {}
    for axis in grid.axes:
        for line in grid.lines(axis):
            pg = dist.new_group(line)       # collective: every rank, every line, same order
            if rank in line:
                groups[axis] = pg
                name_group(pg, axis)
    return Mesh(grid, rank, groups)
