"""Replicas that must agree: where they part, and where a NaN started.

Data parallel training (lab 05) keeps one replica of the model per rank and trusts that
every replica starts from the same numbers and applies the same update. Nothing checks it:
a replica built from another seed, an update one rank alone applies, a buffer one rank
alone changes, all go unnoticed while every rank's loss keeps falling. Two checks, each
one collective over the group:

* ``compare_replicas(module)``: a 64-bit checksum of every tensor of the module's state
  (parameters and buffers, bit for bit) on every rank, gathered; the tensors whose
  checksums differ, the ranks that differ from the group's first, and by how much.
  ``DriftWatch`` calls it once a step and keeps the first step where the replicas parted.
* ``nonfinite_ranks(tensors)``: which ranks hold NaN or infinity in which of the named
  tensors (a batch, a loss, the gradients before they are averaged). An all-reduce
  spreads one rank's NaN to every replica within a step; checked before the all-reduce,
  the first step that finds one names the rank it came from. ``NonFiniteWatch`` keeps it.

Every rank of the group must make the same calls in the same order (they are
collectives); the answer is the same on every rank.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from torch import nn

from . import comm
from .groups import as_group


def fingerprint(tensor: torch.Tensor) -> int:
    """A 64-bit checksum of the tensor's bytes (BLAKE2b): equal for bit-equal tensors.

    Bits, not values: -0.0 and 0.0 differ, and so do two NaNs with different payloads.
    Replicas that apply the same reduced gradient to the same numbers stay bit-equal.
    """
    raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    digest = hashlib.blake2b(raw.numpy().tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def state_tensors(module_or_tensors) -> dict[str, torch.Tensor]:
    """The named tensors to compare: a module's state_dict (parameters and buffers, such
    as a BatchNorm's running mean), or a dict of tensors as given."""
    if isinstance(module_or_tensors, nn.Module):
        return dict(module_or_tensors.state_dict())
    return dict(module_or_tensors)


@dataclass(frozen=True)
class Difference:
    """One tensor on which the replicas disagree."""

    tensor: str               # its name in the state_dict
    ranks: tuple[int, ...]    # global ranks whose copy differs from the group's first rank's
    max_difference: float     # the largest |difference| from the first rank's copy (nan: NaN)

    def __str__(self) -> str:
        who = ", ".join(map(str, self.ranks))
        return (f"{self.tensor}: rank{'s' * (len(self.ranks) > 1)} {who} differ from the "
                f"first by up to {self.max_difference:.3g}")


def compare_replicas(module_or_tensors, *, group=None, atol: float = 0.0,
                     name: str = "replica checksum") -> list[Difference]:
    """The tensors on which this group's replicas differ, in state_dict order ([] if none).

    One all-gather of 8 bytes per tensor; then, only if some checksums differ, one
    all-gather of each differing tensor, to say by how much (a tensor differing by at most
    ``atol`` is then not reported; the default 0 reports any difference, bit for bit).
    """
    g = as_group(group)
    tensors = state_tensors(module_or_tensors)
    names = list(tensors)
    mine = torch.tensor([fingerprint(t) for t in tensors.values()], dtype=torch.int64)
    every = torch.stack(comm.all_gather(mine, group=g, name=name))     # [ranks, tensors]
    out = []
    for i in torch.nonzero((every != every[0]).any(0)).flatten().tolist():
        copies = comm.all_gather(tensors[names[i]].detach().to("cpu").float(), group=g,
                                 name=f"{name}: {names[i]}")
        gaps = {g.global_rank(pos): _largest_gap(copies[pos], copies[0])
                for pos in range(1, g.size) if not torch.equal(every[pos, i], every[0, i])}
        gaps = {r: gap for r, gap in gaps.items() if not gap <= atol}    # NaN: reported
        if gaps:
            worst = max(gaps.values(), key=lambda x: (x != x, x))        # NaN above all
            out.append(Difference(names[i], tuple(gaps), worst))
    return out


def _largest_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b|; NaN where either holds a NaN the other does not (or both: bits differ)."""
    gap = (a - b).abs()
    if gap.isnan().any():
        return float("nan")
    return float(gap.max()) if gap.numel() else 0.0


class DriftWatch:
    """Call ``check(step)`` at the same point of every step on every rank: ``first`` keeps
    the first check at which the replicas differed.

    ``first``: None while they agree, else {"step": the step given to check, "tensor": the
    first differing tensor, "tensors": every differing one, "ranks": the ranks that differ
    from the group's first on that tensor, "max_difference": the largest difference over
    every differing tensor (nan if any is NaN)}.
    """

    def __init__(self, module_or_tensors, *, group=None, atol: float = 0.0):
        self.target, self.group, self.atol = module_or_tensors, group, atol
        self.first: dict | None = None
        self.differing: list[tuple] = []      # (step, number of differing tensors)

    def check(self, step) -> list[Difference]:
        found = compare_replicas(self.target, group=self.group, atol=self.atol)
        self.differing.append((step, len(found)))
        if found and self.first is None:
            self.first = {"step": step, "tensor": found[0].tensor,
                          "tensors": [d.tensor for d in found], "ranks": list(found[0].ranks),
                          "max_difference": _largest(d.max_difference for d in found)}
        return found


def _largest(values) -> float:
    """The largest of ``values``, NaN if any is NaN (``max`` would depend on their order)."""
    values = list(values)
    return float("nan") if any(math.isnan(v) for v in values) else max(values)


def nonfinite_ranks(tensors: dict[str, torch.Tensor], *, group=None,
                    name: str = "non-finite check") -> dict[int, list[str]]:
    """{global rank: names of its tensors holding NaN or infinity}, for the ranks that
    hold any; {} when every value on every rank is finite. One all-gather of a flag per
    tensor. Give every rank the same names in the same order."""
    g = as_group(group)
    names = list(tensors)
    flags = torch.tensor([0 if bool(torch.isfinite(t.detach()).all()) else 1
                          for t in tensors.values()], dtype=torch.int64)
    every = comm.all_gather(flags, group=g, name=name)
    return {g.global_rank(pos): [n for n, f in zip(names, row.tolist()) if f]
            for pos, row in enumerate(every) if row.any()}


class NonFiniteWatch:
    """Call ``check(step, batch=..., loss=..., gradients=...)`` on every rank each step,
    before the gradients are averaged: ``first`` keeps the first step at which some rank
    held NaN or infinity, which ranks, and in which tensors (in the order given: the first
    one named says where it started, e.g. in the batch rather than the loss)."""

    def __init__(self, *, group=None):
        self.group = group
        self.first: dict | None = None

    def check(self, step, **tensors: torch.Tensor) -> dict[int, list[str]]:
        found = nonfinite_ranks(tensors, group=self.group)
        if found and self.first is None:
            rank = min(found)
            self.first = {"step": step, "rank": rank, "tensor": found[rank][0],
                          "ranks": {r: list(v) for r, v in found.items()}}
        return found
