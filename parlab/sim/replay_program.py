"""A run's trace read back as programs: each rank's work and operations, in program order.

The replay (``replay.py``) runs these programs on dedicated devices. A rank's program is
what its main lane recorded, cut at every span edge:

* **work**: the time between two edges outside an operation, priced at its wall time
  less the run-queue delay its thread accumulated meanwhile (``Span.clock``, read at
  both edges from ``/proc/thread-self/schedstat``). What is left is the time the thread
  ran, at the speed it ran here (cache and clock-frequency effects of sharing stay in),
  plus time it slept by its own choice (an emulated slow device's ``time.sleep``).
  Edges without counters (another OS, a GPU's spans) keep their wall time;
* **operations**: the spans whose end another rank decides: a keyed send, receive or
  collective (``Span.key``: the same match on every rank taking part) and an unkeyed
  wait (for this rank's asynchronous sends and background collectives);
* **issues**: a background collective (DDP's buckets) starts on another lane at a moment
  inside the rank's work; the program holds that moment;
* **conversations**: a rank that receives from any source (lab 06's asynchronous server)
  serves its peers in the order their messages come. From each such receive to the next
  is one conversation with the peer it heard; the program queues them per peer, in order,
  and the replay picks the next by arrival (``Program.queues``).

Edges inside an operation (a span nested in it) are placed by their share of its wall
time. Keyed operations whose peers are not in the trace (a filtered timeline) are work.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..spans import COMM, WAIT

WORK, OP, ISSUE, MARK = "work", "op", "issue", "mark"


@dataclass
class Operation:
    """One operation of a rank: what it waits for is decided by the engine."""

    rank: int
    span: int                   # index of its span in the trace
    role: str                   # send, isend, recv, a collective's name, or "wait"
    match: tuple | None         # the key's match: the same on every rank taking part
    nbytes: int
    own_s: float                # its own work (posting an isend; a wait with nothing due)
    start: float | None = None  # replayed times, once known
    end: float | None = None


@dataclass
class Program:
    """A rank's steps, and where each span edge of its lane lands among them."""

    rank: int
    steps: list = field(default_factory=list)   # (WORK, s) (OP, op) (ISSUE, span) (MARK, edge)
    edges: list = field(default_factory=list)   # (span index, is_end) per edge number
    inner: dict = field(default_factory=dict)   # edge number -> (op, share of its time)
    unmeasured_s: float = 0.0   # work kept at wall time: no counters at its edges
    queues: dict = field(default_factory=dict)  # peer -> its conversations still to serve

    def waiting_conversations(self) -> bool:
        return any(self.queues.values())


def _conversations(prog: Program) -> None:
    """Cut the steps from the first any-source receive on into conversations (each opens
    with its receive's start mark), queued by the peer heard."""
    opens = [k - 1 for k, (kind, what) in enumerate(prog.steps)
             if kind == OP and what.role == "recv_any"]
    if not opens:
        return
    cuts = opens + [len(prog.steps)]
    for a, b in zip(cuts, cuts[1:]):
        conversation = prog.steps[a:b]
        prog.queues.setdefault(conversation[1][1].match[2], []).append(conversation)
    del prog.steps[opens[0]:]


def is_operation(s) -> bool:
    return (s.kind in (COMM, WAIT) and s.key is not None) or (s.kind == WAIT and s.key is None)


def complete_matches(spans) -> set:
    """Matches every party of which is in the trace: a message's two ends, a collective's
    every member."""
    parties: dict[tuple, int] = {}
    for s in spans:
        if s.key is not None and s.kind in (COMM, WAIT):
            parties[s.key[1]] = parties.get(s.key[1], 0) + 1
    return {m for m, n in parties.items()
            if (m[0] == "c" and n == len(m[1])) or (m[0] == "p" and n == 2)}


def _waited(clock, end: bool):
    if clock is None:
        return None
    return clock[3] if end else clock[1]


