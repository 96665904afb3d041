"""Collectives over a group of devices that may span nodes: inside a node over NVLink,
across nodes over every network card, and NVLink SHARP's in-switch reduction.

A group is ``size`` devices spaced ``stride`` apart in the rank order (a mesh axis: tp
has stride 1, pp stride tp, dp stride pp tp), on nodes of ``devices_per_node``. ``k`` of
its members share a node; it spans N = size / k nodes.

* Inside one node: a ring over the intra-node link, 2(n - 1) alpha + 2(n - 1)/n S / B
  (``model.all_reduce_s``; nccl-tests' doc/PERFORMANCE.md: bus bandwidth = algorithm
  bandwidth x 2(n - 1)/n).
* Across nodes, every card (multi-rail): NCCL runs one ring per channel and spreads the
  channels over the node's network cards, each card taking the traffic of the GPU beside
  it (rail-optimised DGX fabrics: one ConnectX card per GPU). A ring that leaves a node
  through one card carries 1/k of the buffer when the k members each drive their own;
  the bus bandwidth is min(B_nvlink, k x cards per GPU x B_card), with the slower link's
  latency on each step. One member per node (dp across nodes of a tp-8 mesh) gets one
  card; a whole node's 8 GPUs, 8 cards: 8 x 50 GB/s of NDR = 400 GB/s before protocol
  overheads, close to NVLink's. (Pricing it at one card per ring, as before, was ~10x
  below what multi-rail all-reduces reach across DGX nodes.)
* NVLink SHARP (NVLS; H100's third-generation NVSwitch, NCCL 2.17+): the switch adds the
  GPUs' contributions, so each GPU sends and receives about S (1 + 1/n) instead of the
  ring's 2(n - 1)/n S. Measured on 8 H100s it reaches a bus bandwidth of ~480 GB/s against
  the ring's ~370 (algorithm bandwidth ~275; NVIDIA/nccl-tests issue 212; NVIDIA/nccl
  issue 1455: NVLS 370, 420, 440, 460, 480 GB/s on 4, 5, 6, 7, 8 GPUs, the ring 365-370
  on 2-8). With B the sustained NVLink bandwidth, t = S (1 + 1/n) / (eta B) with
  eta = 0.86 reproduces those five (n = 4: 371; 8: 481 GB/s for B = 360 GB/s). Across
  nodes (NCCL's NVLSTree) the in-node part and the cards' part run pipelined: the slower
  of the two. NCCL picks the quicker algorithm; so do we.
Reduce-scatter and all-gather are each half a ring all-reduce: (n - 1) alpha +
(n - 1)/n S / B, S the whole buffer.
* All-to-all (expert parallelism's dispatch and combine; ``sim.experts``): each rank
  holds S bytes, S / n for each member, and keeps its own share. Pairwise exchange
  (Thakur, Rabenseifner & Gropp, 2005, MPICH's all-to-all for long messages: n - 1
  steps, in step i rank r sends to r + i and receives from r - i): (n - 1) alpha +
  (n - 1)/n S / B. nccl-tests counts the same bus bandwidth (src/alltoall.cu: algorithm
  bandwidth x (n - 1)/n). Across nodes the n - k shares for other nodes leave over the
  rank's network cards and the k - 1 for its node over NVLink, both in flight at once
  (NCCL groups an all-to-all's sends and receives): the slower of the two sets the pace.
"""
from __future__ import annotations

import math
from dataclasses import replace

from .checks import amount, count
from .links import Link, all_reduce_s

NVLS_EFFICIENCY = 0.86        # eta: fitted to the five NVLS measurements above


