"""Parameter servers and central storage: sync equals data parallel, async converges."""
import numpy as np
import pytest
import torch
from batched import launch_by_size

import parlab
from parlab.course import lab06
from parlab import data as datasets
from parlab.errors import WorkerError
from parlab.torch import central_storage
from parlab.torch import data_parallel as dp
from parlab.torch import parameter_server as ps

TOL = 1e-5


def _max_diff(a: dict, b: dict) -> float:
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


SYNC = [(1, 2), (2, 2), (1, 3)]
STEPS, BATCH = 5, 96


@pytest.fixture(scope="module")
def runs():
    """The synchronous runs of this module: one launch per world size."""
    calls = {}
    for servers, workers in SYNC:
        calls.setdefault(servers + workers, {})[("ps", servers, workers)] = (
            ps.train_parameter_server, ("sync", servers, "mlp", BATCH, STEPS, 0.2))
        calls.setdefault(workers, {})[("mirror", workers)] = (
            dp.train_data_parallel, ("by_hand", "mlp", BATCH, STEPS, 0.2))
    for servers in (1, 2):
        calls.setdefault(servers + 2, {})[("sharding", servers)] = (
            ps.train_parameter_server, ("sync", servers, "mlp", 64, 4, 0.1))
    return launch_by_size(calls)


@pytest.mark.parametrize("servers,workers", SYNC)
def test_sync_parameter_server_equals_sync_data_parallel(servers, workers, runs):
    steps, batch = STEPS, BATCH
    out = runs[("ps", servers, workers)]
    mirror = runs[("mirror", workers)]
    state = ps.state_dict(out.results)
    assert _max_diff(state, mirror.results[0]["state"]) < TOL
    assert _max_diff(state, dp.train_single(global_batch=batch, steps=steps, lr=0.2)["state"]) < TOL
    for server in out.results[:servers]:
        assert server["updates"] == steps
        assert len(server["applied"]) == steps * workers          # one gradient per worker per step
        assert {a["staleness"] for a in server["applied"]} == {0}  # synchronous: never stale
    for worker in out.results[servers:]:                           # every worker ended with them
        np.testing.assert_array_equal(worker["params"], ps.assemble(out.results))


def test_async_parameter_server_converges_and_records_staleness(no_leftover_ranks):
    out = parlab.launch(ps.train_parameter_server, 3, args=("async", 1, "mlp", 64, 100, 0.2))
    applied = out.results[0]["applied"]
    assert len(applied) >= 200                                     # steps x workers, at least
    assert out.results[0]["updates"] == len(applied)
    assert {a["worker"] for a in applied} == {1, 2}
    losses = [a["loss"] for a in applied]
    # The median of the last 40 (not the mean of 20): a worker starved of a core for a
    # while pushes gradients several updates stale, and the loss can spike for a few
    # updates (one suite run: mean of the last 20 at 1.39 against 2.29 at the start;
    # medians of the last 50 under a load of 4: 0.47-0.62).
    assert np.median(losses[-40:]) < 0.6 * np.median(losses[:20])
    # Accuracy is of the final parameters alone, and one late push can knock them back
    # (the loss's median above is the steady measure): 60 runs here, quiet and beside two
    # and six busy loops, 0.61-0.92; one CI run 0.45; 300 single-process runs of the same
    # training with the pushes in random orders (harsher than real ones): one under 0.5, at
    # 0.31. Chance is 0.1.
    assert ps.accuracy(out.results) > 0.25
    staleness = [a["staleness"] for a in applied]
    # Each update makes the other worker's next push one update staler: mean ~ workers - 1.
    assert max(staleness) >= 1 and 0.5 < np.mean(staleness) < 1.5
    assert ps.history(out.results)[0]["time"] >= 0


def test_async_does_not_wait_for_a_slow_worker(no_leftover_ranks):
    runs = {mode: parlab.launch(ps.train_parameter_server, 3, args=(mode, 1, "cnn", 64, 30, 0.2, {2: 3}))
            for mode in ("sync", "async")}
    count = {mode: {w: sum(a["worker"] == w for a in r.results[0]["applied"]) for w in (1, 2)}
             for mode, r in runs.items()}
    assert count["sync"][1] == count["sync"][2] == 30
    # Asynchronous: every push is an update of its own, no push waits for the other's.
    # Which worker pushes more is timing (beside three busy loops the slow worker's fixed
    # idle can outpace the fast worker's starved compute: 32 against 29 pushes once), so
    # the bench prints that ratio: `python -m parlab bench --only parameter_server`.
    assert count["async"][1] >= 1 and count["async"][2] >= 1
    assert runs["async"].results[0]["updates"] == sum(count["async"].values())
    assert runs["sync"].results[0]["updates"] == 30
    slow_spans = [s for s in runs["async"].timeline if s.name == "emulated slowdown"]
    assert slow_spans and {s.rank for s in slow_spans} == {2}


