"""The replay (parlab.sim.replay) on hand-built traces, against timelines computed by hand.

Link in every test: alpha 1 ms, beta 1 MB/s, so a 1000-byte message costs 2 ms. Times are
seconds; a span's clock is (ran, waited) of its thread at its start, then at its end.
"""
import random

import pytest

from parlab import sim
from parlab.trace import COMM, COMPUTE, WAIT, Span, Timeline

LINK = sim.Link(1e-3, 1e6)
MS = 1e-3


def work(rank, name, start, end, waited_before=0.0, waited=0.0):
    """A compute span that waited ``waited`` seconds for a core (its counter moved so)."""
    return Span(rank, COMPUTE, name, start, end, clock=(0.0, waited_before, 0.0,
                                                         waited_before + waited))


def op(rank, kind, name, start, end, key, nbytes=1000, waited_before=0.0, ran=0.0):
    """An operation whose thread ran ``ran`` seconds in it (posting), the rest blocked."""
    return Span(rank, kind, name, start, end, nbytes, None, None, key,
                clock=(0.0, waited_before, ran, waited_before))


def msg(role, src, dst, seq=0):
    return (role, ("p", (0, 1), src, dst, 0, seq))


def coll(ranks, seq=0, op_name="all_reduce"):
    return (op_name, ("c", tuple(ranks), seq))


def spans_of(tl, rank, kind=None):
    return [(s.name, round(s.start / MS, 6), round(s.end / MS, 6)) for s in tl.spans
            if s.rank == rank and (kind is None or s.kind == kind)]


def test_a_send_and_a_receive_lose_the_core_wait_and_pay_the_link():
    spans = [work(0, "forward", 0.0, 10 * MS, waited=4 * MS),          # 6 ms of work
             op(0, COMM, "send", 10 * MS, 30 * MS, msg("send", 0, 1), waited_before=4 * MS),
             op(1, COMM, "recv", 0.0, 31 * MS, msg("recv", 0, 1)),
             work(1, "backward", 31 * MS, 40 * MS, waited=4 * MS)]      # 5 ms of work
    tl = sim.replay(Timeline(spans), LINK)
    assert isinstance(tl, sim.ReplayedTimeline) and tl.replayed
    # rank 1 waits for the send to start (6 ms), then the transfer (2 ms), then computes
    assert spans_of(tl, 0) == [("forward", 0.0, 6.0), ("send", 6.0, 6.0), ("send", 6.0, 8.0)] \
        or spans_of(tl, 0) == [("forward", 0.0, 6.0), ("send", 6.0, 8.0)]
    assert spans_of(tl, 1, WAIT) == [("recv", 0.0, 6.0)]
    assert spans_of(tl, 1, COMM) == [("recv", 6.0, 8.0)]
    assert spans_of(tl, 1, COMPUTE) == [("backward", 8.0, 13.0)]
    assert tl.labels[1] == "rank 1 · replayed"


def test_a_collective_ends_a_ring_time_after_its_last_member_arrives():
    spans = [work(0, "forward", 0.0, 3 * MS), op(0, COMM, "all_reduce", 3 * MS, 20 * MS, coll((0, 1))),
             work(1, "forward", 0.0, 9 * MS, waited=2 * MS),             # 7 ms: the straggler
             op(1, COMM, "all_reduce", 9 * MS, 21 * MS, coll((0, 1)), waited_before=2 * MS)]
    tl = sim.replay(Timeline(spans), LINK)
    ring = sim.all_reduce_s(1000, 2, LINK)                             # 2 alpha + S / beta = 3 ms
    assert ring == pytest.approx(3 * MS)
    assert spans_of(tl, 0, WAIT) == [("all_reduce", 3.0, 7.0)]       # waits for the straggler
    for rank in (0, 1):
        assert spans_of(tl, rank, COMM) == [("all_reduce", 7.0, 10.0)]


