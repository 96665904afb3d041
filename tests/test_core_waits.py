"""Waiting for a core: measured from the kernel's run-queue delay, drawn as its own kind.

Margins, from runs on the 2-core machine (600 messages of 64 bytes, every rank held on
the same two cores): with two ranks computing beside them, the receiver waited 261-470 ms
for a core against 73-78 ms of transfer (303 ms against 87 ms with two more busy loops
running beside the test); two ranks alone waited 12-21 ms. On another day the pair alone
waited 64-364 ms (eight launches) and the test failed in two of four runs (the least of
three quiet launches 0.12 s against 0.35 s contended); with four ranks computing beside
them the receiver waited 653-1049 ms against 501-567 ms with two (three launches each,
that day), so the contended half now runs four. The checks ask for a fraction of those
gaps: core wait above transfer, and the quiet pair (the least of up to three launches)
under a third of the contended one.
"""
import json
import time

import pytest
import workers

import parlab
from parlab import core_waits
from parlab.trace import COMM, COMPUTE, CORE_WAIT, WAIT, Span, Timeline

MESSAGES = 600

needs_schedstat = pytest.mark.skipif(not core_waits.MEASURED,
                                     reason="no /proc/thread-self/schedstat on this system")


def _kinds(tl, rank):
    return [(s.kind, s.name, round(s.start, 6), round(s.end, 6)) for s in tl if s.rank == rank]


def test_a_spans_core_wait_moves_to_its_end_and_nested_spans_give_only_their_own():
    spans = [Span(0, COMPUTE, "step", 0.0, 10.0, core_wait_s=3.0),
             Span(0, COMPUTE, "forward", 1.0, 4.0, core_wait_s=1.0),
             Span(0, COMM, "recv", 5.0, 6.0, 64, peer=1, core_wait_s=2.0),  # longer than itself
             Span(1, COMPUTE, "forward", 0.0, 1.0)]
    tl = Timeline(spans)
    # step waited 3 s, of which 1 s inside forward and 2 s inside recv: none is its own;
    # recv is 1 s long, so it gives up all of it
    assert set(_kinds(tl, 0)) == {(COMPUTE, "step", 0.0, 10.0),
                                  (COMPUTE, "forward", 1.0, 3.0), (CORE_WAIT, "forward (core wait)", 3.0, 4.0),
                                  (COMM, "recv", 5.0, 5.0), (CORE_WAIT, "recv (core wait)", 5.0, 6.0)}
    secs = tl.seconds_by_kind(0)
    assert secs[CORE_WAIT] == pytest.approx(1.0 + 1.0)
    assert secs[COMM] == pytest.approx(0.0)
    assert tl.comm_bytes(0) == 64                               # bytes stay with the transfer
    assert tl.summary()[0]["core_wait_s"] == pytest.approx(2.0)
    assert tl.summary()[1]["core_wait_s"] == 0.0
    assert Timeline(tl.spans).spans == tl.spans                 # carving twice changes nothing


def test_an_outer_span_keeps_what_its_inner_spans_did_not_wait():
    tl = Timeline([Span(0, COMPUTE, "step", 0.0, 10.0, core_wait_s=3.0),
                   Span(0, COMPUTE, "forward", 1.0, 4.0, core_wait_s=1.0)])
    waits = [(s.name, s.start, s.end) for s in tl if s.kind == CORE_WAIT]
    assert waits == [("forward (core wait)", 3.0, 4.0), ("step (core wait)", 8.0, 10.0)]
    assert tl.seconds_by_kind(0)[CORE_WAIT] == pytest.approx(3.0)


def test_a_core_wait_inside_a_receive_comes_after_its_wait_for_the_sender():
    route = ("p", (0, 1), 0, 1, 0, 0)
    tl = Timeline([Span(0, COMM, "send", 2.0, 2.5, 4, peer=1, key=("isend", route)),
                   Span(1, COMM, "recv", 1.0, 4.0, 4, peer=0, key=("recv", route),
                        core_wait_s=1.0)])
    assert [(s.kind, s.start, s.end) for s in tl if s.rank == 1] == [
        (WAIT, 1.0, 2.0), (COMM, 2.0, 3.0), (CORE_WAIT, 3.0, 4.0)]


