"""Waiting for a core: measured from the kernel's run-queue delay, drawn as its own kind.

The launch checks the contended case only (600 messages of 64 bytes, four ranks computing
beside the pair on the same two cores), on bounds that other processes on the machine
do not come near (measured quiet and beside busy loops): the receiver's core wait, the
pair's core wait against the receiver's transfer, the spinning ranks' waits. How much
less the pair waits alone is a ratio of two runs' timings that another process flips (a
CI run beside one read 0.18 s alone against 0.37 s contended, where a third was asked):
``python -m parlab bench --only core_waits`` prints it.
"""
import json
import time

import pytest

import parlab
from parlab import core_waits
from parlab.bench import core_waits as bench
from parlab.trace import COMM, COMPUTE, CORE_WAIT, WAIT, Span, Timeline

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
    # this thread's wait first: read after it, every thread's (this one's among them)
    # cannot be less, whatever the scheduler does between the two reads
    mine = core_waits.read_seconds()
    assert core_waits.read_seconds(every_thread=True) >= mine


@needs_schedstat
def test_the_receiver_of_small_messages_waits_for_a_core_not_for_the_wire(no_leftover_ranks):
    n = bench.MESSAGES
    tl = parlab.launch(bench.small_messages_beside_busy_ranks, 6, args=(n, bench.BUSY_S)).timeline
    tx, rx = (tl.seconds_by_kind(r) for r in (0, 1))
    # Far above a 64-byte message's wire time (tens of microseconds on loopback): measured
    # 0.5-2.5 ms a message, quiet and beside 3 and 6 busy loops (2026-11-28).
    assert rx[CORE_WAIT] > 0.1e-3 * n, rx
    # A tiny message's "transfer" is mostly the sender waiting for its core: the pair's core
    # wait exceeds the receiver's transfer (measured 3.2-10x quiet, 2.1-7.6x beside 3 busy
    # loops, 2.0-2.6x beside 6). The receiver's own core wait alone is not enough: beside
    # busy loops it fell to 0.83x its transfer.
    assert tx[CORE_WAIT] + rx[CORE_WAIT] > rx[COMM], (tx, rx)
    # Four ranks spinning on two cores run at most half the time: each waits about half its
    # spin or more, and other processes only add to it (measured 0.98-1.2 s of 2 s quiet,
    # 1.3-1.9 s beside busy loops).
    spins = [tl.seconds_by_kind(r)[CORE_WAIT] for r in range(2, 6)]
    assert all(w > bench.BUSY_S / 3 for w in spins), spins


def test_the_core_wait_benchmark_prints_medians_and_the_contended_to_alone_ratio():
    from parlab.bench import BENCHMARKS
    assert BENCHMARKS["core_waits"] is bench.core_waits_bench
    contended = [{"core_wait_s": w, "comm_s": 0.08} for w in (0.40, 0.60, 0.30)]
    alone = [{"core_wait_s": w, "comm_s": c} for w, c in ((0.02, 0.05), (0.30, 0.07), (0.0, 0.06))]
    lines = bench.report(contended, alone, 600, load=5.04)
    assert lines[0] == ("receiver of 600 64-byte messages, 4 ranks computing beside it on the "
                        "same 2 cores: waited for a core 400.0 ms (0.67 ms a message), transfer "
                        "80.0 ms (medians of 3, load average 5.0 at the start)")
    assert lines[1] == ("the pair alone: waited for a core 20.0 ms, transfer 60.0 ms (medians "
                        "of 3, interleaved)")
    # the rounds' ratios 20x and 2x; a quiet wait of nothing gives none
    assert lines[2] == ("contended/alone core wait: 11.0x (median of the rounds' ratios; "
                        "least 2.0x, most 20.0x; 1 round(s) whose pair alone never waited "
                        "left out)")
    assert "load average" not in bench.report(contended, alone)[0]
    never = bench.report(contended[:1], alone[2:])
    assert never[2] == "contended/alone core wait: no ratio (the pair alone never waited)"


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
