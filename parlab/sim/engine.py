"""Run every rank's program on paper: the event engine behind the predicted timelines.

A program is a rank's list of operations, in the order its code runs them:
``Compute`` (busy for some seconds), ``Send`` / ``Recv`` (point to point, matched in
order per pair of ranks), ``Collective`` (every member of a group; blocking, or in the
background on a lane of its own, as DDP's bucket all-reduces run) and ``Join`` (wait
for the background ones). Each rank steps through its list as far as its peers allow;
a rank that reaches a receive or collective before its peers WAITS, and the transfer
starts when the last one arrives (a rendezvous), as ``trace.split_waits`` reads the
measured timelines. If every rank is blocked before the end, the programs deadlock and
the engine says where.

Consecutive compute operations with the same name become one span, enclosing the
transfers between them, as a measured ``with span("forward"):`` encloses the
tensor-parallel all-reduces it calls.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..trace import COMM, COMPUTE, WAIT, Span, Timeline


@dataclass(frozen=True)
class Compute:
    name: str
    seconds: float


@dataclass(frozen=True)
class Send:
    peer: int
    nbytes: float
    seconds: float
    name: str = "send"
    axis: str | None = None
    blocking: bool = False       # a blocking send waits for its receive; isend does not


@dataclass(frozen=True)
class Recv:
    peer: int
    nbytes: float
    name: str = "recv"
    axis: str | None = None


@dataclass(frozen=True)
class Collective:
    group: tuple
    nbytes: float
    seconds: float
    name: str = "all-reduce"
    axis: str | None = None
    background: bool = False     # runs on the rank's second lane; the rank goes on


@dataclass(frozen=True)
class Join:
    name: str = "wait for all-reduce"


class Deadlock(ValueError):
    """Every rank is blocked: the programs cannot finish."""


class PredictedTimeline(Timeline):
    """A Timeline drawn by the cost model, not measured: ``predicted`` is True.

    ``plot.timeline`` draws it dotted and titled as a prediction. ``steps``: how many
    training steps it holds; ``step_s``: its duration per step; ``notes``: the inputs
    (strategy, cluster, where the per-layer costs came from).
    """

    predicted = True

    def __init__(self, spans, labels=None, ranks=None, *, steps: int = 1,
                 notes: dict | None = None):
        super().__init__(spans, labels, ranks)
        self.steps = steps
        self.notes = dict(notes or {})

    @property
    def step_s(self) -> float:
        return self.duration / max(self.steps, 1)

    @property
    def title(self) -> str:
        what = self.notes.get("strategy", "")
        return f"PREDICTED {what} (cost model, {self.notes.get('cluster', '')})".replace(" ()", "")

    def _like(self, tl: Timeline, steps: int) -> "PredictedTimeline":
        return PredictedTimeline(tl.spans, tl.labels, tl.ranks, steps=steps, notes=self.notes)

    def window(self, start: float, end: float) -> "PredictedTimeline":
        return self._like(super().window(start, end), 1)

    def filter(self, **kw) -> "PredictedTimeline":
        return self._like(super().filter(**kw), self.steps)


def run(programs: list[list], labels: dict | None = None, *, steps: int = 1,
        notes: dict | None = None) -> PredictedTimeline:
    """Every rank's program on one clock, as a predicted timeline (see the module doc)."""
    sim = _Engine(programs)
    sim.run()
    return PredictedTimeline(_merge_compute(sim.spans), labels,
                             range(len(programs)) if labels is None else None,
                             steps=steps, notes=notes)