def test_an_isend_overlaps_the_senders_work_and_the_wait_ends_with_the_transfer():
    spans = [op(0, COMM, "isend", 0.0, 0.5 * MS, msg("isend", 0, 1), ran=0.5 * MS),
             work(0, "forward", 0.5 * MS, 10.5 * MS),
             Span(0, WAIT, "wait sends", 10.5 * MS, 11 * MS, clock=(0, 0, 0, 0)),
             work(1, "forward", 0.0, 3 * MS),
             op(1, COMM, "recv", 3 * MS, 12 * MS, msg("recv", 0, 1))]
    tl = sim.replay(Timeline(spans), LINK)
    # the data leaves as the isend starts and arrives at 2 ms: the receive, posted at 3 ms,
    # finds it there
    assert spans_of(tl, 1, COMM) == [("recv", 3.0, 3.0)]
    assert spans_of(tl, 0, COMPUTE) == [("forward", 0.5, 10.5)]
    # the message was delivered at 3 ms, long before rank 0 waits for it: nothing to wait
    assert spans_of(tl, 0, WAIT) == [("wait sends", 10.5, 10.5)] or spans_of(tl, 0, WAIT) == []


def test_a_wait_ends_when_the_message_it_waits_for_is_received():
    spans = [op(0, COMM, "isend", 0.0, 0.5 * MS, msg("isend", 0, 1), ran=0.5 * MS),
             work(0, "forward", 0.5 * MS, 1.5 * MS),
             Span(0, WAIT, "wait sends", 1.5 * MS, 30 * MS, clock=(0, 0, 0, 0)),
             work(1, "forward", 0.0, 8 * MS),
             op(1, COMM, "recv", 8 * MS, 31 * MS, msg("recv", 0, 1))]
    tl = sim.replay(Timeline(spans), LINK)
    assert spans_of(tl, 0, WAIT) == [("wait sends", 1.5, 8.0)]       # the receive, at 8 ms


def test_background_collectives_run_beside_the_work_and_in_issue_order():
    """DDP: two buckets issued during backward on lanes 2 and 3, then a wait for them."""
    spans = []
    for rank, slow in ((0, 0.0), (1, 2 * MS)):
        spans += [work(rank, "backward", 0.0, 10 * MS + slow),
                  Span(rank, WAIT, "wait for buckets", 10 * MS + slow, 40 * MS, clock=(0, 0, 0, 0))]
        for seq, issued in ((0, 4 * MS), (1, 8 * MS)):
            spans.append(Span(2 + rank, COMM, f"bucket {seq}", issued + slow / 2, 39 * MS, 1000,
                              key=coll((0, 1), seq), issuer=rank))
    tl = sim.replay(Timeline(spans), LINK)
    # bucket 0: issued at 4 ms on rank 0 and at 5 ms on rank 1: 5 .. 8; bucket 1: issued at
    # 8 and 9, after bucket 0 ended (8): 9 .. 12. Rank 1's backward ends at 12: no wait.
    assert spans_of(tl, 3, COMM) == [("bucket 0", 5.0, 8.0), ("bucket 1", 9.0, 12.0)]
    assert spans_of(tl, 0, WAIT) == [("wait for buckets", 10.0, 12.0)]
    assert spans_of(tl, 1, WAIT) in ([("wait for buckets", 12.0, 12.0)], [])
    assert "replayed" in tl.labels[2]


def test_a_span_inside_an_operation_keeps_its_share_of_it_and_work_between_spans_counts():
    spans = [work(0, "data", 0.0, 2 * MS),
             work(0, "forward", 4 * MS, 6 * MS),                    # 2 ms untraced before it
             op(0, COMM, "send", 6 * MS, 8 * MS, msg("send", 0, 1)),
             op(1, COMM, "recv", 0.0, 8 * MS, msg("recv", 0, 1))]
    tl = sim.replay(Timeline(spans), LINK)
    assert spans_of(tl, 0, COMPUTE) == [("data", 0.0, 2.0), ("forward", 4.0, 6.0)]
    assert spans_of(tl, 1, COMM) == [("recv", 6.0, 8.0)]