@needs_schedstat
def test_the_counter_grows_while_a_thread_waits_for_a_busy_core():
    before = core_waits.read_seconds()
    time.sleep(0.01)
    assert core_waits.read_seconds() >= before
    assert core_waits.read_seconds(every_thread=True) >= core_waits.read_seconds()


def _machine_is_busy() -> str:
    """Why the quiet half cannot be quiet here, if it cannot: this process spins for 0.2 s
    and reads how long it waited for a core (other work running beside the tests). Asked
    before and after the quiet launch, so that steady load (busy loops beside the suite)
    skips the quiet half instead of failing it; CI runs the suite alone."""
    before, end = core_waits.read_seconds(), time.perf_counter() + 0.2
    while time.perf_counter() < end:
        pass
    waited = core_waits.read_seconds() - before
    return f"machine busy: a spinning thread waited {waited / 0.2:.0%} of 0.2 s" \
        if waited > 0.04 else ""


@needs_schedstat
def test_the_receiver_of_small_messages_waits_for_a_core_not_for_the_wire(no_leftover_ranks):
    busy = parlab.launch(workers.small_messages_beside_busy_ranks, 6, args=(MESSAGES, 2.0))
    rx = busy.timeline.summary()[1]
    assert rx["core_wait_s"] > 0.1e-3 * MESSAGES, rx          # measured 0.4-1.7 ms a message
    assert rx["core_wait_s"] > rx["comm_s"], rx               # little of it is transfer
    # The quiet pair, up to three times, the least-waiting kept: work that starts beside
    # the suite for a second (a CI run once saw 417 ms where 12-21 ms is usual, with the
    # spin checks before and after quiet) cannot land on all three launches.
    tries = []
    for _ in range(3):
        before = _machine_is_busy()
        quiet = parlab.launch(workers.small_messages_beside_busy_ranks, 2, args=(MESSAGES, 0.0))
        why = before or _machine_is_busy()          # other work before or after: not alone
        if not why:
            tries.append(quiet.timeline.summary()[1])
            if tries[-1]["core_wait_s"] < rx["core_wait_s"] / 3:
                break
    if not tries:
        pytest.skip(f"the contended half passed; {why}, so two ranks cannot be alone")
    alone = min(tries, key=lambda t: t["core_wait_s"])
    assert alone["core_wait_s"] < rx["core_wait_s"] / 3, (
        f"the quiet pair's receiver waited {[round(t['core_wait_s'], 4) for t in tries]} s "
        f"for a core, the contended one {rx['core_wait_s']:.4f} s", tries, rx)


def test_the_figures_and_the_perfetto_export_draw_and_name_the_core_wait(tmp_path):
    from parlab import plot
    from parlab.plot.style import COLORS, HATCHES, LABELS
    assert COLORS[CORE_WAIT] not in (COLORS[WAIT], COLORS["idle"], COLORS[COMM])
    assert HATCHES[CORE_WAIT] != HATCHES[WAIT]
    tl = Timeline([Span(0, COMPUTE, "forward", 0.0, 1.0, core_wait_s=0.4),
                   Span(1, COMPUTE, "forward", 0.0, 1.0)])
    fig = plot.timeline(tl)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert LABELS[CORE_WAIT] in labels
    fig = plot.utilization(tl)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert LABELS[CORE_WAIT] in labels
    events = json.loads(open(tl.to_chrome_trace(tmp_path / "t.json")).read())["traceEvents"]
    assert [e["dur"] for e in events if e.get("cat") == CORE_WAIT] == [pytest.approx(0.4e6)]


def test_where_the_counter_is_missing_the_devices_line_says_so_once(monkeypatch):
    devs = parlab.devices(4, simulate=True)
    monkeypatch.setattr(core_waits, "MEASURED", False)
    line = devs.describe()
    assert line.count("waiting for a core is not measured on this system") == 1
    assert core_waits.read_seconds() == 0.0
    tl = Timeline([Span(0, COMPUTE, "forward", 0.0, 1.0)])
    assert tl.seconds_by_kind(0)[CORE_WAIT] == 0.0
    monkeypatch.setattr(core_waits, "MEASURED", True)
    assert "not measured" not in devs.describe()
