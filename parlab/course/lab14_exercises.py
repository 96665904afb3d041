"""Lab 14's exercises: the bytes that cross the slow link (14.1), and the outer step of
local SGD and DiLoCo (14.2). Each check says what is wrong in words and returns the
function the lab goes on with: the learner's when it is right, the reference otherwise."""
from __future__ import annotations

import math

from .exercise import Exercise, check, register

# (how, S bytes, ranks, ranks a node): one node, two, four; a node of one rank
BYTES_CASES = tuple((how, S, n, k) for how in ("flat", "hierarchical")
                    for S, n, k in ((1000, 4, 2), (4096, 8, 4), (1e6, 16, 8), (1e6, 16, 16),
                                    (640, 4, 1)))


def slow_link_bytes(how, S, n, k):
    """The reference: bytes crossing nodes in one all-reduce of S bytes, all ranks together
    (``parlab.nodes.slow_link_bytes``)."""
    from ..nodes import slow_link_bytes as reference
    return reference(how, S, n, k)


register(Exercise(
    "slow_link_bytes", slow_link_bytes, BYTES_CASES,
    "A ring over n ranks in rank order: each rank sends 2(n - 1)/n · S to its right "
    "neighbour, and m = n/k of the ring's edges leave a node. Hierarchical: each of the n "
    "ranks rings its S/k chunk across the m nodes, 2(m - 1)/m · S/k, every byte of it "
    "crossing. One node: nothing crosses.",
    close=lambda got, want: math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)))


def outer_step(start, deltas, velocity, lr, momentum):
    """The reference: each node's start − its model now (``deltas``, one array per node)
    averaged into the pseudo-gradient Δ; then SGD with Nesterov momentum on it:
    v ← μ·v + Δ, start ← start − lr·(Δ + μ·v). Returns (new start, new velocity)."""
    import numpy as np
    delta = np.mean(deltas, axis=0)
    velocity = momentum * velocity + delta
    return start - lr * (delta + momentum * velocity), velocity


def _outer_cases():
    import numpy as np
    start, v = np.array([1.0, -2.0]), np.array([0.5, 0.25])
    deltas = [np.array([0.5, 1.0]), np.array([0.25, -1.0])]
    return ((start, deltas, np.zeros(2), 1.0, 0.0), (start, deltas, v, 0.7, 0.9),
            (start, deltas[:1], v, 0.5, 0.5))


def _close_pair(got, want):
    import numpy as np
    return len(got) == 2 and all(np.allclose(g, w, atol=1e-12) for g, w in zip(got, want))


register(Exercise(
    "outer_step", outer_step, _outer_cases(),
    "Average the nodes' changes first: Δ = mean(deltas). Then v ← μ·v + Δ and "
    "start ← start − lr·(Δ + μ·v). With lr = 1 and μ = 0 the new start is the "
    "average of the nodes' models.", close=_close_pair))


def check_slow_link_bytes(fn):
    return check("slow_link_bytes", fn)


def check_outer_step(fn):
    return check("outer_step", fn)