class _Engine:
    def __init__(self, programs):
        self.programs = programs
        self.n = len(programs)
        self.clock = [0.0] * self.n
        self.pos = [0] * self.n
        self.spans: list[Span] = []
        self.sends: dict[tuple, tuple] = {}       # (src, dst, k) -> (post time, send op)
        self.recvs: dict[tuple, float] = {}       # (src, dst, k) -> arrival of the receive
        self.pairs: dict[tuple, int] = {}         # (src, dst, "s" | "r") -> next k
        self.posted: dict[tuple, bool] = {}       # (rank, position): its send was posted
        self.arrived: dict[tuple, dict] = {}      # collective key -> {rank: arrival}
        self.seq: dict[tuple, int] = {}           # (rank, group, background) -> next k
        self.lane_free = [0.0] * self.n           # background lane of each rank
        self.pending: dict[int, int] = {}         # rank -> background collectives unresolved

    def run(self) -> None:
        while any(self.pos[r] < len(self.programs[r]) for r in range(self.n)):
            progressed = False
            for r in range(self.n):
                while self.pos[r] < len(self.programs[r]) and self._step(r, self.programs[r][self.pos[r]]):
                    self.pos[r] += 1
                    progressed = True
            if not progressed:
                stuck = [f"rank {r} at {self.programs[r][self.pos[r]]}" for r in range(self.n)
                         if self.pos[r] < len(self.programs[r])]
                raise Deadlock("these programs deadlock: " + "; ".join(stuck))

    def _span(self, rank, kind, name, start, end, nbytes=0, peer=None, axis=None):
        if end > start or kind == COMM:
            self.spans.append(Span(rank, kind, name, start, end, int(nbytes), peer, axis))

    def _step(self, r: int, op) -> bool:
        return getattr(self, f"_{type(op).__name__.lower()}")(r, op)

    def _compute(self, r, op: Compute) -> bool:
        t = self.clock[r]
        self._span(r, COMPUTE, op.name, t, t + op.seconds)
        self.clock[r] = t + op.seconds
        return True

    def _pair_key(self, src, dst, role, r) -> tuple:
        mark = (r, self.pos[r])
        if mark not in self.posted:                 # first visit: take the next number
            k = self.pairs.get((src, dst, role), 0)
            self.pairs[(src, dst, role)] = k + 1
            self.posted[mark] = k
        return (src, dst, self.posted[mark])

    def _send(self, r, op: Send) -> bool:
        key = self._pair_key(r, op.peer, "s", r)
        self.sends.setdefault(key, (self.clock[r], op))
        if not op.blocking:
            return True
        if key not in self.recvs:
            return False
        start = max(self.clock[r], self.recvs[key])
        self._transfer(r, op.name, start, op, op.peer)
        return True

    def _recv(self, r, op: Recv) -> bool:
        key = self._pair_key(op.peer, r, "r", r)
        self.recvs.setdefault(key, self.clock[r])
        if key not in self.sends:
            return False
        post, send = self.sends[key]
        self._transfer(r, op.name, max(post, self.clock[r]), send, op.peer)
        return True

    def _transfer(self, r, name, start, send: Send, peer) -> None:
        self._span(r, WAIT, name, self.clock[r], start, peer=peer, axis=send.axis)
        self._span(r, COMM, name, start, start + send.seconds, send.nbytes, peer, send.axis)
        self.clock[r] = start + send.seconds

    def _collective(self, r, op: Collective) -> bool:
        mark = (r, self.pos[r])
        if mark not in self.posted:
            k = self.seq.get((r, op.group, op.background), 0)
            self.seq[(r, op.group, op.background)] = k + 1
            self.posted[mark] = k
            self.arrived.setdefault((op.group, op.background, k), {})[r] = self.clock[r]
            if op.background:
                self.pending[r] = self.pending.get(r, 0) + 1
        key = (op.group, op.background, self.posted[mark])
        arrivals = self.arrived[key]
        if op.background:
            if len(arrivals) == len(op.group) and key not in self.arrived.get("done", {}):
                self._resolve_background(op, arrivals)
                self.arrived.setdefault("done", {})[key] = True
            return True
        if len(arrivals) < len(op.group):
            return False
        start = max(arrivals.values())
        self._span(r, WAIT, op.name, self.clock[r], start, axis=op.axis)
        self._span(r, COMM, op.name, start, start + op.seconds, op.nbytes, axis=op.axis)
        self.clock[r] = start + op.seconds
        return True

    def _resolve_background(self, op: Collective, arrivals: dict) -> None:
        """All members posted: the collective runs when the last has, and every lane is free."""
        start = max([*arrivals.values(), *(self.lane_free[m] for m in op.group)])
        for m in op.group:
            lane = self.n + m
            self._span(lane, WAIT, op.name, max(arrivals[m], self.lane_free[m]), start, axis=op.axis)
            self._span(lane, COMM, op.name, start, start + op.seconds, op.nbytes, axis=op.axis)
            self.lane_free[m] = start + op.seconds
            self.pending[m] -= 1

    def _join(self, r, op: Join) -> bool:
        if self.pending.get(r, 0):
            return False
        t = self.clock[r]
        self._span(r, WAIT, op.name, t, max(t, self.lane_free[r]))
        self.clock[r] = max(t, self.lane_free[r])
        return True


def _merge_compute(spans: list[Span]) -> list[Span]:
    """Consecutive compute spans of one name on a rank become one enclosing span."""
    out: list[Span] = []
    last: dict[int, int] = {}                      # rank -> index in out of its last compute
    for s in sorted(spans, key=lambda s: (s.rank, s.start, s.kind != COMPUTE)):
        i = last.get(s.rank)
        if s.kind == COMPUTE:
            if i is not None and out[i].name == s.name:    # only transfers came between
                prev = out[i]
                out[i] = Span(prev.rank, COMPUTE, prev.name, prev.start, s.end)
                continue
            last[s.rank] = len(out)
        out.append(s)
    return out