def _random_trace(seed: int):
    """Three ranks, random work, messages around a ring and all-reduces, on a busy clock."""
    rnd = random.Random(seed)
    spans, clock = [], {r: 0.0 for r in range(3)}
    waited = {r: 0.0 for r in range(3)}
    for step in range(6):
        for r in range(3):
            t, w = clock[r], rnd.uniform(0, 3) * MS
            spans.append(work(r, "forward", t, t + rnd.uniform(1, 5) * MS + w, waited[r], w))
            waited[r] += w
            clock[r] = spans[-1].end
        for r in range(3):
            right, left = (r + 1) % 3, (r - 1) % 3
            key_out = ("isend", ("p", (0, 1, 2), r, right, 0, step))
            key_in = ("recv", ("p", (0, 1, 2), left, r, 0, step))
            t = clock[r]
            spans.append(Span(r, COMM, "isend", t, t + 0.1 * MS, 500, right, None, key_out,
                              clock=(0, waited[r], 0, waited[r])))
            spans.append(Span(r, COMM, "recv", t + 0.1 * MS, t + 9 * MS, 500, left, None, key_in,
                              clock=(0, waited[r], 0, waited[r])))
            spans.append(Span(r, WAIT, "wait sends", t + 9 * MS, t + 10 * MS,
                              clock=(0, waited[r], 0, waited[r])))
            clock[r] = t + 10 * MS
        end = max(clock.values()) + 1 * MS
        for r in range(3):
            spans.append(Span(r, COMM, "all_reduce", clock[r], end, 2000, None, None,
                              coll((0, 1, 2), step), clock=(0, waited[r], 0, waited[r])))
            clock[r] = end
    rnd.shuffle(spans)
    return spans


@pytest.mark.parametrize("seed", range(8))
def test_a_replay_keeps_each_ranks_order_and_never_receives_before_the_send(seed):
    spans = _random_trace(seed)
    tl = sim.replay(Timeline(spans), LINK)
    for r in range(3):
        measured = sorted((s for s in spans if s.rank == r), key=lambda s: s.start)
        replayed = sorted((s for s in tl.recorded if s.rank == r), key=lambda s: (s.start, s.end))
        assert [s.name for s in replayed] == [s.name for s in measured]
        assert all(a.end <= b.start + 1e-12 for a, b in zip(replayed, replayed[1:]))
    sent = {s.key[1]: s for s in tl.recorded if s.key and s.key[0] == "isend"}
    for s in tl.recorded:
        if s.key and s.key[0] == "recv":
            assert s.end >= sent[s.key[1]].start + LINK.time(500) - 1e-12
    # dedicated devices: no rank waits for a core, and the replay is no longer than the run
    assert tl.duration <= Timeline(spans).duration


def test_what_a_replay_refuses_is_named():
    spans = [work(0, "forward", 0.0, 1 * MS), op(0, COMM, "send", 1 * MS, 2 * MS, msg("send", 0, 1)),
             op(1, COMM, "recv", 0.0, 2 * MS, msg("recv", 0, 1))]
    tl = Timeline(spans)
    with pytest.raises(ValueError, match="replay the run's whole timeline, then take its steps"):
        sim.replay(tl.window(0.0, 1.5 * MS), LINK)
    with pytest.raises(ValueError, match="not a replayed or predicted one"):
        sim.replay(sim.replay(tl, LINK), LINK)
    with pytest.raises(TypeError, match="sim.Link or a sim.TwoTier"):
        sim.replay(tl, 1e9)
    with pytest.raises(ValueError, match="node_size"):
        sim.TwoTier(LINK, LINK, 0)
    with pytest.raises(ValueError, match="nvlink"):
        sim.link_preset("carrier pigeon")


