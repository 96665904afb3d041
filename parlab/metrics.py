"""Numbers the labs compute from measurements: bandwidth, speed-up, efficiency, bubbles.

Plain Python and numpy only; every function says which formula it implements.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def bus_factor(op: str, world_size: int) -> float:
    """How many times its buffer each rank must move over the links for ``op``.

    Bus bandwidth = algorithm bandwidth x this factor; it is comparable across world
    sizes and with the link's peak (NVIDIA nccl-tests, doc/PERFORMANCE.md). A ring
    all-reduce is a reduce-scatter plus an all-gather, each moving (n-1)/n of the data
    per rank, hence 2(n-1)/n.
    """
    n = world_size
    if n < 1:
        raise ValueError("world_size must be >= 1")
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "broadcast": 1.0,
        "send_recv": 1.0,
    }
    try:
        return factors[op]
    except KeyError:
        raise ValueError(f"no bus factor for {op!r}; known: {sorted(factors)}") from None


def ring_allreduce_bytes_per_rank(message_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``message_bytes``: 2(n-1)/n * S."""
    return bus_factor("all_reduce", world_size) * message_bytes


@dataclass(frozen=True)
class LinkFit:
    """The alpha-beta (Hockney) model of a link: time(S) = latency + S / bandwidth."""

    latency_s: float
    bandwidth_Bps: float

    def time(self, message_bytes):
        return self.latency_s + np.asarray(message_bytes, dtype=float) / self.bandwidth_Bps

    def __str__(self) -> str:
        return (f"latency ~ {self.latency_s * 1e6:.0f} us, "
                f"bandwidth ~ {self.bandwidth_Bps / 1e9:.2f} GB/s")


def fit_line(xs, ys) -> tuple[float, float]:
    """(slope, intercept) of the least-squares straight line y = intercept + slope x.
    Compute rates are fitted this way: seconds against FLOPs (or samples) of a step."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError(f"a straight line needs two different x values, got {list(xs)}")
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)


def fit_link(message_bytes, seconds) -> LinkFit:
    """Least-squares fit of time = alpha + S/beta, weighting each point relatively.

    Dividing both sides by the measured time gives every size the same weight, so the
    microsecond latencies of small messages are not drowned by the large ones.
    """
    s = np.asarray(message_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if s.size < 2:
        raise ValueError("need at least two message sizes to fit latency and bandwidth")
    a = np.stack([np.ones_like(s), s], axis=1) / t[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    alpha = max(float(alpha), 0.0)
    inv_beta = max(float(inv_beta), 1e-30)
    return LinkFit(alpha, 1.0 / inv_beta)


def speedup(reference_s: float, parallel_s: float) -> float:
    """How many times faster the parallel run is: T1 / Tn."""
    return reference_s / parallel_s


def efficiency(reference_s: float, parallel_s: float, n_devices: int) -> float:
    """Speed-up per device: T1 / (n * Tn); 1.0 is perfect scaling."""
    return speedup(reference_s, parallel_s) / n_devices


def pipeline_bubble(stages: int, micro_batches: int) -> float:
    """Idle share of a GPipe or 1F1B pipeline: (p-1)/(m+p-1) (Huang et al., GPipe, 2019)."""
    if stages < 1 or micro_batches < 1:
        raise ValueError("stages and micro_batches must be >= 1")
    return (stages - 1) / (micro_batches + stages - 1)


# ------------------------------------------------------------------ equivalence
def max_difference(a: dict, b: dict, keys=None) -> float:
    """Largest absolute difference between two sets of named arrays (e.g. parameters).

    The equivalence checks of every lab: a parallel run against its single-device
    reference. ``keys``: compare only these names (default: every name in ``b``); a name
    missing from ``a`` is an error, not a silent zero.
    """
    keys = list(b) if keys is None else list(keys)
    missing = [k for k in keys if k not in a]
    if missing:
        raise KeyError(f"{missing[:3]} missing from the first set (it has {list(a)[:5]}...)")
    return largest_difference((a[k], b[k]) for k in keys)


def largest_difference(pairs) -> float:
    """Largest absolute difference over (got, want) pairs of arrays (0 for none): what
    ``max_difference`` reads from two named sets, for a run whose parts pair otherwise
    (a rank's slice against its part of the whole)."""
    return max((float(np.max(np.abs(np.asarray(x, dtype=float) - np.asarray(y, dtype=float))))
                for x, y in pairs), default=0.0)


def identical(states) -> bool:
    """True when every set of named arrays equals the first to the last bit (replicas)."""
    states = list(states)
    first = states[0]
    return all(set(s) == set(first) and all(np.array_equal(s[k], first[k]) for k in first)
               for s in states[1:])


def merged(results, key: str = "state") -> dict:
    """One set of named arrays from the ranks' parts (e.g. each pipeline stage's state)."""
    out: dict = {}
    for r in results:
        out.update(r[key])
    return out


def ranks_with_ties(values):
    """Ranks 1..n of ``values``, ties sharing their mean rank (for Spearman's rho)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out, i = [0.0] * len(values), 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in order[i:j + 1]:
            out[k] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a, b) -> float:
    """Spearman's rank correlation: Pearson's on the ranks (ties: mean ranks)."""
    ra, rb = np.array(ranks_with_ties(list(a))), np.array(ranks_with_ties(list(b)))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((ra ** 2).sum() * (rb ** 2).sum()))
    return float((ra * rb).sum()) / den if den else 0.0
