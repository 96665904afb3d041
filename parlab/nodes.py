"""Ranks on nodes, and the bytes that cross the slow link between nodes. No framework.

A cluster is nodes of a few devices each: fast links inside a node (NVLink, shared
memory), a slow one between nodes (the network). ``torchrun`` numbers ranks node by node
(rank = node_rank · nproc_per_node + local_rank), so here node j holds the ``node_size``
consecutive ranks j·node_size .. (j + 1)·node_size − 1, and a rank's local index is
rank mod node_size.

What counts: a *byte crossing nodes* is one a rank sends to a rank of another node,
counted once, at its sender; the formulas give the total over all ranks per training
step, for a gradient (or model) of S bytes (4-byte floats), n ranks, k ranks a node and
m = n / k nodes:

* ``flat``: one ring all-reduce over all n ranks in rank order. Each rank sends
  2(n − 1)/n · S to its right neighbour (n − 1 steps of reduce-scatter, n − 1 of
  all-gather, S/n a step: Thakur, Rabenseifner & Gropp, 2005; Patarasuk & Yuan, 2009).
  The ring leaves a node at its last rank, so m of its n edges cross nodes (none when
  m = 1): m · 2(n − 1)/n · S.
* ``hierarchical``: reduce-scatter inside each node (nothing crosses), a ring all-reduce
  of each rank's S/k chunk across the m ranks of the same local index (every one of its
  edges crosses), all-gather inside: n · 2(m − 1)/m · S/k = 2(m − 1) · S.
* ``local_sgd`` (DiLoCo, Douillard et al., 2023): the nodes average only every H steps,
  in the hierarchical pattern: 2(m − 1) · S / H per step.
"""
from __future__ import annotations

from .errors import whole_number

__all__ = ["HOWS", "across_lines", "bytes_per_rank", "crossing_edges", "flat_ring_bytes",
           "hierarchical_bytes", "local_index", "local_sgd_bytes", "node_count", "node_of", "nodes",
           "ring_bytes_per_rank", "slow_link_bytes"]

HOWS = ("flat", "hierarchical", "local_sgd")


def _count(value, what: str, least: int = 1) -> int:
    n = whole_number(value)
    if n is None or n < least:
        raise ValueError(f"{what} must be a whole number >= {least}, got {value!r}")
    return n


def node_count(world_size: int, node_size: int) -> int:
    """How many nodes ``world_size`` ranks fill, ``node_size`` to a node; a ValueError
    naming what to change unless node_size divides world_size."""
    n = _count(world_size, "world_size")
    k = _count(node_size, "node_size")
    if n % k:
        fits = [d for d in range(1, n + 1) if n % d == 0]
        raise ValueError(f"node_size={k} does not divide the {n} ranks into whole nodes: "
                         f"choose node_size among {fits}, or a world of a multiple of {k} ranks")
    return n // k


def node_of(rank: int, node_size: int) -> int:
    """The node that holds ``rank`` (torchrun's node_rank)."""
    return _count(rank, "rank", 0) // _count(node_size, "node_size")


def local_index(rank: int, node_size: int) -> int:
    """``rank``'s position inside its node (torchrun's local_rank)."""
    return _count(rank, "rank", 0) % _count(node_size, "node_size")


def nodes(world_size: int, node_size: int) -> tuple[tuple[int, ...], ...]:
    """The ranks of every node, node by node: ``nodes(4, 2) == ((0, 1), (2, 3))``."""
    m, k = node_count(world_size, node_size), node_size
    return tuple(tuple(range(j * k, (j + 1) * k)) for j in range(m))


def across_lines(world_size: int, node_size: int) -> tuple[tuple[int, ...], ...]:
    """The ranks of the same local index on every node, one tuple per local index:
    ``across_lines(4, 2) == ((0, 2), (1, 3))``. A hierarchical all-reduce rings its
    chunks along these, so each line's traffic is the only traffic between nodes."""
    m, k = node_count(world_size, node_size), node_size
    return tuple(tuple(j * k + i for j in range(m)) for i in range(k))


def ring_bytes_per_rank(param_bytes: float, ranks: int) -> float:
    """What each rank sends in a ring all-reduce of ``param_bytes`` over ``ranks``:
    2(n − 1)/n · S (Patarasuk & Yuan, 2009); 0 alone."""
    n = _count(ranks, "ranks")
    return 2 * (n - 1) / n * param_bytes


def crossing_edges(world_size: int, node_size: int) -> int:
    """Edges r -> r + 1 (mod n) of a ring in rank order whose ends lie on two nodes:
    one per node (its last rank to the next node's first), none on a single node."""
    m = node_count(world_size, node_size)
    return 0 if m == 1 else m


def flat_ring_bytes(param_bytes: float, world_size: int, node_size: int) -> float:
    """Bytes crossing nodes in one ring all-reduce over all ranks in rank order, summed
    over the crossing edges (each carries what its sender sends: 2(n − 1)/n · S)."""
    return crossing_edges(world_size, node_size) * ring_bytes_per_rank(param_bytes, world_size)


def hierarchical_bytes(param_bytes: float, world_size: int, node_size: int) -> float:
    """Bytes crossing nodes in one hierarchical all-reduce: every rank rings its S/k
    chunk across the m nodes, every byte of that ring crossing: 2(m − 1) · S."""
    m = node_count(world_size, node_size)
    return world_size * ring_bytes_per_rank(param_bytes / node_size, m)


def local_sgd_bytes(param_bytes: float, world_size: int, node_size: int, H: int) -> float:
    """Bytes crossing nodes per step when the nodes average (hierarchically) every H steps."""
    return hierarchical_bytes(param_bytes, world_size, node_size) / _count(H, "H")


def slow_link_bytes(how: str, param_bytes: float, world_size: int, node_size: int,
                    H: int = 1) -> float:
    """Total bytes over the slow link per training step, all ranks together.

    how: "flat", "hierarchical" or "local_sgd"; param_bytes: the gradient's (or the
    model's) bytes S; H: steps between two averagings across nodes (local_sgd only; the
    other two average every step).
    """
    H = _count(H, "H")
    if how == "flat":
        return flat_ring_bytes(param_bytes, world_size, node_size)
    if how == "hierarchical":
        return hierarchical_bytes(param_bytes, world_size, node_size)
    if how == "local_sgd":
        return local_sgd_bytes(param_bytes, world_size, node_size, H)
    raise ValueError(f"how must be one of {HOWS}, got {how!r}")


def bytes_per_rank(how: str, param_bytes: float, world_size: int, node_size: int,
                   H: int = 1) -> float:
    """The most one rank sends over the slow link per step: the node's last rank in a
    flat ring; every rank alike in the hierarchical pattern (its chunk's ring)."""
    if how == "flat":
        crossing = crossing_edges(world_size, node_size)
        return ring_bytes_per_rank(param_bytes, world_size) if crossing else 0.0
    return slow_link_bytes(how, param_bytes, world_size, node_size, H) / world_size