def test_a_two_tier_link_prices_messages_between_nodes_at_the_slow_link():
    slow = sim.Link(10e-3, 1e5)
    spans = [op(0, COMM, "send", 0.0, 1 * MS, ("send", ("p", (0, 1, 2, 3), 0, 1, 0, 0))),
             op(1, COMM, "recv", 0.0, 1 * MS, ("recv", ("p", (0, 1, 2, 3), 0, 1, 0, 0))),
             op(2, COMM, "send", 0.0, 1 * MS, ("send", ("p", (0, 1, 2, 3), 2, 1, 0, 0))),
             op(1, COMM, "recv", 1 * MS, 2 * MS, ("recv", ("p", (0, 1, 2, 3), 2, 1, 0, 0)))]
    tl = sim.replay(Timeline(spans), sim.TwoTier(LINK, slow, node_size=2))
    # 0 -> 1 inside a node: 2 ms; 2 -> 1 between nodes, sent at 0: 10 ms + 1000 B / 100 kB/s
    assert spans_of(tl, 1, COMM) == [("recv", 0.0, 2.0), ("recv", 2.0, 20.0)]
    # the same ranks in nodes (0, 2) and (1, 3): now 0 -> 1 crosses, 2 -> 1 crosses too
    across = sim.replay(Timeline(spans), sim.TwoTier(LINK, slow, nodes=((0, 2), (1, 3))))
    assert spans_of(across, 1, COMM) == [("recv", 0.0, 20.0), ("recv", 20.0, 20.0)]
    with pytest.raises(ValueError, match="each rank once"):
        sim.TwoTier(LINK, slow, nodes=((0, 1), (1, 2)))
    with pytest.raises(ValueError, match="rank 2 is in none of the nodes"):
        sim.replay(Timeline(spans), sim.TwoTier(LINK, slow, nodes=((0, 1), (3,))))


def test_a_replay_is_drawn_outlined_and_titled_so_never_as_a_measurement():
    from parlab import plot
    spans = [work(0, "forward", 0.0, 1 * MS), op(0, COMM, "send", 1 * MS, 2 * MS, msg("send", 0, 1)),
             op(1, COMM, "recv", 0.0, 2 * MS, msg("recv", 0, 1)),
             work(1, "backward", 3 * MS, 4 * MS)]     # 1 ms untraced before it: priced as work
    fig = plot.timeline(sim.replay(Timeline(spans), LINK))
    ax = fig.axes[0]
    assert "replayed" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "replayed (dedicated devices)" in legend
    assert "untraced work or idle" in legend and "idle" not in legend
    from matplotlib.colors import to_rgba
    from parlab.plot.style import COLORS

    def compute_edges(axes):
        return {p.get_edgecolor() for p in axes.patches
                if p.get_width() > 0 and p.get_facecolor() == to_rgba(COLORS[COMPUTE])}
    assert compute_edges(ax) == {to_rgba("black")}
    measured = plot.timeline(Timeline(spans)).axes[0]
    assert "measured" in measured.get_title() and compute_edges(measured) == {to_rgba("white")}


def test_the_idle_link_is_kept_and_read_back(tmp_path, monkeypatch):
    import importlib
    replay_module = importlib.import_module("parlab.sim.replay")   # the module, not the function
    monkeypatch.setattr(replay_module, "LINK_CACHE", tmp_path / "idle-link.json")
    assert replay_module.idle_link() is None
    spans = [work(0, "forward", 0.0, 1 * MS)]
    with pytest.raises(ValueError, match="no link given and none measured"):
        sim.replay(Timeline(spans))
    assert replay_module.save_idle_link(LINK, "a test") == LINK
    assert replay_module.idle_link() == LINK
    assert sim.replay(Timeline(spans)).notes["link"] == str(LINK)
    # a slower measurement (a loaded machine) keeps the quicker link; a quicker one replaces it
    slower, quicker = sim.Link(2 * LINK.latency_s, LINK.bandwidth_Bps), sim.Link(1e-4, 1e7)
    assert replay_module.save_idle_link(slower, "beside a busy loop") == LINK
    assert replay_module.idle_link() == LINK
    assert replay_module.save_idle_link(quicker, "quiet") == quicker
    assert replay_module.idle_link() == quicker


def test_a_lesson_that_read_a_replay_says_so():
    from parlab.course import lessons
    verdict = lessons.Verdict("03.x", True, "1.3x", source="replayed on 2 dedicated devices")
    assert str(verdict) == "lesson 03.x: shown (replayed on 2 dedicated devices) — 1.3x"
    assert str(lessons.Verdict("03.x", True, "1.3x")) == "lesson 03.x: shown — 1.3x"


