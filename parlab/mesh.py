"""The arithmetic of a device mesh, without any framework: which global rank sits where.

A mesh arranges ``world_size`` ranks in a grid with named axes, e.g. ``dp=2, tp=2``. The
last axis varies fastest over global ranks, as in ``torch.distributed.init_device_mesh``
and picotron's process-group manager (a ``torch.arange(world).view(dp, pp, cp, tp)``
grid): with ``dp=2, tp=2`` ranks 0 and 1 form one tensor-parallel pair, 2 and 3 the
other, and the data-parallel lines are (0, 2) and (1, 3).

A *line* along an axis is the set of ranks whose coordinates differ only on that axis:
the group a strategy for that axis runs on. ``parlab.torch.mesh`` turns lines into
process groups; this module only computes them, so it can be tested, checked against a
learner's answer and drawn without starting a single rank.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Iterator

from .errors import whole_number

__all__ = ["Grid"]


class Grid:
    """Named axes over ``0 .. world_size - 1``, the last axis fastest."""

    def __init__(self, **axes: int):
        if not axes:
            raise ValueError("a mesh needs at least one axis, e.g. init_mesh(dp=4)")
        shape = {}
        for name, size in axes.items():
            size = whole_number(size)           # numpy integers yes; 2.0 and True no
            if size is None or size < 1:
                raise ValueError(f"mesh axis {name}={axes[name]!r}: each axis size must be a "
                                 "whole number >= 1")
            shape[name] = size
        self.shape: dict[str, int] = shape
        self.axes: tuple[str, ...] = tuple(shape)
        self.world_size: int = math.prod(shape.values())
        # stride of each axis: how far apart two neighbours along it are in global ranks
        self._stride, step = {}, 1
        for name in reversed(self.axes):
            self._stride[name] = step
            step *= shape[name]

    def __repr__(self) -> str:
        return "Grid(" + ", ".join(f"{a}={n}" for a, n in self.shape.items()) + ")"

    def describe(self) -> str:
        """``"dp 2 × tp 2"``: the shape in words, for titles and errors."""
        return " × ".join(f"{a} {n}" for a, n in self.shape.items())

    def check_world(self, world_size: int) -> None:
        """A clear error when the mesh does not cover exactly the ranks that exist."""
        if self.world_size != world_size:
            sizes = " × ".join(str(n) for n in self.shape.values())
            raise ValueError(
                f"a mesh of {self.describe()} needs {sizes} = {self.world_size} ranks, but "
                f"the world has {world_size}: choose axis sizes whose product is "
                f"{world_size}, or launch {self.world_size} ranks")

    def _axis(self, axis: str) -> str:
        if axis not in self.shape:
            raise KeyError(f"no mesh axis {axis!r}; this mesh has {list(self.axes)}")
        return axis

    def _rank(self, rank: int) -> int:
        rank = operator.index(rank)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside this mesh of {self.world_size} ranks")
        return rank

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of a global rank, e.g. ``{"dp": 1, "tp": 0}``."""
        rank = self._rank(rank)
        return {a: (rank // self._stride[a]) % self.shape[a] for a in self.axes}

    def rank_at(self, **coords: int) -> int:
        """The global rank at the given coordinates (every axis must be given)."""
        missing = [a for a in self.axes if a not in coords]
        if missing or set(coords) - set(self.axes):
            raise ValueError(f"give one coordinate per axis {list(self.axes)}, got {coords}")
        for a, c in coords.items():
            if not 0 <= c < self.shape[a]:
                raise ValueError(f"coordinate {a}={c} outside 0..{self.shape[a] - 1}")
        return sum(coords[a] * self._stride[a] for a in self.axes)

    def line(self, rank: int, axis: str) -> list[int]:
        """Global ranks of the line through ``rank`` along ``axis``, in axis order."""
        axis = self._axis(axis)
        base = self._rank(rank) - self.coords(rank)[axis] * self._stride[axis]
        return [base + i * self._stride[axis] for i in range(self.shape[axis])]

    def lines(self, axis: str) -> list[list[int]]:
        """Every line along ``axis``, ordered by its smallest rank: the groups to build.

        Every rank must create every group in the same order (process-group creation is
        collective), so this order is the contract that keeps ranks from waiting on each
        other's groups.
        """
        axis = self._axis(axis)
        seen, out = set(), []
        for r in range(self.world_size):
            line = self.line(r, axis)
            if line[0] not in seen:
                seen.add(line[0])
                out.append(line)
        return out

    def neighbors(self, rank: int, axis: str) -> tuple[int | None, int | None]:
        """(previous, next) global rank along ``axis``; None at the ends (pipelines)."""
        line = self.line(rank, axis)
        i = line.index(rank)
        return (line[i - 1] if i > 0 else None, line[i + 1] if i + 1 < len(line) else None)

    def label(self, rank: int) -> str:
        """``"dp 1 · tp 0"``: a rank's place, for timeline lanes."""
        return " · ".join(f"{a} {c}" for a, c in self.coords(rank).items())

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.world_size))


@dataclass(frozen=True)
class HybridShape:
    """A lab 07 mesh: ``dp`` replicas of a model split ``model`` ways along ``axis``
    ("tp": tensor parallel, "pp": pipeline stages), the model's axis varying fastest.

    Made once from the dict a learner writes (``HybridShape.of({"dp": 2, "tp": 2})``),
    checked there, and handed on: nothing else reads the dict again.
    """

    dp: int
    axis: str
    model: int

    AXES = ("tp", "pp")

    @classmethod
    def of(cls, shape) -> "HybridShape":
        if isinstance(shape, cls):
            return shape
        axes = tuple(shape) if isinstance(shape, dict) else ()
        if len(axes) != 2 or axes[0] != "dp" or axes[1] not in cls.AXES:
            raise ValueError(f"a hybrid mesh here is {{'dp': d, 'tp': t}} or {{'dp': d, 'pp': p}}, "
                             f"got {shape}: data parallel first (outer), the model's axis last")
        grid = Grid(**shape)    # checks each size
        return cls(grid.shape["dp"], axes[1], grid.shape[axes[1]])

    @property
    def tp(self) -> int:
        return self.model if self.axis == "tp" else 1

    @property
    def pp(self) -> int:
        return self.model if self.axis == "pp" else 1

    @property
    def grid(self) -> Grid:
        return Grid(dp=self.dp, **{self.axis: self.model})

    @property
    def world_size(self) -> int:
        return self.dp * self.model

    def as_dict(self) -> dict[str, int]:
        return {"dp": self.dp, self.axis: self.model}

    def micro_batches(self, wanted: int) -> int:
        """A pipeline splits each replica's batch into ``wanted``; one stage needs none."""
        return wanted if self.pp > 1 else 1
