"""Run every rank's program on paper: the event engine behind the predicted timelines.

A program is a rank's list of operations, in the order its code runs them:
``Compute`` (busy for some seconds), ``Send`` / ``Recv`` (point to point, matched in
order per pair of ranks and tag), ``Collective`` (every member of a group; blocking,
or in the background on a lane of its own, as DDP's bucket all-reduces run) and
``Join`` (wait for the background ones). Each rank steps through its list as far as its
peers allow; a rank that reaches a receive or collective before its peers WAITS, and the
transfer starts when the last one arrives (a rendezvous), as ``trace.split_waits`` reads
the measured timelines. If every rank is blocked before the end, the programs deadlock and
the engine says where.

``wake_s``: on an oversubscribed CPU a rank that blocked (it sleeps in the kernel)
runs again only when the scheduler gives it a core back; a message that a rank had to
wait for therefore ends that much later for it (counted as waiting), and so does every
collective (its members, descheduled at random, never arrive together: one always
blocks). On a GPU, where NCCL spins, it is 0. ``wake_curve``: how late a receive resumes
grows with how long it blocked (measured here, beyond the message's own time: 0-0.3 ms
after a block of 2 ms in most calibrations, 0.3-0.65 ms after 20 ms; the longer a
processor sleeps, the more it has to wake from, and the sweep's price already holds a
short block's wake-up): given measured points (seconds blocked, seconds late), a
receive that blocked ``b`` resumes late by the straight line through them at ``b`` (from
nothing at no block, flat after the last point); ``wake_s`` then serves only the
collectives, whose members' blocks the engine does not follow.

``handoff``: a background collective is not the whole of what its rank waits for. DDP
copies the last gradients into the bucket and calls its hook before the all-reduce
starts; after it ends, the hook divides and copies the result back and wakes the thread
waiting in ``backward()``. Measured here on lab 05's MLP: 0.05-0.07 ms to the post and
0.3-0.5 ms after (calibrated: ``Cluster.handoff_s``). A background collective starts
``before`` after its last member posts it (and a wake-up), and a ``Join`` ends ``after``
after the last one it waits for. ``held``: an isend leaves on its rank's own gloo thread,
which may wait for the core until the rank next blocks (``shared_cores.held_s``).

``oversubscribed``: with more runnable threads than cores (ranks, plus DDP's
communication thread on a rank whose background lane runs beside its compute:
``lane_runs_beside_compute``), a rank woken by a message
queues behind ``threads / cores`` runnable threads per core before it runs: each
wake-up costs ``wake_s × threads / cores``. And a collective is not one rendezvous but
its ring's 2(n - 1) blocking steps (gloo), each one more wake-up, ``wake_s`` each: while
a collective runs its members block in it, so a woken member does not queue behind
them (charging ``threads / cores`` per ring step over-predicted lab 07's 4-rank meshes by
1.3-1.8x). This is why a message costs far more while ranks compute on shared cores
than an idle ping-pong sweep measures (calibrated: ``wake_s`` alone, from one blocked
receive).

``spread``: messages measured on one machine do not all take their price: most come
close, a few in ten wait milliseconds for a core. A step sums many of them, so a
predicted step that priced each at its typical (median) time misses the slow ones that a
step of ten messages rarely avoids, and one priced at their mean charges a step of two
messages for stalls it seldom meets. Given the measured strays (``Cluster.
message_spread_s``, ``collective_spread_s``: each measured message's time less its
price), the engine adds to every message and collective (to half the one-pass ones:
``_collective_start``) one of them, drawn at random (seeded), once per message, so that
each predicted step meets stalls as often as a measured one; the median of many predicted
steps then reads as the median measured step does (the bootstrap, Efron 1979).

``cores``: simulated devices on a CPU share its cores. When more ranks compute at once
than there are cores, each computes at cores / computing of its speed (processor
sharing, as a fair scheduler gives), so the engine runs in time order, event by event.
A message needs cores too: gloo moves the bytes on threads of its own, one at each end
(measured here: a 2-rank all-reduce of 32 bytes kept each rank's ``gloo_tcp_loop``
thread busy 0.6 ms in the kernel, of 1.5 ms), so a transfer that starts while ranks
compute shares the cores with them: with ``computing + library threads`` over
``cores``, it takes that many / cores times its time (two library threads for a
message, one per member for a collective). On two cores this is what delays a
pipeline's activations: stage 0 computes its next micro-batch while its last one
travels.

Consecutive compute operations with the same name become one span, enclosing the
transfers between them, as a measured ``with span("forward"):`` encloses its collectives.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from ..trace import COMM, COMPUTE, WAIT, Span, Timeline
from .checks import amount
from .shared_cores import held_s, oversubscription, ring_wakeups_s, wake_after  # noqa: F401


@dataclass(frozen=True)
class Compute:
    name: str
    seconds: float
    layer: int | None = None     # the network layer it computes (where known)

    def __post_init__(self):     # a NaN here would keep the clock from ever passing it
        amount(f"Compute {self.name!r}", "seconds", self.seconds, unit="seconds")


@dataclass(frozen=True)
class Send:
    peer: int
    nbytes: float
    seconds: float
    name: str = "send"
    axis: str | None = None
    blocking: bool = False       # a blocking send waits for its receive; isend does not
    tag: int = 0                 # messages of other tags between the pair are matched apart

    def __post_init__(self):
        amount(f"Send {self.name!r}", "seconds", self.seconds, unit="seconds")
        amount(f"Send {self.name!r}", "nbytes", self.nbytes, unit="bytes")


@dataclass(frozen=True)
class Recv:
    peer: int
    nbytes: float
    name: str = "recv"
    axis: str | None = None
    tag: int = 0


@dataclass(frozen=True)
class Collective:
    group: tuple
    nbytes: float
    seconds: float
    name: str = "all-reduce"
    axis: str | None = None
    background: bool = False     # runs on the rank's second lane; the rank goes on

    def __post_init__(self):
        amount(f"Collective {self.name!r}", "seconds", self.seconds, unit="seconds")
        amount(f"Collective {self.name!r}", "nbytes", self.nbytes, unit="bytes")

    @property
    def passes(self) -> int:
        """Passes round the ring: an all-reduce's two, or one (all-to-all: one exchange)."""
        return 1 if self.name.startswith(("all-gather", "reduce-scatter", "all-to-all")) else 2