def members_per_node(cluster, size: int, stride: int = 1) -> int:
    """How many of a group's members share a node (k)."""
    per_node = cluster.devices_per_node
    if stride >= per_node:
        return 1
    return max(1, min(size, per_node // stride))


def spans_nodes(cluster, size: int, stride: int = 1) -> bool:
    return size > members_per_node(cluster, size, stride)


def ring_link(cluster, size: int, stride: int = 1) -> Link:
    """The link a ring over the group sees: the intra-node link inside a node; across
    nodes, the slower link's latency and min(intra bandwidth, k cards' bandwidth)."""
    if not spans_nodes(cluster, size, stride):
        return cluster.intra
    k = members_per_node(cluster, size, stride)
    cards = k * cards_per_device(cluster)
    bandwidth = cards * cluster.inter.bandwidth_Bps
    if k > 1:
        bandwidth = min(bandwidth, cluster.intra.bandwidth_Bps)
    return Link(max(cluster.inter.latency_s, cluster.intra.latency_s), bandwidth)


def cards_per_device(cluster) -> float:
    cards = getattr(cluster, "nics_per_node", 0) or cluster.devices_per_node
    return cards / cluster.devices_per_node


def nvls_s(cluster, nbytes: float, size: int, stride: int = 1) -> float:
    """An all-reduce with NVLink SHARP (see the module doc); inf where there is none."""
    if not getattr(cluster, "nvls", False) or size < 2:
        return math.inf
    k = members_per_node(cluster, size, stride)
    if k < 2:
        return math.inf
    intra = cluster.intra
    inside = 2 * intra.latency_s + nbytes * (1 + 1 / k) / (NVLS_EFFICIENCY * intra.bandwidth_Bps)
    nodes = math.ceil(size / k)
    if nodes == 1:
        return inside
    across = all_reduce_s(nbytes / k, nodes, replace(cluster.inter, bandwidth_Bps=(
        cards_per_device(cluster) * cluster.inter.bandwidth_Bps)))
    return max(inside, across)


def all_reduce_time(cluster, nbytes: float, size: int, stride: int = 1) -> float:
    """The quicker of the ring (multi-rail across nodes) and NVLink SHARP, plus the
    cluster's software overhead per call; 0 for one member."""
    if size == 1:
        return 0.0
    ring = all_reduce_s(nbytes, size, ring_link(cluster, size, stride))
    return min(ring, nvls_s(cluster, nbytes, size, stride)) + cluster.collective_overhead_s


def half_ring_time(cluster, nbytes: float, size: int, stride: int = 1) -> float:
    """A reduce-scatter or an all-gather of an S-byte buffer: (n-1) alpha + (n-1)/n S / B."""
    if size == 1:
        return 0.0
    link = ring_link(cluster, size, stride)
    return ((size - 1) * link.latency_s + (size - 1) / size * nbytes / link.bandwidth_Bps
            + cluster.collective_overhead_s)


def all_to_all_s(nbytes: float, n: int, link: Link) -> float:
    """Pairwise-exchange all-to-all of S bytes per rank over n ranks on one link:
    (n - 1) alpha + (n - 1)/n S / beta (0 for one rank; the module doc)."""
    n = count("all_to_all_s", "n (ranks)", n)
    nbytes = amount("all_to_all_s", "nbytes", nbytes, unit="bytes")
    if n == 1:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bandwidth_Bps


def all_to_all_time(cluster, nbytes: float, size: int, stride: int = 1) -> float:
    """An all-to-all of S bytes per rank over a group that may span nodes: inside a node,
    ``all_to_all_s`` on NVLink; across nodes, the k - 1 shares for the rank's own node
    over NVLink and the n - k for the others over its cards (``cards_per_device`` of
    them), at once: the slower of the two, plus the cluster's overhead per call."""
    size, stride = count("all_to_all_time", "size", size), count("all_to_all_time", "stride",
                                                                 stride)
    nbytes = amount("all_to_all_time", "nbytes", nbytes, unit="bytes")
    if size == 1:
        return 0.0
    if not spans_nodes(cluster, size, stride):
        return all_to_all_s(nbytes, size, cluster.intra) + cluster.collective_overhead_s
    k = members_per_node(cluster, size, stride)
    inside = (k - 1) * (cluster.intra.latency_s + nbytes / size / cluster.intra.bandwidth_Bps)
    cards = cards_per_device(cluster) * cluster.inter.bandwidth_Bps
    across = (size - k) * (cluster.inter.latency_s + nbytes / size / cards)
    return max(inside, across) + cluster.collective_overhead_s


def describe(cluster, size: int, stride: int = 1) -> str:
    """The path a group's collectives take, in words (for explorers)."""
    if size == 1:
        return "no communication"
    link = ring_link(cluster, size, stride)
    k = members_per_node(cluster, size, stride)
    if not spans_nodes(cluster, size, stride):
        how = "inside a node"
        if math.isfinite(nvls_s(cluster, 1.0, size, stride)):
            how += " (NVLink SHARP all-reduces)"
    else:
        nodes = math.ceil(size / k)
        cards = k * cards_per_device(cluster)
        how = (f"across {nodes} nodes, {k} per node, over {cards:g} network card"
               f"{'s' if cards != 1 else ''} per node")
    return f"{how}: {link.bandwidth_Bps / 1e9:,.0f} GB/s per ring"