def compile_programs(spans) -> dict[int, Program]:
    """Every rank's program from the raw (uncarved, keyed) spans of a run."""
    complete = complete_matches(spans)
    lanes: dict[int, list[int]] = {}
    issued: dict[int, list[int]] = {}
    for i, s in enumerate(spans):
        if s.issuer is None:
            lanes.setdefault(s.rank, []).append(i)
        elif s.key is not None and s.key[1] in complete:
            issued.setdefault(s.issuer, []).append(i)
    return {rank: _compile(rank, spans, members, issued.get(rank, []), complete)
            for rank, members in sorted(lanes.items())}


def _compile(rank, spans, members, issues, complete) -> Program:
    prog = Program(rank)
    # operations, the outermost where one holds another
    ops = sorted((i for i in members if is_operation(spans[i])
                  and (spans[i].key is None or spans[i].key[1] in complete)),
                 key=lambda i: (spans[i].start, -spans[i].end))
    outer: list[int] = []
    for i in ops:
        if outer and spans[i].end <= spans[outer[-1]].end:
            continue
        outer.append(i)
    is_op = set(outer)
    op_step = 0                 # where the current operation sits among the steps
    # marks: (time, order, waited counter, what); at one time, ends before starts
    marks = []
    for i in members:
        s = spans[i]
        marks.append((s.start, 1, _waited(s.clock, False), ("edge", i, False)))
        marks.append((s.end, 0, _waited(s.clock, True), ("edge", i, True)))
    marks += [(spans[j].start, 2, None, ("issue", j)) for j in issues]
    marks.sort(key=lambda m: (m[0], m[1]))
    waited = _interpolated([m[0] for m in marks], [m[2] for m in marks])
    prev_t, prev_w = marks[0][0], waited[0]
    op: Operation | None = None
    for (t, _, _, what), w in zip(marks, waited):
        if op is None:
            wall = t - prev_t
            if w is not None and prev_w is not None:
                run = min(max(wall - (w - prev_w), 0.0), wall)
            else:
                run = wall
                prog.unmeasured_s += wall
            if run > 0:
                prog.steps.append((WORK, run))
            prev_t, prev_w = t, w
        if what[0] == "issue":
            if op is None:
                prog.steps.append((ISSUE, what[1]))
            else:   # issued inside an operation (DDP's last bucket, as backward returns
                #     into its wait): at the operation's start, before it waits
                prog.steps.insert(op_step, (ISSUE, what[1]))
                op_step += 1
            continue
        _, i, is_end = what
        edge = len(prog.edges)
        prog.edges.append((i, is_end))
        if op is None:
            prog.steps.append((MARK, edge))
            if i in is_op and not is_end:
                op = _operation(rank, i, spans[i])
                op_step = len(prog.steps)
                prog.steps.append((OP, op))
        elif i == op.span and is_end:
            prog.steps.append((MARK, edge))
            op = None
            prev_t, prev_w = t, w
        else:
            s = spans[op.span]
            share = (t - s.start) / s.duration if s.duration > 0 else 0.0
            prog.inner[edge] = (op, min(max(share, 0.0), 1.0))
    _conversations(prog)
    return prog


def _interpolated(times: list, values: list) -> list:
    """Missing values (None) filled in linearly from the nearest known ones on both sides;
    None where one side has none."""
    out = list(values)
    known = [k for k, v in enumerate(values) if v is not None]
    for a, b in zip(known, known[1:]):
        for k in range(a + 1, b):
            if out[k] is None:
                span = times[b] - times[a]
                share = (times[k] - times[a]) / span if span > 0 else 0.0
                out[k] = values[a] + share * (values[b] - values[a])
    return out


def _operation(rank: int, i: int, s) -> Operation:
    # an operation's own work is the time its thread ran in it (posting an isend): the
    # rest was waiting, which the engine decides
    own = 0.0 if s.clock is None else min(max(s.clock[2] - s.clock[0], 0.0), s.duration)
    if s.key is None:
        return Operation(rank, i, "wait", None, 0, own)
    return Operation(rank, i, s.key[0], s.key[1], s.bytes, own)