@dataclass(frozen=True)
class Join:
    """Wait for the rank's background collectives, all but the ``leave`` posted last (its
    lane runs them in the order they were posted)."""

    name: str = "wait for all-reduce"
    leave: int = 0


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
        notes: dict | None = None, wake_s: float = 0.0, cores: int = 0,
        spread: tuple = ((), ()), wake_curve: tuple = (),
        handoff: tuple = (0.0, 0.0), held: float = 0.0) -> PredictedTimeline:
    """Every rank's program on one clock, as a predicted timeline (see the module doc).

    cores: the processors the ranks share, processor sharing (0: each its own, as GPUs).
    spread: (point-to-point strays, collective strays) in seconds, drawn from per message.
    wake_curve: ((seconds blocked, seconds late), ...) measured: a blocked receive's wake-up.
    handoff: (before, after) seconds around a background collective (the module doc).
    held: the share of isends whose data waits for the sender to block (``held_s``).
    """
    sim = Engine(programs, wake_s, cores, spread, wake_curve, handoff, held)
    sim.run()
    return PredictedTimeline(merge_compute(sim.spans), labels,
                             range(len(programs)) if labels is None else None,
                             steps=steps, notes=notes)


class Engine:
    """Runs the programs in time order, event by event.

    At each moment every rank that is free starts what its next operation allows: a
    compute (work left, done at the shared rate), a transfer (a fixed time), or nothing
    (it waits for a peer). Then time moves to the next moment something ends.
    """

    def __init__(self, programs, wake_s: float = 0.0, cores: int = 0,
                 spread: tuple = ((), ()), wake_curve: tuple = (),
                 handoff: tuple = (0.0, 0.0), held: float = 0.0):
        self.programs, self.held = programs, held
        self.wake_s, self.cores = wake_s, cores
        self.wake_curve = tuple(sorted(wake_curve))
        self.handoff_before, self.handoff_after = handoff
        self.spread = tuple(tuple(x) for x in spread)
        self.settled: dict[tuple, float] = {}     # message or collective key -> its seconds
        self.draw = random.Random(SPREAD_SEED)
        self.n, self.now = len(programs), 0.0
        self.pos, self.spans = [0] * self.n, []
        self.arrived_at = [0.0] * self.n          # when the rank reached its current op
        self.work: dict[int, tuple[float, float, str]] = {}   # computing: (start, left, name)
        self.busy_until: dict[int, float] = {}    # in a transfer (or a wait) until
        self.sends: dict[tuple, tuple] = {}       # (src, dst, tag, k) -> (post time, send op)
        self.recvs: dict[tuple, float] = {}       # (src, dst, tag, k) -> arrival of the receive
        self.pairs: dict[tuple, int] = {}         # (src, dst, tag, "s" | "r") -> next k
        self.posted: dict[tuple, int] = {}        # (rank, position) -> its number
        self.arrived: dict[tuple, dict] = {}      # collective key -> {rank: arrival}
        self.seq: dict[tuple, int] = {}           # (rank, group, background) -> next k
        self.resolved: set = set()                # background collectives already run
        self.lane_free = [0.0] * self.n           # background lane of each rank
        self.posted_bg: list[list] = [[] for _ in programs]   # rank -> keys, in posting order
        self.bg_end: dict[tuple, float] = {}      # background collective key -> its end
        threads = self.n + sum(map(lane_runs_beside_compute, programs))
        self.over = oversubscription(threads, cores)
        self.wake = wake_s * self.over            # a woken rank queues for a core

    # -- the loop
    def run(self) -> None:
        while True:
            self._start_what_can_start()
            if not self.work and not self.busy_until:
                if any(self.pos[r] < len(self.programs[r]) for r in range(self.n)):
                    stuck = [f"rank {r} at {self.programs[r][self.pos[r]]}" for r in range(self.n)
                             if self.pos[r] < len(self.programs[r])]
                    raise Deadlock("these programs deadlock: " + "; ".join(stuck))
                return
            self._advance()

    def _rate(self) -> float:
        computing = len(self.work)
        return 1.0 if not self.cores or computing <= self.cores else self.cores / computing

    def _advance(self) -> None:
        rate = self._rate()
        ends = [self.now + left / rate for _, left, _ in self.work.values()]
        ends += list(self.busy_until.values())
        t = max(min(ends), self.now)
        for r, (start, left, name) in list(self.work.items()):
            left -= (t - self.now) * rate
            if left <= 1e-15 * max(1.0, t):
                del self.work[r]
                self._span(r, COMPUTE, name, start, t)
                self._next(r, t)
            else:
                self.work[r] = (start, left, name)
        for r, until in list(self.busy_until.items()):
            if until <= t:
                del self.busy_until[r]
                self._next(r, t)
        self.now = t

    def _next(self, r: int, t: float) -> None:
        self.pos[r] += 1
        self.arrived_at[r] = t

    def _start_what_can_start(self) -> None:
        progressed = True
        while progressed:
            progressed = False
            for r in range(self.n):
                while (r not in self.work and r not in self.busy_until
                       and self.pos[r] < len(self.programs[r])):
                    op = self.programs[r][self.pos[r]]
                    result = getattr(self, f"_{type(op).__name__.lower()}")(r, op)
                    if result is None:              # blocked: try again later
                        break
                    progressed = True
                    if result is True:              # done at once (a post)
                        self._next(r, self.now)

    def _span(self, rank, kind, name, start, end, nbytes=0, peer=None, axis=None):
        if end > start or kind == COMM:
            self.spans.append(Span(rank, kind, name, start, end, int(nbytes), peer, axis))

    def _occupy(self, r: int, until: float) -> str:
        self.busy_until[r] = until
        return "busy"

    # -- operations: None (blocked), True (done now) or "busy" (started)
    def _compute(self, r, op: Compute):
        if op.seconds <= 0:
            return True
        self.work[r] = (self.now, op.seconds, op.name)
        return "busy"

    def _number(self, r: int, counter: dict, key: tuple) -> int:
        """The op's sequence number among its kind, taken once, on first visit."""
        mark = (r, self.pos[r])
        if mark not in self.posted:
            self.posted[mark] = counter.get(key, 0)
            counter[key] = self.posted[mark] + 1
        return self.posted[mark]

    def _send(self, r, op: Send):
        key = (r, op.peer, op.tag, self._number(r, self.pairs, (r, op.peer, op.tag, "s")))
        if not op.blocking:     # its data leaves when the rank's gloo thread gets the core
            self.sends.setdefault(key, (self.now + held_s(self.held, self.programs[r],
                                                          self.pos[r]), op))
            return True
        self.sends.setdefault(key, (self.now, op))
        if key not in self.recvs:
            return None
        return self._transfer(r, op.name, max(self.arrived_at[r], self.recvs[key]), op, op.peer,
                              key)

    def _recv(self, r, op: Recv):
        key = (op.peer, r, op.tag, self._number(r, self.pairs, (op.peer, r, op.tag, "r")))
        self.recvs.setdefault(key, self.arrived_at[r])
        if key not in self.sends:
            return None
        post, send = self.sends[key]
        return self._transfer(r, op.name, max(post, self.arrived_at[r]), send, op.peer, key)

    def _transfer(self, r, name, start, send: Send, peer, key) -> str:
        arrived = self.arrived_at[r]
        if start > arrived:                  # it blocked: it resumes when scheduled again
            start += self._woken(start - arrived)
        seconds = self._seconds(("p", *key), send.seconds, self.spread[0], 2)
        self._span(r, WAIT, name, arrived, start, peer=peer, axis=send.axis)
        self._span(r, COMM, name, start, start + seconds, send.nbytes, peer, send.axis)
        return self._occupy(r, start + seconds)

    def _woken(self, blocked: float) -> float:
        """How late a receive that blocked ``blocked`` seconds resumes: the measured
        ``wake_curve`` at that block (``wake_after``), else ``wake_s``; queued behind the
        runnable threads where they outnumber the cores."""
        if not self.wake_curve:
            return self.wake
        return wake_after(blocked, self.wake_curve) * self.over

    def _computing(self) -> int:
        """Ranks computing now, with those free to start a compute at this same moment
        (the engine starts the ranks of one moment in turn; their order must not count)."""
        starting = sum(1 for r in range(self.n)
                       if r not in self.work and r not in self.busy_until
                       and self.pos[r] < len(self.programs[r])
                       and isinstance(self.programs[r][self.pos[r]], Compute)
                       and self.programs[r][self.pos[r]].seconds > 0)
        return len(self.work) + starting

    def _seconds(self, key: tuple, price: float, strays: tuple, library_threads: int) -> float:
        """A message's or collective's time, settled the first time one of its ranks asks
        (as it starts), so that every rank of it sees the same: its price, plus one
        measured stray drawn at random (never below nothing), stretched where its library
        threads (one per rank it joins) and the ranks computing outnumber the cores
        (processor sharing, as for compute; the load as it starts, held)."""
        if key not in self.settled:
            seconds = max(price + (self.draw.choice(strays) if strays else 0.0), 0.0)
            threads = self._computing() + library_threads
            if self.cores and threads > self.cores:
                seconds *= threads / self.cores
            self.settled[key] = seconds
        return self.settled[key]

    def _collective(self, r, op: Collective):
        k = self._number(r, self.seq, (r, op.group, op.background))
        key = (op.group, op.background, k)
        arrivals = self.arrived.setdefault(key, {})
        if r not in arrivals:
            arrivals[r] = self.arrived_at[r]
            if op.background:
                self.posted_bg[r].append(key)
        if op.background:
            if len(arrivals) == len(op.group) and key not in self.resolved:
                self.resolved.add(key)
                self._resolve_background(op, arrivals, key)
            return True
        if len(arrivals) < len(op.group):
            return None
        start = self._collective_start(arrivals.values(), self._back_to_back(op), op.passes)
        end = start + self._collective_s(op, key)
        self._span(r, WAIT, op.name, arrivals[r], start, axis=op.axis)
        self._span(r, COMM, op.name, start, end, op.nbytes, axis=op.axis)
        return self._occupy(r, end)

    def _collective_s(self, op: Collective, key: tuple) -> float:
        """Its seconds on the link with its drawn stray, stretched on shared cores
        (``_seconds``), plus, on oversubscribed cores, a wake-up per ring step.

        The strays are measured on all-reduces of two ranks: two passes, each a blocking
        exchange that may wait for a core; a one-pass collective (an all-gather) meets
        one half as often: it draws a stray with probability 1/2 (measured, lab 03 naive
        pinned, two launches: 19-24 % of 928 all-gathers took over 1.5 ms, 44-53 % of
        696 all-reduces)."""
        settled, strays = ("c", *key), self.spread[1]
        if op.passes < 2 and strays and settled not in self.settled \
                and self.draw.random() >= op.passes / 2:
            strays = ()
        return self._seconds(settled, op.seconds, strays, len(op.group)) \
            + ring_wakeups_s(len(op.group), self.wake_s, self.over)

    def _collective_start(self, ready, back_to_back: bool = False, passes: int = 2) -> float:
        """When the last member is there, plus one wake-up: the members never arrive
        together (their computes differ by a little, and on a busy CPU each is descheduled
        at random), so one always blocked. Not where the ranks fit the cores, back to back
        (the members left the one before together; lab 05 by hand: its eight all-reduces a
        step waited 2-20 us each for the peer, DDP's one up to 1.5 ms) or in one pass: half
        the strays are all an all-gather meets (lab 03 naive, 27 launches: past its price by
        -0.13 ms at the median, 0.32 ms on the mean; half the strays give 0.43, with half a
        wake-up 0.69; its all-reduces 1.07 ms, a wake-up and the strays 1.38). Oversubscribed,
        a one-pass collective pays half."""
        if self.over <= 1.0 and (back_to_back or passes < 2):
            return max(ready)
        return max(ready) + self.wake * passes / 2

    def _back_to_back(self, op: Collective) -> bool:
        """Whether every member comes straight from a blocking collective of the same
        group (every member is at ``op`` now: it cannot start before they all are)."""
        def before(m):
            return self.programs[m][self.pos[m] - 1] if self.pos[m] else None
        return all(isinstance(b := before(m), Collective) and not b.background
                   and b.group == op.group for m in op.group)

    def _resolve_background(self, op: Collective, arrivals: dict, key: tuple) -> None:
        """All members posted: the collective runs when the last has, and every lane is free."""
        start = self._collective_start([*(t + self.handoff_before for t in arrivals.values()),
                                        *(self.lane_free[m] for m in op.group)], False, op.passes)
        end = start + self._collective_s(op, key)
        for m in op.group:
            lane = self.n + m
            self._span(lane, WAIT, op.name, max(arrivals[m], self.lane_free[m]), start, axis=op.axis)
            self._span(lane, COMM, op.name, start, end, op.nbytes, axis=op.axis)
            self.lane_free[m] = end
        self.bg_end[key] = end

    def _join(self, r, op: Join):
        """Wait until every background collective this rank posted, but the ``leave`` it
        posted last, has run (the lane runs them in order: the latest of those ends)."""
        keys = self.posted_bg[r][:max(len(self.posted_bg[r]) - op.leave, 0)]
        if any(k not in self.bg_end for k in keys):
            return None
        t = self.arrived_at[r]
        done = max((self.bg_end[k] + self.handoff_after for k in keys), default=0.0)
        if done <= t:
            return True
        self._span(r, WAIT, op.name, t, done)
        return self._occupy(r, done)


SPREAD_SEED = 0        # the draws of message strays: fixed, so a prediction is repeatable


def lane_runs_beside_compute(prog) -> bool:
    """Whether a rank's background lane (DDP's communication thread) is ever runnable while
    its rank computes: some background collective is followed by a compute before the
    ``Join`` that waits for it. With one bucket a step, posted after the last backward
    pass, the lane runs only while its rank sleeps in the ``Join`` (and the other members
    are there too: a collective starts when the last posts), so it adds no runnable thread
    to queue behind. Measured on lab 05's DDP (one bucket, 2 ranks on 2 cores, two
    launches), counting the lane anyway predicted its all-reduce's wait and time at 2.3-2.9
    ms (medians) where 0.6-2.2 ms were measured."""
    posted = False
    for op in prog:
        if isinstance(op, Collective) and op.background:
            posted = True
        elif isinstance(op, Join):
            posted = op.leave > 0          # it leaves some still running
        elif posted and isinstance(op, Compute) and op.seconds > 0:
            return True
    return False


def merge_compute(spans: list[Span]) -> list[Span]:
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