def test_a_launched_run_replays_with_every_rank_in_order(no_leftover_ranks):
    """Two ranks of data parallel by hand: the replay holds every span the run recorded,
    each rank's in the order it ran them, and no all-reduce ends before its last member
    arrived."""
    import parlab
    from parlab.torch.data_parallel import train_data_parallel
    run = parlab.launch(train_data_parallel, 2, kwargs={"mode": "ring", "steps": 3}, timeout=120)
    tl = run.replayed(LINK)
    for r in (0, 1):
        measured = [s.name for s in sorted(run.timeline.recorded, key=lambda s: s.start)
                    if s.rank == r and s.issuer is None]
        replayed = [s.name for s in sorted(tl.recorded, key=lambda s: (s.start, s.end))
                    if s.rank == r]
        assert sorted(measured) == sorted(replayed)
    by_match = {}
    for s in tl.recorded:
        if s.key is not None:
            by_match.setdefault(s.key[1], []).append(s)
    assert by_match
    for match, members in by_match.items():
        if match[0] == "p":
            send = next(s for s in members if s.key[0] in ("send", "isend"))
            recv = next(s for s in members if s.key[0] == "recv")
            assert recv.end >= send.start + LINK.time(recv.bytes) - 1e-9
    assert all(s.kind != "core_wait" for s in tl.spans)


def test_a_run_on_devices_in_nodes_replays_its_messages_between_nodes_on_the_slow_link(
        no_leftover_ranks, monkeypatch):
    """devices(4, nodes=2): the flat ring's all-reduce spans both nodes, so its replay pays
    the slow link; the same run on one machine does not."""
    import parlab
    from parlab.course import replays
    from parlab.torch.data_parallel import train_data_parallel
    import importlib
    monkeypatch.setattr(replays, "idle_link", lambda: LINK)
    monkeypatch.setattr(importlib.import_module("parlab.sim.replay"), "idle_link", lambda: LINK)
    slow = sim.Link(20e-3, 1e5)
    devs = parlab.devices(4, nodes=2, between=slow)
    run = parlab.launch(train_data_parallel, 4, kwargs={"steps": 2}, devices=devs, timeout=120)
    assert run.timeline.labels[3].endswith("node 1")
    reduces = [s for s in replays.replayed(run).spans if s.name.startswith("all_reduce") and s.kind == COMM]
    flat = [s for s in run.replayed(LINK).spans if s.name.startswith("all_reduce") and s.kind == COMM]
    assert reduces and len(reduces) == len(flat)
    assert min(s.duration for s in reduces) >= 2 * 3 * slow.latency_s
    assert all(a.duration > b.duration for a, b in zip(reduces, flat))
    assert [s.duration for s in run.replayed().spans if s.name.startswith("all_reduce") and s.kind == COMM] == \
        [s.duration for s in reduces]


@pytest.mark.parametrize("kind", [COMPUTE, COMM])
def test_a_span_reads_the_counters_before_the_clock_at_both_edges(kind, monkeypatch):
    """A computing thread is often preempted at its next system call: the counters' read.
    Read after the end mark, that wait counted in the span's counters but not in its wall
    time, and the replay priced the span at nothing (and the gap after it as work)."""
    from parlab import core_waits
    from parlab.recorders import HostTimer, Recorder
    if not core_waits.MEASURED:
        pytest.skip("no /proc/thread-self/schedstat here")
    events = []
    monkeypatch.setattr(core_waits, "_delay", lambda fd: 0.0)      # no wait after the clock
    monkeypatch.setattr(core_waits, "read_wait",
                        lambda: events.append("counters") or (None, 0.0, 0.0))
    monkeypatch.setattr(core_waits, "read_counters",
                        lambda relist=True: events.append("counters") or (0.0, 0.0, 0.0))
    rec = Recorder(0, HostTimer(lambda: events.append("clock") or len(events) * 1e-6))
    with rec.span("x", kind):
        pass
    assert events == ["clock", "counters", "clock"] * 2
    (s,) = rec.spans()
    assert (s.start, s.end) == (3e-6, 6e-6)     # each edge's time read after its counters


