"""A timeline: every rank's measured spans on one clock, with waiting split from transfer.

A blocking receive or collective starts when the rank arrives, not when the data can
move: until its peer arrives, the rank is waiting. Each traced operation carries a match
key, so a timeline finds the same operation on every rank and splits each span into the
part spent waiting for the last peer to arrive and the part spent transferring (see
``split_waits``). All ranks' spans are on one clock, which makes this a subtraction.
Before that, the time a rank waited for a CPU core, measured inside each span, is moved
into spans of its own (``core_waits.carve``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from . import core_waits
from .spans import COMM, COMPUTE, IDLE, LANE_KINDS, WAIT, Span


# ----------------------------------------------------------------------------- waiting
def split_waits(spans: Iterable[Span]) -> list[Span]:
    """Split every matched communication span into waiting, then transfer.

    The traced layer gives each operation a key ``(role, match)``: the same ``match`` on
    every rank that takes part (the k-th collective on a group; the k-th message from one
    rank to another). On one clock:

    * a collective cannot finish before its last member arrives: rank i waits from its
      own start until the latest start of the group, and transfers after that;
    * a receive waits until its matching send starts; a blocking send waits until its
      receive is posted; a non-blocking send only posts, and is left whole.

    Spans whose peers are not all in ``spans`` (a filtered timeline, a rank that did not
    record) stay whole. The parts carry no key, so splitting twice changes nothing.
    """
    spans = list(spans)
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(spans):
        if s.key is not None and s.kind == COMM:
            groups.setdefault(s.key[1], []).append(i)
    arrival: dict[int, float] = {}          # span index -> when its waiting ended
    for match, members in groups.items():
        if match[0] == "c":                 # ("c", ranks, seq)
            if len(members) != len(match[1]):
                continue
            last = max(spans[i].start for i in members)
            arrival.update((i, last) for i in members)
        elif len(members) == 2:             # ("p", ranks, src, dst, tag, seq)
            a, b = (spans[i] for i in members)
            for me, other, i in ((a, b, members[0]), (b, a, members[1])):
                if me.key[0] in ("recv", "recv_any", "send"):
                    arrival[i] = other.start
    out = []
    for i, s in enumerate(spans):
        if i not in arrival:
            out.append(s)
            continue
        cut = min(max(arrival[i], s.start), s.end)
        if cut > s.start:
            out.append(Span(s.rank, WAIT, s.name, s.start, cut, 0, s.peer, s.axis))
        out.append(Span(s.rank, COMM, s.name, cut, s.end, s.bytes, s.peer, s.axis))
    return out


# ----------------------------------------------------------------------------- timeline
@dataclass(frozen=True)
class Segment:
    """A piece of one lane with a single kind; idle segments fill the gaps."""

    rank: int
    kind: str
    name: str
    start: float
    end: float


class Timeline:
    """Spans of every rank on one clock, with the summaries a lab needs.

    Times are absolute seconds on rank 0's clock; ``start`` is the earliest span, and
    plots and exports show times relative to it. ``labels`` names each rank's device.
    """

    def __init__(self, spans: Iterable[Span], labels: dict[int, str] | None = None,
                 ranks: Sequence[int] | None = None):
        # as recorded (keys, counters): what sim.replay reads; a window or filter has none
        self.recorded: list[Span] = list(spans)
        self.spans: list[Span] = sorted(split_waits(core_waits.carve(self.recorded)),
                                        key=lambda s: (s.rank, s.start, -s.end))
        for s in self.spans:
            if s.end < s.start:
                raise ValueError(f"span {s.name!r} on rank {s.rank} ends before it starts")
        known = {s.rank for s in self.spans} | set(ranks or ()) | set(labels or ())
        self.ranks: list[int] = sorted(known)
        self.labels = {r: (labels or {}).get(r, f"rank {r}") for r in self.ranks}

    @classmethod
    def merge(cls, timelines: Iterable["Timeline"]) -> "Timeline":
        spans, labels, ranks = [], {}, []
        for tl in timelines:
            spans.extend(tl.recorded)
            labels.update(tl.labels)
            ranks.extend(tl.ranks)
        return cls(spans, labels, ranks)

    @classmethod
    def from_chrome_trace(cls, path: str | os.PathLike) -> "Timeline":
        """The timeline a trace of ``to_chrome_trace`` holds, e.g. one that ``parlab run
        --trace`` wrote under torchrun, where the timeline stays in rank 0's process.

        Its spans as drawn (waits split, core waits carved out), times in seconds from
        the trace's start, the ranks' labels kept.
        """
        with open(path) as fh:
            events = json.load(fh)["traceEvents"]
        labels = {e["pid"]: e["args"]["name"] for e in events
                  if e.get("ph") == "M" and e.get("name") == "process_name"}
        spans = [Span(e["pid"], e["args"]["kind"], e["name"], e["ts"] / 1e6,
                      (e["ts"] + e["dur"]) / 1e6, e["args"].get("bytes", 0),
                      e["args"].get("peer"), e["args"].get("axis"))
                 for e in events if e.get("ph") == "X"]
        return cls(spans, labels, sorted(labels))

    # -- basic views
    def __len__(self) -> int:
        return len(self.spans)

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans)

    def __repr__(self) -> str:
        return (f"Timeline({len(self.spans)} spans on {len(self.ranks)} ranks, "
                f"{self.duration * 1e3:.1f} ms)")

    @property
    def start(self) -> float:
        return min((s.start for s in self.spans), default=0.0)

    @property
    def end(self) -> float:
        return max((s.end for s in self.spans), default=0.0)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def filter(self, *, ranks=None, kinds=None, names=None) -> "Timeline":
        keep = [s for s in self.spans
                if (ranks is None or s.rank in ranks)
                and (kinds is None or s.kind in kinds)
                and (names is None or s.name in names)]
        return Timeline(keep, self.labels, self.ranks if ranks is None else
                        [r for r in self.ranks if r in ranks])

    def window(self, start: float, end: float) -> "Timeline":
        """Spans clipped to [start, end] (absolute times), e.g. to drop warm-up steps."""
        clipped = [Span(s.rank, s.kind, s.name, max(s.start, start), min(s.end, end),
                        s.bytes, s.peer, s.axis, s.key)
                   for s in self.spans if s.end > start and s.start < end]
        return Timeline(clipped, self.labels, self.ranks)

    # -- lanes: flat, non-overlapping segments per rank
    def segments(self, rank: int) -> list[Segment]:
        """The lane of one rank as non-overlapping segments, idle gaps included.

        Where spans nest (a ``step`` span around ``forward``), the innermost one (the
        latest started) owns the time, so a nested all-reduce counts as communication.
        """
        lane = [s for s in self.spans if s.rank == rank]
        t0, t1 = self.start, self.end
        cuts = sorted({t0, t1, *(s.start for s in lane), *(s.end for s in lane)})
        out: list[Segment] = []
        for a, b in zip(cuts, cuts[1:]):
            if b <= a:
                continue
            active = [s for s in lane if s.start <= a and s.end >= b]
            if active:
                top = max(active, key=lambda s: (s.start, -s.end))
                kind, name = top.kind, top.name
            else:
                kind, name = IDLE, ""
            if out and out[-1].kind == kind and out[-1].name == name and out[-1].end == a:
                out[-1] = Segment(rank, kind, name, out[-1].start, b)
            else:
                out.append(Segment(rank, kind, name, a, b))
        return out

    def seconds_by_kind(self, rank: int) -> dict[str, float]:
        totals = {k: 0.0 for k in LANE_KINDS}
        for seg in self.segments(rank):
            totals[seg.kind] += seg.end - seg.start
        return totals

    def summary(self) -> "Summary":
        """Seconds and share of each kind (compute, transfer, wait, core wait, idle) per rank."""
        rows = []
        for r in self.ranks:
            secs = self.seconds_by_kind(r)
            total = sum(secs.values()) or 1.0
            rows.append({"rank": r, "device": self.labels[r],
                         **{f"{k}_s": v for k, v in secs.items()},
                         **{f"{k}_share": v / total for k, v in secs.items()},
                         "comm_bytes": self.comm_bytes(r)})
        return Summary(rows, self.duration)

    def concurrency(self, kind: str = COMPUTE) -> dict[int, float]:
        """Share of the timeline during which exactly k ranks were doing ``kind``.

        A manual split should show nearly all its compute time at k = 1: one device busy
        at a time. Perfect data parallelism on n devices shows k = n.
        """
        edges = []
        for r in self.ranks:
            for seg in self.segments(r):
                if seg.kind == kind:
                    edges += [(seg.start, 1), (seg.end, -1)]
        edges.sort()
        shares: dict[int, float] = {}
        active, last = 0, self.start
        for t, delta in edges:
            shares[active] = shares.get(active, 0.0) + (t - last)
            active, last = active + delta, t
        shares[0] = shares.get(0, 0.0) + (self.end - last)
        total = self.duration or 1.0
        return {k: v / total for k, v in sorted(shares.items()) if v > 0}

    def seconds_by_name(self, rank: int | None = None) -> dict[str, float]:
        """Total measured seconds per span name (e.g. forward, backward), in first-seen order."""
        out: dict[str, float] = {}
        for s in self.spans:
            if rank is None or s.rank == rank:
                out[s.name] = out.get(s.name, 0.0) + s.duration
        return out

    def comm_bytes(self, rank: int | None = None, axis: str | None = None) -> int:
        """Bytes handed to communication, on one rank (or all) and one mesh axis (or all)."""
        return sum(s.bytes for s in self.spans
                   if s.kind == COMM and (rank is None or s.rank == rank)
                   and (axis is None or s.axis == axis))

    def bytes_by_axis(self, rank: int | None = None) -> dict[str, int]:
        """Communication bytes per mesh axis ("world" for ungrouped traffic)."""
        out: dict[str, int] = {}
        for s in self.spans:
            if s.kind == COMM and (rank is None or s.rank == rank):
                key = s.axis or "world"
                out[key] = out.get(key, 0) + s.bytes
        return out

    def step_windows(self, marker: str = "forward", rank: int | None = None
                     ) -> list[tuple[float, float]]:
        """(start, end) of every training step, cut at each ``marker`` span's start.

        A step runs from one ``marker`` (on ``rank``, default the first rank) to the
        next; the last step ends with the timeline.
        """
        rank = self.ranks[0] if rank is None else rank
        starts = sorted(s.start for s in self.spans if s.rank == rank and s.name == marker)
        if not starts:
            raise ValueError(f"no span named {marker!r} on rank {rank}: name the span that "
                             "opens each step (e.g. marker=\"F0\" for a pipeline)")
        return list(zip(starts, [*starts[1:], self.end]))

    def step(self, k: int = -1, marker: str = "forward", rank: int | None = None,
             count: int = 1) -> "Timeline":
        """The timeline of step ``k`` (negative counts from the end; ``count`` steps).

        ``run.timeline.step(-2)`` is the last complete step before the final one, a
        warm step: the first step of a run pays for start-up.
        """
        windows = self.step_windows(marker, rank)
        n = len(windows)
        first = k + n if k < 0 else k
        if not 0 <= first < n or first + count > n:
            raise IndexError(f"step {k} (count {count}) is outside the {n} steps found "
                             f"(each opened by a {marker!r} span)")
        return self.window(windows[first][0], windows[first + count - 1][1])

    # -- export
    def to_chrome_trace(self, path: str | os.PathLike) -> str:
        """Write a Chrome/Perfetto JSON trace: one process lane per device.

        Open it at https://ui.perfetto.dev or chrome://tracing. Times are microseconds
        from the start of the timeline.
        """
        t0 = self.start
        events: list[dict] = []
        for r in self.ranks:
            events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                           "args": {"name": self.labels[r]}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
                           "args": {"sort_index": r}})
        for s in self.spans:
            args = {"kind": s.kind}
            if s.bytes:
                args["bytes"] = s.bytes
            if s.peer is not None:
                args["peer"] = s.peer
            if s.axis is not None:
                args["axis"] = s.axis
            events.append({"ph": "X", "name": s.name, "cat": s.kind, "pid": s.rank,
                           "tid": 0, "ts": (s.start - t0) * 1e6,
                           "dur": max(s.duration, 0.0) * 1e6, "args": args})
        path = os.fspath(path)
        with open(path, "w") as fh:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh)
        return path


class Summary:
    """Per-rank shares of a timeline; prints as a table, renders as HTML in a notebook."""

    COLUMNS = ("compute", "comm", "wait", "core_wait", "idle")
    # "comm" spans hold only the transfer once waits are split
    HEADINGS = {"comm": "transfer", "core_wait": "core wait"}

    def __init__(self, rows: list[dict], duration: float):
        self.rows = rows
        self.duration = duration

    def __getitem__(self, rank: int) -> dict:
        for row in self.rows:
            if row["rank"] == rank:
                return row
        raise KeyError(rank)

    def mean(self, kind: str) -> float:
        """Mean share of one kind over all ranks (e.g. ``summary.mean("compute")``)."""
        return sum(r[f"{kind}_share"] for r in self.rows) / max(len(self.rows), 1)

    def __str__(self) -> str:
        head = (f"{'device':<28}" + "".join(f"{self.HEADINGS.get(c, c):>10}" for c in self.COLUMNS)
                + f"{'bytes':>12}")
        lines = [f"timeline of {self.duration * 1e3:.1f} ms", head]
        for r in self.rows:
            lines.append(f"{r['device'][:27]:<28}"
                         + "".join(f"{r[c + '_share']:>10.1%}" for c in self.COLUMNS)
                         + f"{_human_bytes(r['comm_bytes']):>12}")
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        cells = "".join(f"<th>{self.HEADINGS.get(c, c)}</th>"
                        for c in ("device", *self.COLUMNS, "comm bytes"))
        body = "".join(
            "<tr><td>{}</td>{}<td>{}</td></tr>".format(
                r["device"], "".join(f"<td>{r[c + '_share']:.1%}</td>" for c in self.COLUMNS),
                _human_bytes(r["comm_bytes"]))
            for r in self.rows)
        return (f"<p>timeline of {self.duration * 1e3:.1f} ms</p>"
                f"<table><tr>{cells}</tr>{body}</table>")


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
