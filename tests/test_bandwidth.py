import subprocess
import sys

import pytest

import parlab
from parlab import metrics
from parlab.torch import bandwidth


def test_sweep_measures_every_size_and_op(no_leftover_ranks):
    # The largest message must be big enough that its transfer time is far above the
    # scheduling noise of a shared 2-core machine: a 4-byte median once read 1.1 ms
    # under load, longer than a 1 MiB transfer. 16 MiB takes several milliseconds.
    sizes = [4, 4096, 2**24]
    out = parlab.launch(bandwidth.sweep, 2, args=(sizes, ("send_recv", "all_reduce")))
    records, other = out.results
    assert other == []
    assert [(r["op"], r["bytes"]) for r in records] == [
        (op, s) for op in ("send_recv", "all_reduce") for s in sizes]
    assert all(r["seconds"] > 0 and r["repeats"] >= 3 for r in records)
    assert all(0 < r["lower_quartile_s"] <= r["seconds"] for r in records)
    # every repeat kept, sorted: the median is the middle one
    assert all(len(r["times_s"]) == r["repeats"] and list(r["times_s"]) == sorted(r["times_s"])
               and r["times_s"][len(r["times_s"]) // 2] == r["seconds"] for r in records)
    # bigger messages take longer: the bandwidth term is real (beside 3 busy loops the
    # 16 MiB medians took 8.8-41 ms, the 4-byte ones 0.16-1.8 ms: load does not close that)
    for op in ("send_recv", "all_reduce"):
        times = [r["seconds"] for r in records if r["op"] == op]
        assert times[-1] > times[0]
    fit = metrics.fit_link([r["bytes"] for r in records if r["op"] == "send_recv"],
                           [r["seconds"] for r in records if r["op"] == "send_recv"])
    assert fit.bandwidth_Bps > 0
    assert {s.name for s in out.timeline} >= {"send", "recv", "all_reduce", "barrier"}


def test_default_sizes_and_repeats():
    sizes = bandwidth.default_sizes(2**20)
    assert sizes[0] == 4 and sizes[-1] == 2**20 and all(b == 4 * a for a, b in zip(sizes, sizes[1:]))
    assert bandwidth.repeats_for(4) == 40 and bandwidth.repeats_for(2**30) == 5


def test_a_sweep_takes_the_sizes_in_turn_and_times_each_its_repeats():
    sizes = bandwidth.default_sizes(16 * 2**20)
    order = bandwidth.rounds(sizes, warmup=2)
    assert order[:2] == [[(n, False) for n in sizes]] * 2           # warm-up: every size, untimed
    timed = [[n for n, t in one if t] for one in order[2:]]
    assert all(sum(n == size for one in timed for n in one) == bandwidth.repeats_for(size)
               for size in sizes)
    # the largest size's 5 repetitions spread over the sweep, not bunched at its start
    at = [i for i, one in enumerate(timed) if sizes[-1] in one]
    assert len(at) == 5 and at[0] < len(timed) / 4 and at[-1] >= len(timed) * 3 / 4
    # the order within a round is shuffled, the same on every rank (every call)
    assert order == bandwidth.rounds(sizes, warmup=2)
    assert len({one[0] for one in timed}) > 3 and len({one[-1] for one in timed}) > 3


@pytest.mark.slow
def test_bench_command_prints_measured_ratios():
    # One benchmark end to end through the command (every benchmark in quick mode takes
    # minutes: `make bench` is for people, not for CI); the others must all be registered.
    out = subprocess.run([sys.executable, "-m", "parlab", "bench", "--quick", "--only",
                          "tracing_overhead"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tracing overhead, wall clock:" in out.stdout
    assert "one span costs" in out.stdout
    from parlab import bench
    assert {"tracing_overhead", "manual_split", "vertical_slicing", "pipeline_bubble",
            "data_parallel", "parameter_server", "hybrid", "memory", "core_waits",
            "sim", "two_nodes"} <= set(bench.BENCHMARKS)
    wrong = subprocess.run([sys.executable, "-m", "parlab", "bench", "--only", "nope"],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "unknown benchmark 'nope'" in wrong.stdout


def test_this_machine_is_calibrated_back_to_back_and_between_messages(no_leftover_ranks):
    """One launch gives the link, the wake-up, and lab 01's step timed twice: back to
    back (lab 01) and with a message before every phase, as a rank of a distributed
    step computes."""
    from parlab.experiments import measure_this_machine
    here = measure_this_machine((16, 32, 4), batches=(8, 32), steps=4, messages=(4096, 65536))
    net_layers = 2
    for key in ("costs", "costs_between_messages"):
        costs = here[key]
        # a pass's own call (timed on a one-layer network) and its layers' parts: this
        # tiny MLP's pass may be nearly all call
        assert len(costs.forward) == net_layers and len(costs.call_s) == 3
        assert all(t >= 0 for t in (*costs.forward, *costs.backward, *costs.call_s))
        assert sum(costs.forward) + costs.call_s[0] > 0
        assert sum(costs.backward) + costs.call_s[1] > 0
        assert 0 < costs.update and costs.call_s[2] <= costs.update
    cluster = here["cluster"]
    assert cluster.wake_latency_s >= 0 and cluster.intra.bandwidth_Bps > 0
    # the wake-up after a short block and after 20 ms (the collectives' wake_latency_s)
    (short, after_short), (long, after_long) = cluster.wake_curve
    assert short < long == 0.02 and after_short >= 0 and after_long == cluster.wake_latency_s
    assert cluster.cores >= 1
    # DDP's bucket all-reduce (lab 05's hook on this MLP): its rank's time around it. The
    # 50 ms bounds below are far above these medians (all under 0.3 ms beside 3 busy loops)
    before, after = cluster.handoff_s
    assert 0 <= before < 0.05 and 0 < after < 0.05
    # and what DDP's wrapper adds to a step's passes (its forward and gradient hooks)
    forward, backward = cluster.ddp_wrapper_s
    assert 0 <= forward < 0.05 and 0 <= backward < 0.05
    # and what lab 03's operators cost around a collective inside a pass
    assert 0 <= cluster.tp_operator_s < 0.05
    # and the share of a pinned rank's isends that waited for its compute: of 60 sends
    held = cluster.held_send_share * 60
    assert 0 <= held <= 60 and held == pytest.approx(round(held))
    # one stray per measured message: what it took beyond the link's price
    sends = [r for r in here["links"] if r["op"] == "send_recv"]
    assert len(cluster.message_spread_s) == sum(r["repeats"] for r in sends)
    first = sends[0]
    assert cluster.message_spread_s[0] == pytest.approx(first["times_s"][0]
                                                        - cluster.intra.time(first["bytes"]))
    assert len(cluster.collective_spread_s) == sum(r["repeats"] for r in here["links"]
                                                   if r["op"] == "all_reduce")
    # four steps of each size: on rank 0 back to back, on both ranks between messages
    for key, ranks in (("timelines", 1), ("timelines_between_messages", 2)):
        assert set(here[key]) == {8, 32}
        assert all(len([s for s in tl if s.name == "forward"]) == 4 * ranks
                   for tl in here[key].values())
        # the sizes take turns, so that a drift of the cores' speed meets every size alike
        # (between messages, both ranks' steps of one size come before either's next)
        forwards = sorted((s.start, b) for b, tl in here[key].items() for s in tl
                          if s.name == "forward")
        assert [b for _, b in forwards] == ([8] * ranks + [32] * ranks) * 4
        assert all(sorted(s.name for s in tl) == sorted(("forward", "backward", "update") * 4
                                                        * ranks) for tl in here[key].values())


def test_a_bucket_hand_off_ends_where_the_rank_posts_its_all_reduce():
    """The wait for the peer, split off the lane's all-reduce, is not the rank's hand-off:
    the engine adds a collective's wake-up itself."""
    from parlab.course.calibrate import bucket_handoff
    from parlab.trace import COMM, WAIT, Span, Timeline
    spans = []
    for k in range(3):                  # three steps, 10 ms apart, times in ms
        t = 10.0 * k
        spans += [Span(0, WAIT, "handoff wait", t, t + 3.0),
                  Span(2, WAIT, f"bucket all_reduce {k}", t + 0.1, t + 1.1),    # the peer
                  Span(2, COMM, f"bucket all_reduce {k}", t + 1.1, t + 2.6)]
    before, after = bucket_handoff(Timeline([_in_seconds(s) for s in spans]), lane=2)
    assert before == pytest.approx(1e-4) and after == pytest.approx(4e-4)
    with pytest.raises(RuntimeError, match="hand-off"):
        bucket_handoff(Timeline([_in_seconds(spans[0])]), lane=2)


def test_tensor_parallel_operators_cost_what_the_sliced_step_takes_beyond_its_collectives():
    """The sliced pair's step less its all-reduces' spans (waiting, transferring, waiting
    for a core), less the unsliced step, per collective (two a step): medians over both
    ranks' steps after the first two, each step to the end of its backward's own wait for
    a core (carved off the backward's end: the last all-reduce may end inside it)."""
    from dataclasses import replace

    from parlab.course.calibrate import tp_operator
    from parlab.trace import COMM, COMPUTE, CORE_WAIT, WAIT, Span, Timeline
    spans = [Span(0, COMM, "all_reduce", -5.0, -4.0)]       # the sweep's, before: not a step's
    for rank in (0, 1):
        for k in range(5):              # five turns, 10 ms apart, times in ms
            t = 10.0 * k
            slow = 5.0 if k < 2 else 3.0 if (rank, k) == (0, 4) else 0.0   # warm-up; an outlier
            spans += [Span(rank, COMPUTE, "unsliced forward", t, t + 1.0),
                      Span(rank, COMPUTE, "unsliced backward", t + 1.0, t + 3.0 + 0.2 * rank),
                      Span(rank, COMPUTE, "sliced forward", t + 4.0, t + 6.0),
                      Span(rank, WAIT, "all_reduce", t + 4.5, t + 4.7),
                      Span(rank, COMM, "all_reduce", t + 4.7, t + 5.0),
                      Span(rank, CORE_WAIT, "all_reduce (core wait)", t + 5.0, t + 5.3),
                      Span(rank, COMPUTE, "sliced backward", t + 6.0, t + 8.7 + slow),
                      Span(rank, COMM, "all_reduce", t + 8.5 + slow, t + 8.8 + slow),
                      Span(rank, CORE_WAIT, "sliced backward (core wait)", t + 8.7 + slow,
                           t + 9.2 + slow)]
    # sliced 5.2 ms less 1.1 ms of collectives (median; rank 0's last step is slower),
    # unsliced 3.0 and 3.2 (median 3.1): (4.1 - 3.1) / 2
    assert tp_operator(Timeline([_in_seconds(s) for s in spans])) == pytest.approx(0.5e-3)
    # a sliced step quicker than the unsliced one costs nothing, not less than nothing
    slow = [replace(s, end=s.end + 5.0) if s.name == "unsliced backward" else s for s in spans]
    assert tp_operator(Timeline([_in_seconds(s) for s in slow])) == 0.0
    with pytest.raises(RuntimeError, match="sliced"):
        tp_operator(Timeline([_in_seconds(s) for s in spans if "unsliced" in s.name]))


def _in_seconds(span):
    from dataclasses import replace
    return replace(span, start=span.start / 1e3, end=span.end / 1e3)


def test_the_sim_benchmark_reports_the_median_over_rounds_against_each_target():
    from parlab.bench import sim as bench_sim
    rounds = [[{"label": "lab 01", "what": "step", "predicted": p, "measured": 1.0, "ranks": 1,
                "core_wait": 0.0},
               {"label": "lab 02", "what": "bubble", "predicted": b, "measured": 0.5},
               {"label": "lab 05", "what": "step", "predicted": 1.0, "measured": m, "ranks": 2,
                "core_wait": 0.1},
               {"label": "lab 07", "what": "step", "predicted": 1.0, "measured": m, "ranks": 4,
                "core_wait": w}]
              for p, b, m, w in ((1.10, 0.58, 2.0, 0.5), (1.30, 0.54, 1.0, 0.0),
                                 (0.90, 0.60, 3.0, 0.5))]
    lines = bench_sim.report(rounds, cores=2)
    assert lines[0].startswith("predicted/measured (ranks <= cores) lab 01 1.10 (step ")
    assert ("rounds: 1.10 / 1.30 / 0.90; within 15 %; measured 1.00x apart between rounds; "
            "1 rank(s) on 2 cores)") in lines[0]
    assert ("predicted - measured +0.080 (rounds: +0.080 / +0.040 / +0.100; OUTSIDE 0.05; "
            "measured 0.000 apart between rounds)") in lines[1]
    # the machine's own figure moved 3x: no one prediction fits every round
    assert lines[2].startswith("predicted/measured (ranks <= cores) lab 05 0.50 (step ")
    assert "rounds: 0.50 / 1.00 / 0.33; OUTSIDE 15 %; measured 3.00x apart" in lines[2]
    # 4 ranks on 2 cores: the measured band, and the step less its core wait; no verdict
    assert lines[3].startswith("predicted/measured (oversubscribed) lab 07 0.50 (step ")
    assert "measured 1000.00-3000.00 ms across rounds (median 2000.00)" in lines[3]
    # medians of 1 / (2 x 0.5), 1 / 1, 1 / (3 x 0.5): 1.00, 1.00, 0.67
    assert "against the measured step less its core wait (50% of it): 1.00" in lines[3]
    assert "within" not in lines[3] and "OUTSIDE" not in lines[3]
    assert lines[-1].startswith("summary: step times within 15 % for 1 of 2 configurations "
                                "whose ranks fit the 2 cores (1 oversubscribed: bands above), "
                                "shares within 0.05 for 0 of 1")
    assert lines[-1].endswith("of the 2 outside, 1 moved between rounds by more than the "
                              "tolerance allows (step 1.35x, share 0.10)")


def test_a_run_pools_every_calibration_it_made():
    from parlab.bench import sim as bench_sim
    first, other = {"cluster": "first"}, {"cluster": "kept"}
    one = {"calibration": first, "calibrations": {"lab02": first, "lab03 naive": {"cluster": "b"},
                                                  bench_sim.AFTER_THE_LAST: {"cluster": "z"}}}
    kept = {"calibration": other}       # a round kept with its first calibration only
    assert [c["cluster"] for c in bench_sim.calibrations_of_run([one, kept])] == [
        "first", "b", "z", "kept"]


def test_shares_against_the_model_count_a_messages_core_wait_as_waiting():
    # the model charges a woken rank's wait for a core to the message (its wake-up);
    # a compute span's own core wait stays a core wait
    from parlab.steps import as_the_model_counts
    from parlab.spans import Span
    from parlab.timeline import Timeline
    from parlab.steps import warm_shares
    spans = []
    for k in range(4):
        t = 10.0 * k
        spans += [Span(0, "compute", "forward", t, t + 4.0, core_wait_s=1.0),
                  Span(0, "comm", "all_reduce", t + 4.0, t + 10.0, core_wait_s=3.0)]
    measured = Timeline(spans)
    counted = as_the_model_counts(measured)
    kinds = {(s.kind, s.name) for s in counted}
    assert ("wait", "all_reduce (core wait)") in kinds
    assert ("core_wait", "forward (core wait)") in kinds
    before, after = (warm_shares(tl, "forward", skip=1) for tl in (measured, counted))
    assert before["comm"] + before["idle"] == pytest.approx(0.3)
    assert after["comm"] + after["idle"] == pytest.approx(0.6)
    assert after["core_wait"] == pytest.approx(0.1)


def test_an_isend_counts_as_held_where_its_receive_took_over_half_the_sender_s_compute():
    from parlab.course.calibrate import held_share
    from parlab.torch.calibrate import HELD_COMPUTE_S
    assert HELD_COMPUTE_S == 0.003
    assert held_share([2e-4, 2.9e-3, 1.6e-3, 1e-4]) == 0.5        # over 1.5 ms: held
    assert held_share([2e-4, 1.4e-3]) == 0.0
    with pytest.raises(RuntimeError, match="held_sends"):
        held_share([])


def test_a_core_whose_layers_fit_to_no_time_is_priced_by_its_whole_passes():
    """Beside busy cores a tiny network's layers can fit to 0 s (its passes are nearly
    all call): the FLOP rate then reads the whole pass, and an empty one is refused."""
    from parlab import sim
    from parlab.course.calibrate import flop_rate
    net = sim.Network.mlp((16, 32, 4))
    flops = 3 * 32 * sum(layer.flops for layer in net.layers)
    timed = sim.Measured((1e-4, 1e-4), (2e-4, 2e-4), 1e-4, 32, 100)
    assert flop_rate(timed, net, 32) == pytest.approx(flops / 6e-4)
    all_call = sim.Measured((0.0, 0.0), (0.0, 0.0), 1e-4, 32, 100, call_s=(1e-4, 2e-4, 0.0))
    assert flop_rate(all_call, net, 32) == pytest.approx(flops / 3e-4)
    with pytest.raises(RuntimeError, match="wider network or larger batches"):
        flop_rate(sim.Measured((0.0, 0.0), (0.0, 0.0), 1e-4, 32, 100), net, 32)