def test_buckets_handed_over_together_are_drawn_one_after_the_other():
    spans = []
    for rank in (0, 1):
        spans += [work(rank, "backward", 0.0, 4 * MS),
                  Span(rank, WAIT, "wait for buckets", 4 * MS, 40 * MS, clock=(0, 0, 0, 0))]
        spans += [Span(2 + rank, COMM, f"bucket {seq}", 4 * MS, 39 * MS, 1000,
                       key=coll((0, 1), seq), issuer=rank) for seq in (0, 1)]
    tl = sim.replay(Timeline(spans), LINK)
    assert spans_of(tl, 2, COMM) == [("bucket 0", 4.0, 7.0), ("bucket 1", 7.0, 10.0)]
    assert spans_of(tl, 0, WAIT) == [("wait for buckets", 4.0, 10.0)]


def test_an_edge_preempted_inside_its_clock_bracket_is_taken_again(monkeypatch):
    """Preempted at the return of the counters' read: the wait is after the value and
    before the clock, and the clock's bracket around the read spans it (5 ms, where a
    read takes microseconds); so the edge is read again, and then agrees."""
    from parlab import core_waits
    if not core_waits.MEASURED:
        pytest.skip("no /proc/thread-self/schedstat here")
    waited = iter([0.0, 0.005])                     # the wait counter at each read
    monkeypatch.setattr(core_waits, "_delay", lambda fd: next(waited))
    times = iter([1.0, 1.005, 2.0, 2.00001])        # the brackets: preempted, then not
    counters, t = core_waits.at_edge(lambda: next(times))
    assert counters[2] == 0.005 and t == 2.00001


def test_the_time_spent_reading_counters_is_not_the_ranks_work(monkeypatch):
    """Each edge's read (its clock bracket) moves from the thread's CPU time to its wait,
    where the replay does not price it; the wait a span carves stays as read."""
    import threading as th
    from parlab import core_waits
    if not core_waits.MEASURED:
        pytest.skip("no /proc/thread-self/schedstat here")
    out = []

    def edges():                                    # a fresh thread: nothing spent yet
        monkeypatch.setattr(core_waits, "read_own", lambda: (1.0, 0.5, 0.5))
        times = iter([10.0, 10.00002, 11.0, 11.00003])
        out.append(core_waits.at_edge(lambda: next(times)))
        out.append(core_waits.at_edge(lambda: next(times)))
    thread = th.Thread(target=edges)
    thread.start()
    thread.join()
    (first, t1), (second, t2) = out
    assert first == pytest.approx((1.0 - 2e-5, 0.5 + 2e-5, 0.5))
    assert second == pytest.approx((1.0 - 5e-5, 0.5 + 5e-5, 0.5))
    assert (t1, t2) == (10.00002, 11.00003)


def test_a_communication_span_ends_on_the_threads_it_started_with(monkeypatch):
    """A thread started inside a span (a new process group's) must not add the wait of
    its whole life to that span: the end reads the threads the start read."""
    from parlab import core_waits
    from parlab.recorders import HostTimer, Recorder
    if not core_waits.MEASURED:
        pytest.skip("no /proc/thread-self/schedstat here")
    rec = Recorder(0, HostTimer())
    with rec.span("x", COMM):
        listed = dict(core_waits._files.tasks)
        monkeypatch.setattr(core_waits._files, "by_thread",
                            lambda: pytest.fail("the span's end listed the threads again"))
    assert core_waits._files.tasks == listed
    assert core_waits.read_counters(relist=False) is not None