def test_an_emulated_slowdown_idles_for_a_compute_time_measured_once():
    slow = ps.EmulatedSlowdown(3.0, measure=3, skip=1)
    # warming up, then measuring: the idle follows each step's own compute
    assert [slow.idle_s(c) for c in (0.050, 0.010, 0.012, 0.011)] == pytest.approx(
        [0.100, 0.020, 0.024, 0.022])
    # then fixed at twice the median of the measured steps, whatever a step took
    # (a step that waited for a core is not idled again)
    assert slow.idle_s(0.040) == pytest.approx(0.022)
    assert slow.idle_s(0.005) == pytest.approx(0.022)


def test_the_servers_listen_on_the_loopback_only(no_leftover_ranks):
    out = parlab.launch(ps.train_parameter_server, 4, args=("async", 2, "mlp", 32, 3, 0.1))
    for server in out.results[:2]:
        assert server["listening"], "a server should listen for its peers"
        assert all(a.startswith("127.0.0.1:") for a in server["listening"]), server["listening"]


def test_sharding_halves_each_servers_traffic(runs):
    one, two = runs[("sharding", 1)], runs[("sharding", 2)]
    for s in (0, 1):
        assert abs(two.timeline.comm_bytes(s) / one.timeline.comm_bytes(0) - 0.5) < 0.01


def test_bad_settings_are_refused_clearly(no_leftover_ranks):
    with pytest.raises(ValueError, match="no worker"):
        ps.roles(2, 2)
    with pytest.raises(ValueError, match="num_servers"):
        ps.roles(3, 0)
    with pytest.raises(ValueError, match="shards"):
        ps.shard_bounds(3, 4)
    assert ps.shard_bounds(7, 2) == [(0, 4), (4, 7)]
    with pytest.raises(WorkerError, match="multiple of 2"):
        parlab.launch(ps.train_parameter_server, 3, args=("sync", 1, "mlp", 63, 2), timeout=60)
    with pytest.raises(WorkerError, match="worker ranks"):
        parlab.launch(ps.train_parameter_server, 3, args=("async", 1, "mlp", 64, 2, 0.1, {0: 3}), timeout=60)


def test_delay_zero_is_plain_sgd_and_staleness_slows_training():
    steps, lr = 40, 0.2
    fresh = ps.train_with_delay(0, steps=steps, lr=lr, every=steps)
    ref = dp.train_single(global_batch=32, steps=steps, lr=lr)
    net = dp.build("mlp")
    net.load_state_dict({k: torch.as_tensor(v) for k, v in ref["state"].items()})
    x, y = (torch.as_tensor(a) for a in datasets.digits("train"))
    with torch.no_grad():
        want = float(torch.nn.functional.cross_entropy(net(x), y))
    assert abs(fresh["loss"][-1] - want) < TOL
    stale = ps.train_with_delay(8, steps=steps, lr=lr, every=steps)
    assert stale["loss"][-1] > fresh["loss"][-1]


def test_central_storage_equals_one_device():
    out = central_storage.train_central_storage(2, global_batch=64, steps=5, lr=0.2)
    assert _max_diff(out["state"], dp.train_single(global_batch=64, steps=5, lr=0.2)["state"]) < TOL
    names = {s.name for s in out["timeline"]}
    assert {"parameters to replica", "forward + backward", "gradients to central",
            "average + update"} <= names
    with pytest.raises(ValueError, match="multiple of 3"):
        central_storage.train_central_storage(3, global_batch=64)


def test_the_update_rule_exercise_says_what_is_wrong(capsys, no_leftover_ranks):
    def adds(shard, grad, lr, staleness):
        shard += lr * grad

    def out_of_place(shard, grad, lr, staleness):
        return shard - lr * grad

    def not_yet(shard, grad, lr, staleness):
        raise NotImplementedError

    assert lab06.check_update_rule(adds) is ps.sgd_update
    assert "uphill" in capsys.readouterr().out      # says what went wrong, not the rule
    assert lab06.check_update_rule(out_of_place) is ps.sgd_update
    assert "in place" in capsys.readouterr().out
    assert lab06.check_update_rule(not_yet) is ps.sgd_update
    assert "not attempted" in capsys.readouterr().out

    def right(shard, grad, lr, staleness):
        shard.sub_(lr * grad)

    assert lab06.check_update_rule(right, steps=10) is right
    assert "correct" in capsys.readouterr().out
