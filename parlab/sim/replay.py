"""A run replayed on dedicated devices: what N devices would do with exactly this run's work.

On a laptop, N simulated devices share a few cores, and the wall clock shows them taking
turns. The trace holds what is needed to lay the same run out as N dedicated devices
would run it: how long each piece of work ran on a core, what each message carried, and
who waited for whom. This is trace-driven simulation, as Dimemas replays MPI traces
(Labarta et al., 1996) and ASTRA-sim replays execution traces (Won et al., 2023):

* **work** is the run's own, measured (``replay_program``: wall time less the time the
  thread waited for a core);
* **order**: a rank's spans stay in program order; nothing is reordered;
* **messages** cost alpha + S / beta on the chosen ``link``, from the moment the send
  starts (eager: the data is on its way whether or not the receive is posted yet); a
  receive ends when it has started and the data has arrived; a blocking send when its
  data has arrived; an ``isend`` only posts and goes on (a wait ends with delivery);
* **collectives** start when their last member arrives and cost the ring algorithm's
  alpha-beta time (``collective_s``); a background collective (DDP's buckets) starts
  when issued and after its rank's previous one (drawn from then), beside the rank's work;
* a **wait** ends when the rank's outstanding isends and background collectives are done.
  An any-source receiver serves its peers in the order their messages arrive in the
  replay, each peer's conversations in their own order (``replay_program``).

A replay is not a measurement and not a prediction: its timeline says so in its lanes
("rank 2 · replayed") and title, and ``plot.timeline`` draws it outlined.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..spans import Span
from ..timeline import Timeline
from .links import Link, all_reduce_s
from .replay_program import ISSUE, MARK, OP, WORK, compile_programs, complete_matches

# where this machine's idle link is kept: $PARLAB_CACHE, else $XDG_CACHE_HOME/parlab
_CACHE = os.environ.get("PARLAB_CACHE") or Path(
    os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "parlab"
LINK_CACHE = Path(_CACHE) / "idle-link.json"


@dataclass(frozen=True)
class TwoTier:
    """A fast link inside each node, a slow one between nodes; a group that spans nodes
    runs at the slow link's pace (its ring crosses it). Nodes: consecutive ranks,
    ``node_size`` a node; or ``nodes``, the ranks of each node, e.g. ((0, 2), (1, 3))."""

    inside: Link
    between: Link
    node_size: int = 0
    nodes: tuple = ()

    def __post_init__(self):
        if self.nodes:
            flat = [r for node in self.nodes for r in node]
            if len(flat) != len(set(flat)) or not all(isinstance(r, int) for r in flat):
                raise ValueError(f"TwoTier: nodes must list each rank once, got {self.nodes!r}")
        elif not (isinstance(self.node_size, int) and self.node_size >= 1):
            raise ValueError(f"TwoTier: node_size must be a whole number of ranks >= 1 "
                             f"(or give nodes=((0, 1), (2, 3))), got {self.node_size!r}")

    def node(self, rank: int):
        if not self.nodes:
            return rank // self.node_size
        found = [k for k, node in enumerate(self.nodes) if rank in node]
        if not found:
            raise ValueError(f"TwoTier: rank {rank} is in none of the nodes {self.nodes}")
        return found[0]

    def of(self, ranks) -> Link:
        return self.inside if len({self.node(r) for r in ranks}) == 1 else self.between

    def __str__(self) -> str:
        where = (f"nodes {list(map(list, self.nodes))}" if self.nodes
                 else f"{self.node_size} ranks a node")
        return f"{where}: inside {self.inside}; between nodes {self.between}"


def link_preset(name: str) -> Link:
    """A datasheet link, derated as the cost model's presets are: "nvlink" (H100),
    "pcie" (T4 on PCIe), "infiniband" (H100 nodes, one 400 Gb/s card per GPU), "ethernet"
    (1 Gb/s between machines with no faster network)."""
    from . import clusters
    presets = {"nvlink": lambda: clusters.h100_nvlink().intra,
               "pcie": lambda: clusters.t4_pcie().intra,
               "infiniband": lambda: clusters.h100_infiniband(2).inter,
               "ethernet": lambda: ETHERNET_1G}
    if name not in presets:
        raise ValueError(f"link preset must be one of {sorted(presets)}, got {name!r}")
    return presets[name]()


def ethernet(gbit_per_s: float) -> Link:
    """An Ethernet link of ``gbit_per_s`` as TCP sees it: over 1,500-byte frames, TCP
    carries 1,448 of every 1,538 bytes a frame takes on the wire (headers, preamble,
    gap): 94 %. Latency: a switched LAN's one-way time through two TCP stacks, 50 us."""
    return Link(50e-6, gbit_per_s * 1e9 / 8 * 1448 / 1538)