def test_an_any_source_receiver_serves_the_message_that_arrives_first():
    """Recorded on shared cores, the server heard slow rank 2 first; on dedicated devices
    fast rank 1's push arrives first (at 3 ms), so it is served first, and rank 2's
    conversation moves after it, whole (its apply and its reply with it)."""
    def m(role, src, dst, k):
        return (role, ("p", (0, 1, 2), src, dst, 0, k))
    spans = [op(0, WAIT, "wait for push", 0.0, 7 * MS, m("recv_any", 2, 0, 0)),
             work(0, "apply", 7 * MS, 7.5 * MS),
             op(0, COMM, "reply", 7.5 * MS, 9.5 * MS, m("send", 0, 2, 0)),
             op(0, WAIT, "wait for push", 9.5 * MS, 9.6 * MS, m("recv_any", 1, 0, 0)),
             work(0, "apply", 9.6 * MS, 10.1 * MS),
             op(0, COMM, "reply", 10.1 * MS, 12.1 * MS, m("send", 0, 1, 0)),
             op(0, WAIT, "wait for push", 12.1 * MS, 13.2 * MS, m("recv_any", 1, 0, 1)),
             work(0, "apply", 13.2 * MS, 13.7 * MS),
             op(0, COMM, "reply", 13.7 * MS, 15.7 * MS, m("send", 0, 1, 1)),
             work(1, "compute", 0.0, 1 * MS),
             op(1, COMM, "push", 1 * MS, 1.01 * MS, m("isend", 1, 0, 0)),   # posted: no time
             op(1, COMM, "pull", 1.01 * MS, 12.1 * MS, m("recv", 0, 1, 0)),
             work(1, "compute", 12.1 * MS, 13.1 * MS),
             op(1, COMM, "push", 13.1 * MS, 13.11 * MS, m("isend", 1, 0, 1)),
             op(1, COMM, "pull", 13.11 * MS, 15.7 * MS, m("recv", 0, 1, 1)),
             work(2, "compute", 0.0, 5 * MS),
             op(2, COMM, "push", 5 * MS, 5.01 * MS, m("isend", 2, 0, 0)),
             op(2, COMM, "pull", 5.01 * MS, 9.5 * MS, m("recv", 0, 2, 0))]
    tl = sim.replay(Timeline(spans), LINK)
    served = [(s.key[1][2], round(s.start / MS, 6), round(s.end / MS, 6)) for s in tl.spans
              if s.rank == 0 and s.name == "wait for push"]
    # rank 1's push arrives at 3; the reply reaches it at 5.5, its next push leaves at 6.5
    # and arrives at 8.5, after rank 2's (sent at 5, arriving at 7)
    assert sorted(served, key=lambda x: x[1]) == [(1, 0.0, 3.0), (2, 5.5, 7.0), (1, 9.5, 9.5)]
    assert sorted(spans_of(tl, 0, COMPUTE), key=lambda x: x[1]) == [
        ("apply", 3.0, 3.5), ("apply", 7.0, 7.5), ("apply", 9.5, 10.0)]
    assert sorted(spans_of(tl, 1, COMPUTE), key=lambda x: x[1]) == [("compute", 0.0, 1.0),
                                                                    ("compute", 5.5, 6.5)]


def test_lanes_are_named_as_what_the_timeline_is_and_parts_cut_at_barriers():
    from parlab.course import replays
    spans = [work(0, "forward", 0.0, 1 * MS), op(0, COMM, "send", 1 * MS, 2 * MS, msg("send", 0, 1)),
             op(1, COMM, "recv", 0.0, 2 * MS, msg("recv", 0, 1))]
    measured, replayed = Timeline(spans), sim.replay(Timeline(spans), LINK)
    named = replays.lanes_named(replayed, {0: "server", 1: "worker"})
    assert named.replayed and named.labels == {0: "server · replayed", 1: "worker · replayed"}
    assert named.notes == replayed.notes
    named = replays.lanes_named(measured, {0: "server", 1: "worker"})
    assert not getattr(named, "replayed", False) and named.labels == {0: "server", 1: "worker"}
    assert sim.replay(named, LINK).replayed           # still as recorded: it replays
    bars = [Span(0, COMM, "between", t, t + 0.1) for t in (0.0, 1.0, 2.0, 3.0)]
    assert replays.between_barriers(Timeline(bars), "between", 2) == [(0.1, 1.0), (2.1, 3.0)]
    with pytest.raises(ValueError, match="3 parts need 6"):
        replays.between_barriers(Timeline(bars), "between", 3)
