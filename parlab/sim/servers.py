"""Lab 06's parameter servers, predicted: a server and workers, sync or async.

Rank 0 serves the parameters, ranks 1.. are workers on batch / workers. Every pull and
push is a small header and then the tensor, as lab 06's protocol sends them. sync runs
through the event engine (the server takes the workers in rank order); async is its own
small simulation, because the server serves whichever push is ready first.
"""
from __future__ import annotations

import math
import numbers

from ..errors import counted, whole_number
from ..trace import COMM, COMPUTE, WAIT, Span
from . import limits
from .costs import Network, call_s
from .engine import (Compute, Engine, PredictedTimeline, Recv, Send, merge_compute,
                     oversubscription)
from .model import Cluster, send_s
from .program import Mesh, costs_for, divides, notes_for

HEADER_BYTES = 8                # a parameter server's message header: two float32


def parameter_server(net: Network, cluster: Cluster, batch: int, *, workers: int = 2,
                     mode: str = "sync", slow: dict | None = None, steps: int = 3,
                     costs=None) -> PredictedTimeline:
    """Lab 06: rank 0 serves the parameters, ranks 1.. are workers on batch / workers.

    sync: the server waits for every worker's gradients (in rank order), sums them,
    updates, and sends the new parameters to each. async: it serves pushes as they come,
    updates with each alone and sends that worker fresh parameters; a slow worker
    (``slow={rank: factor}``, its compute ``factor`` times longer) no longer holds the
    others up. steps: sync updates; async: the server applies steps × workers gradients.
    """
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
    batch, steps, workers = counted(batch, "batch"), counted(steps, "steps"), counted(workers, "workers")
    limits.ranks("parameter_server", f"workers={workers} and the server", workers + 1)
    # per step and worker: its pull, forward, backward and push, and the server's receive
    # and send (the async simulation writes as many spans)
    limits.operations("parameter_server", 6 * steps * workers,
                      f"steps={steps} × workers={workers}")
    slow = _slow_factors(slow, workers)
    costs = costs_for(net, cluster, costs)
    mesh = Mesh(cluster, workers + 1, 1, 1)
    per = divides(batch, workers, "workers")
    p = net.params
    # every pull and push is a small header (version, stop / loss) and then the tensor:
    # two messages, two latencies (lab 06's protocol)
    header = send_s(HEADER_BYTES, mesh.link["dp"])
    t_params = header + send_s(p * net.state["params"], mesh.link["dp"])
    t_grads = header + send_s(p * net.grad_wire_bytes, mesh.link["dp"])
    call = call_s(costs)                                 # each pass's own call, once
    fwd = call[0] + sum(costs.forward_s(i, per) for i in range(len(net)))
    bwd = call[1] + sum(costs.backward_s(i, per) for i in range(len(net)))
    update = costs.update_s(p)
    add = p * net.grad_wire_bytes * 3 / cluster.memory_bandwidth_Bps + cluster.layer_overhead_s
    sim = _ps_sync if mode == "sync" else _ps_async
    spans = sim(workers, steps, slow, fwd, bwd, update, add, t_params, t_grads,
                p * net.state["params"], p * net.grad_wire_bytes, mesh)
    labels = {0: "server (predicted)", **{w: f"worker {w} (predicted)" for w in range(1, workers + 1)}}
    return PredictedTimeline(spans, labels, steps=steps,
                             notes=notes_for(f"parameter server, {mode}", net, cluster, costs,
                                          slow=slow))


def _slow_factors(slow, workers: int) -> dict[int, float]:
    """{worker rank: factor}, each factor a finite number >= 1: one check for both modes
    (a NaN factor once slipped through the asynchronous one, which runs no engine)."""
    out = {}
    for r, f in (slow or {}).items():
        rank = whole_number(r)
        if rank not in range(1, workers + 1):
            raise ValueError(f"slow={slow}: keys must be worker ranks 1..{workers}, got {r!r}")
        if not (isinstance(f, numbers.Real) and not isinstance(f, bool)
                and math.isfinite(f) and f >= 1):
            raise ValueError(f"parameter_server: slow[{rank}] must be a finite number >= 1 "
                             f"(how many times longer worker {rank} computes), got {f!r}")
        out[rank] = float(f)
    return out