ETHERNET_1G = ethernet(1.0)      # 1000BASE-T (IEEE 802.3ab)

REFERENCE_BYTES = 1 << 16     # the message size at which two measured links are compared


def save_idle_link(link: Link, how: str) -> Link:
    """Keep this machine's idle link (what ``replay`` uses when given none), unless the
    one kept already is quicker for a 64 KiB message: other work on the machine only ever
    slows a ping-pong (one measured beside a loaded test run fitted 1.26 ms of latency
    where the quiet machine gives 0.2 ms), so the quicker is the nearer to idle. Returns
    the link kept. To measure afresh, delete ``LINK_CACHE``."""
    kept = idle_link()
    if kept is not None and kept.time(REFERENCE_BYTES) <= link.time(REFERENCE_BYTES):
        return kept
    LINK_CACHE.parent.mkdir(parents=True, exist_ok=True)
    LINK_CACHE.write_text(json.dumps({"latency_s": link.latency_s,
                                      "bandwidth_Bps": link.bandwidth_Bps, "how": how}))
    return link


def idle_link() -> Link | None:
    """This machine's idle link as last measured (``parlab.course.replays.idle_link``)."""
    try:
        data = json.loads(LINK_CACHE.read_text())
        return Link(float(data["latency_s"]), float(data["bandwidth_Bps"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def collective_s(op: str, nbytes: float, n: int, link: Link) -> float:
    """A collective's ring-algorithm time on ``link`` (Thakur, Rabenseifner & Gropp, 2005).

    ``nbytes`` is what a member hands in, as the traced layer records it: the tensor
    all-reduced or broadcast, a member's part of an all-gather, the full input of a
    reduce-scatter or an all-to-all.
    """
    if n <= 1:
        return 0.0
    a, b = link.latency_s, link.bandwidth_Bps
    if op == "all_gather":
        return (n - 1) * (a + nbytes / b)
    if op in ("reduce_scatter", "all_to_all"):
        return (n - 1) * (a + nbytes / n / b)
    if op == "broadcast":      # a binomial tree
        return math.ceil(math.log2(n)) * (a + nbytes / b)
    return all_reduce_s(nbytes, n, link)    # all_reduce, barrier (0 bytes), others


class ReplayedTimeline(Timeline):
    """A Timeline replayed on dedicated devices from a run's trace: ``replayed`` is True.

    ``notes``: the link, the ranks, and how much work kept its wall time (no counters).
    """

    replayed = True

    def __init__(self, spans, labels=None, ranks=None, *, notes: dict | None = None):
        super().__init__(spans, labels, ranks)
        self.notes = dict(notes or {})

    @property
    def title(self) -> str:
        return f"replayed on {self.notes.get('devices', '')} dedicated devices ({self.notes.get('link', '')})"

    def _like(self, tl: Timeline) -> "ReplayedTimeline":
        return ReplayedTimeline(tl.spans, tl.labels, tl.ranks, notes=self.notes)

    def window(self, start: float, end: float) -> "ReplayedTimeline":
        return self._like(super().window(start, end))

    def filter(self, **kw) -> "ReplayedTimeline":
        return self._like(super().filter(**kw))


class ReplayStuck(ValueError):
    """The trace's programs cannot finish: a rank waits for a party the trace lacks."""


def replay(timeline: Timeline, link: Link | TwoTier | None = None) -> ReplayedTimeline:
    """``timeline``'s run as dedicated devices would run it, on ``link`` (default: this
    machine's idle link, ``idle_link()``); see the module doc."""
    spans = list(getattr(timeline, "recorded", timeline))
    if getattr(timeline, "replayed", False) or getattr(timeline, "predicted", False):
        raise ValueError("replay reads a measured run's timeline, not a replayed or predicted one")
    if not any(s.clock is not None or s.key is not None for s in spans):
        raise ValueError("this timeline holds no recorded program (a window, a filter or a "
                         "step of one has lost it): replay the run's whole timeline, then take "
                         "its steps, e.g. sim.replay(run.timeline).step(-2)")
    if link is None:
        link = idle_link()
        if link is None:
            raise ValueError("no link given and none measured on this machine yet: pass "
                             "link=sim.link_preset('nvlink') (or a sim.Link), or measure "
                             "this machine's idle link first: parlab.course.replays.idle_link()")
    if not isinstance(link, (Link, TwoTier)):
        raise TypeError(f"link must be a sim.Link or a sim.TwoTier, got {type(link).__name__}")
    engine = _Engine(spans, compile_programs(spans), link)
    engine.run()
    ranks = sorted(engine.programs)
    out_labels = {r: f"rank {r} · replayed" for r in ranks}
    out_labels.update({s.rank: f"rank {s.issuer} background · replayed"
                       for s in spans if s.issuer is not None})
    unmeasured = sum(p.unmeasured_s for p in engine.programs.values())
    work = sum(w for p in engine.programs.values() for kind, w in p.steps if kind == WORK)
    return ReplayedTimeline(engine.output(), out_labels, sorted(out_labels), notes={
        "link": str(link), "devices": len(ranks),
        "work without counters": unmeasured / work if work else 0.0})


class _Engine:
    def __init__(self, spans: list[Span], programs: dict, link):
        self.spans, self.programs, self.link = spans, programs, link
        self.complete = complete_matches(spans)
        self.now = {r: 0.0 for r in programs}
        self.pc = {r: 0 for r in programs}
        self.marks: dict[int, dict[int, float]] = {r: {} for r in programs}
        self.pending: dict[int, list] = {r: [] for r in programs}
        self.messages: dict[tuple, dict] = {}
        self.arrived: dict[tuple, dict[int, float]] = {}    # collective -> {rank: start}
        self.done: dict[tuple, float] = {}                  # message or collective -> end
        self.issued: dict[int, float] = {}                  # background span -> issue time
        self.previous: dict[int, int | None] = {}           # background span -> the one before
        self.last_issued: dict[int, int] = {}
        self.members: dict[tuple, list[int]] = {}           # match -> its spans
        for i, s in enumerate(spans):
            if s.key is not None and s.key[1] in self.complete:
                self.members.setdefault(s.key[1], []).append(i)

    def _link(self, ranks) -> Link:
        return self.link if isinstance(self.link, Link) else self.link.of(ranks)

    def _bytes(self, match) -> int:
        return max(self.spans[i].bytes for i in self.members[match])

    def run(self) -> None:
        while any(self.pc[r] < len(p.steps) or p.waiting_conversations()
                  for r, p in self.programs.items()):
            moved = False
            for rank in self.programs:
                moved |= self._advance(rank)
            moved |= self._settle_background()
            if not moved:   # every peer that could still send first is waiting: serve
                moved = any(self._serve_next(r, force=True) for r in self.programs)
                if not moved:
                    raise ReplayStuck(self._stuck())

    def _serve_next(self, rank: int, force: bool = False) -> bool:
        """Queue the conversation whose opening message reaches ``rank`` first, once no
        other peer can still send sooner (``force``: the soonest known now)."""
        prog = self.programs[rank]
        if self.pc[rank] < len(prog.steps) or not prog.waiting_conversations():
            return False
        arrives, sooner = {}, []
        for peer, queue in prog.queues.items():
            if not queue:
                continue
            msg = self.messages.get(queue[0][1][1].match, {})
            if "arrives" in msg:
                arrives[peer] = msg["arrives"]
            else:
                sooner.append(self._earliest_send(peer, rank))
        if not arrives:
            return False
        peer = min(arrives, key=arrives.get)
        if not force and any(t < arrives[peer] for t in sooner):
            return False
        prog.steps.extend(prog.queues[peer].pop(0))
        return True

    def _earliest_send(self, peer: int, rank: int) -> float:
        """The soonest ``peer`` can send anything more: its own clock, or when a message
        it waits for from ``rank`` arrives; never, if it waits for one not sent yet."""
        prog = self.programs[peer]
        if self.pc[peer] >= len(prog.steps):
            return math.inf if not prog.waiting_conversations() else self.now[peer]
        kind, op = prog.steps[self.pc[peer]]
        if (kind == OP and op.match is not None and op.match[0] == "p"
                and op.role in ("recv", "recv_any") and op.match[2] == rank):
            return self.messages.get(op.match, {}).get("arrives", math.inf)
        return self.now[peer]

    def _stuck(self) -> str:
        waiting = []
        for r, p in self.programs.items():
            if self.pc[r] < len(p.steps) and p.steps[self.pc[r]][0] == OP:
                op = p.steps[self.pc[r]][1]
                waiting.append(f"rank {r} in {self.spans[op.span].name!r} ({op.role})")
        return ("the replay cannot finish: " + "; ".join(waiting) + " wait for parties the "
                "trace does not hold; replay the timeline of a whole run, every rank")

    def _advance(self, rank: int) -> bool:
        prog, moved = self.programs[rank], False
        while self.pc[rank] < len(prog.steps) or self._serve_next(rank):
            kind, what = prog.steps[self.pc[rank]]
            if kind == WORK:
                self.now[rank] += what
            elif kind == MARK:
                self.marks[rank][what] = self.now[rank]
            elif kind == ISSUE:
                self._issue(rank, what)
            elif not self._operate(rank, what):
                return moved
            self.pc[rank] += 1
            moved = True
        return moved

    def _issue(self, rank: int, i: int) -> None:
        self.issued[i] = self.now[rank]
        self.previous[i] = self.last_issued.get(rank)
        self.last_issued[rank] = i
        self.pending[rank].append(self.spans[i].key[1])

    def _operate(self, rank: int, op) -> bool:
        """Carry out an operation if what it waits for is known; False if not yet."""
        first = op.start is None
        if first:
            op.start = self.now[rank]
        if op.role == "wait":
            due = [self.done.get(m) for m in self.pending[rank]]
            if any(d is None for d in due):
                return False
            self.pending[rank].clear()
            end = max([op.start + op.own_s, *due])
        elif op.match[0] == "p":
            msg = self.messages.setdefault(op.match, {})
            side = "recv" if op.role in ("recv", "recv_any") else "send"
            if first:
                msg[side] = op.start
            if "send" in msg and "arrives" not in msg:   # the data leaves as the send starts
                _, _, src, dst, *_ = op.match
                msg["arrives"] = msg["send"] + self._link((src, dst)).time(self._bytes(op.match))
            if op.match not in self.done and "arrives" in msg and "recv" in msg:
                self.done[op.match] = max(msg["arrives"], msg["recv"])
            if op.role == "isend":      # posted: the transfer goes on without the rank
                self.pending[rank].append(op.match)
                end = op.start + op.own_s
            elif op.role == "send":     # blocking: until its data has arrived
                end = msg["arrives"]
            elif op.match in self.done:
                end = self.done[op.match]
            else:
                return False
        else:
            if first:
                self.arrived.setdefault(op.match, {})[rank] = op.start
            end = self._collective_end(op.match, op.role)
            if end is None:
                return False
        op.end = self.now[rank] = end
        return True

    def _collective_end(self, match, role) -> float | None:
        if match not in self.done:
            arrived = self.arrived.get(match, {})
            ranks = match[1]
            if len(arrived) < len(ranks):
                return None
            self.done[match] = max(arrived.values()) + collective_s(
                role, self._bytes(match), len(ranks), self._link(ranks))
        return self.done[match]

    def _settle_background(self) -> bool:
        """Background collectives whose start is now known join their collective: issued,
        and the same rank's previous one done (a process group runs them in order)."""
        moved = False
        for i, t in self.issued.items():
            s = self.spans[i]
            match = s.key[1]
            if s.issuer in self.arrived.get(match, {}):
                continue
            before = self.previous[i]
            if before is not None:
                prev_end = self.done.get(self.spans[before].key[1])
                if prev_end is None:
                    continue
                t = max(t, prev_end)
            self.arrived.setdefault(match, {})[s.issuer] = t
            self._collective_end(match, s.key[0])
            moved = True
        return moved

    def output(self) -> list[Span]:
        out = []
        for rank, prog in self.programs.items():
            edge_time = {}
            for edge, (i, is_end) in enumerate(prog.edges):
                if edge in self.marks[rank]:
                    t = self.marks[rank][edge]
                else:
                    op, share = prog.inner[edge]
                    t = op.start + share * (op.end - op.start)
                edge_time[(i, is_end)] = t
            for i in dict.fromkeys(i for i, _ in prog.edges):
                s = self.spans[i]
                start, end = edge_time[(i, False)], edge_time[(i, True)]
                out.append(Span(rank, s.kind, s.name, start, max(end, start), s.bytes,
                                s.peer, s.axis, s.key))
        for i, issued in self.issued.items():
            # drawn from when it could start (handed over, and its rank's previous one
            # done), so that a lane's buckets follow each other instead of overlapping
            s = self.spans[i]
            t = self.arrived.get(s.key[1], {}).get(s.issuer, issued)
            end = self.done.get(s.key[1], t)
            out.append(Span(s.rank, s.kind, s.name, t, max(end, t), s.bytes, s.peer, s.axis,
                            s.key))
        return out
