"""A link between two devices (alpha-beta), a message over it, and a ring all-reduce.

Communication follows the alpha-beta (Hockney) model: a message of S bytes over a link
of latency alpha and bandwidth beta takes alpha + S / beta. A ring all-reduce over n
ranks takes 2(n - 1) steps, each moving S / n bytes (Patarasuk & Yuan, 2009; Thakur,
Rabenseifner & Gropp, 2005): 2(n - 1) alpha + 2(n - 1)/n S / beta.
"""
from __future__ import annotations

from dataclasses import dataclass

from .checks import amount, count


@dataclass(frozen=True)
class Link:
    """A link's latency alpha (seconds) and bandwidth beta (bytes per second)."""

    latency_s: float
    bandwidth_Bps: float

    def __post_init__(self):
        amount("Link", "latency_s", self.latency_s, unit="seconds")
        amount("Link", "bandwidth_Bps", self.bandwidth_Bps, unit="bytes per second",
               positive=True, infinite=True)

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps

    def __str__(self) -> str:
        return f"alpha {self.latency_s * 1e6:.0f} us, beta {self.bandwidth_Bps / 1e9:.3g} GB/s"


def send_s(nbytes: float, link: Link) -> float:
    """One point-to-point message: alpha + S / beta."""
    return link.time(amount("send_s", "nbytes", nbytes, unit="bytes"))


def all_reduce_s(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce of S bytes over n ranks: 2(n-1) alpha + 2(n-1)/n S / beta (0 if n = 1)."""
    n = count("all_reduce_s", "n (ranks)", n)
    nbytes = amount("all_reduce_s", "nbytes", nbytes, unit="bytes")
    if n == 1:
        return 0.0
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * nbytes / link.bandwidth_Bps