def _ps_sync(workers, steps, slow, fwd, bwd, update, add, t_params, t_grads, pbytes, gbytes,
             mesh):
    progs = [[] for _ in range(workers + 1)]
    ws = range(1, workers + 1)
    for w in ws:
        progs[0].append(Send(w, pbytes, t_params, "send params", None, True))
    for _ in range(steps):
        for w in ws:
            f = slow.get(w, 1.0)
            progs[w] += [Recv(0, pbytes, "pull params"), Compute("forward", fwd * f),
                         Compute("backward", bwd * f), Send(0, gbytes, t_grads, "push gradients")]
        for w in ws:
            progs[0] += [Recv(w, gbytes, "receive gradients"), Compute("sum gradients", add)]
        progs[0].append(Compute("apply update", update))
        for w in ws:
            progs[0].append(Send(w, pbytes, t_params, "send params", None, True))
    for w in ws:
        progs[w].append(Recv(0, pbytes, "pull params"))
    eng = Engine(progs, **mesh.engine_settings())
    eng.run()
    return merge_compute(eng.spans)


def _ps_async(workers, steps, slow, fwd, bwd, update, add, t_params, t_grads, pbytes, gbytes,
              mesh):
    """The server takes pushes in the order they are ready (first come, first served).

    A worker's push is non-blocking: once its backward is done it waits for the
    server, which receives the gradients, updates, and sends that worker parameters.
    (Shared cores are not modelled here: the server barely computes.)
    """
    wake = mesh.wake * oversubscription(workers + 1, mesh.cores)   # as the engine does
    spans: list[Span] = []
    server_free = 0.0
    ready = {}                                  # worker -> when its gradients are ready
    for w in range(1, workers + 1):            # the first pull, in rank order
        _pull(spans, w, 0.0, server_free, t_params, pbytes)
        server_free += t_params
        ready[w] = _work(spans, w, server_free, fwd, bwd, slow.get(w, 1.0))
    for _ in range(steps * workers):
        w = min(ready, key=lambda k: (ready[k], k))
        pushed = ready.pop(w)
        t = max(server_free, pushed)
        if pushed > server_free:            # the server slept: it wakes late
            t += wake
            spans.append(Span(0, WAIT, "wait for push", server_free, t))
        spans.append(Span(0, COMM, "receive gradients", t, t + t_grads, int(gbytes), w))
        spans.append(Span(w, WAIT, "wait for server", pushed, t))
        spans.append(Span(w, COMM, "push gradients", t, t + t_grads, int(gbytes), 0))
        t += t_grads
        spans.append(Span(0, COMPUTE, "apply update", t, t + update))
        t += update
        _pull(spans, w, t - update, t, t_params, pbytes, wake)
        server_free = t + t_params
        ready[w] = _work(spans, w, server_free + wake, fwd, bwd, slow.get(w, 1.0))
    return spans


def _pull(spans, w, waiting_from, t, t_params, pbytes, wake=0.0) -> None:
    """The server sends worker w the parameters at t; w waits for them from ``waiting_from``
    (and, having slept, ``wake`` longer)."""
    spans.append(Span(0, COMM, "send params", t, t + t_params, int(pbytes), w))
    spans.append(Span(w, WAIT, "wait for server", waiting_from, t))
    spans.append(Span(w, COMM, "pull params", t, t + t_params, int(pbytes), 0))
    if wake:
        spans.append(Span(w, WAIT, "wait for server", t + t_params, t + t_params + wake))


def _work(spans, w, t, fwd, bwd, factor) -> float:
    """A worker's forward and backward from ``t``; when its gradients are ready."""
    spans.append(Span(w, COMPUTE, "forward", t, t + fwd * factor))
    t += fwd * factor
    spans.append(Span(w, COMPUTE, "backward", t, t + bwd * factor))
    return t + bwd * factor
