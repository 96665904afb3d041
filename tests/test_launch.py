"""The launcher: results, failures, hangs, interrupts, cleanup, notebook functions."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import plain_workers
import workers

import parlab
from parlab.core_waits import waiting_name
from parlab import LaunchTimeout, WorkerError

ROOT = Path(__file__).resolve().parents[1]


def test_results_come_back_in_rank_order_with_one_thread_per_simulated_device(no_leftover_ranks):
    out = parlab.launch(workers.rank_info, 3)
    assert [r["rank"] for r in out.results] == [0, 1, 2]
    assert all(r["world_size"] == 3 for r in out.results)
    assert len({r["pid"] for r in out.results}) == 3
    assert all(r["threads"] == 1 and r["omp"] == "1" for r in out.results)
    assert out.devices.simulated and out.devices.backend == "gloo"
    assert out.timeline.ranks == [0, 1, 2]


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_pinned_ranks_run_on_cores_of_their_own(no_leftover_ranks):
    cores = sorted(os.sched_getaffinity(0))
    n = len(cores) + 1                          # more ranks than cores: one core each, shared
    out = parlab.launch(workers.cores_of_rank, n, pin_cores=True)
    assert out.results == [[cores[r % len(cores)]] for r in range(n)]
    assert all(len(r) == len(cores) for r in parlab.launch(workers.cores_of_rank, 2).results)
    assert sorted(os.sched_getaffinity(0)) == cores          # the launcher itself is not pinned


def test_pinned_cores_share_out_the_cores(monkeypatch):
    from parlab import launch_settings
    assert launch_settings.pinned_cores(3, False) == [None] * 3
    with pytest.raises(ValueError, match="pin_cores= must be True or False"):
        launch_settings.pinned_cores(2, "yes")
    monkeypatch.setattr(launch_settings.os, "sched_getaffinity", lambda pid: {4, 5, 6, 7},
                        raising=False)
    assert launch_settings.pinned_cores(2, True) == [{4, 5}, {6, 7}]
    assert launch_settings.pinned_cores(3, True) == [{4}, {5}, {6}]
    assert launch_settings.pinned_cores(5, True) == [{4}, {5}, {6}, {7}, {4}]


@pytest.mark.parametrize("start", ["fork server", "spawn"])
def test_a_rank_runs_in_the_launchers_current_folder_environment_and_output(
        start, tmp_path, monkeypatch, capfd, no_leftover_ranks):
    """A rank forked from the fork server gets what a spawned one has: the launcher's
    folder, environment and standard output as they are now, not as they were when the
    server started (an earlier launch, here in an earlier capture)."""
    if start == "spawn":
        monkeypatch.setenv("PARLAB_START", "spawn")
    with capfd.disabled():  # the fork server, if this starts it, writes to the terminal
        parlab.launch(workers.rank_info, 2)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PARLAB_TEST_SETTING", "changed after the first launch")
    out = parlab.launch(workers.where_the_rank_runs, 2, args=("PARLAB_TEST_SETTING",))
    assert [r["cwd"] for r in out.results] == [str(tmp_path)] * 2
    assert [r["value"] for r in out.results] == ["changed after the first launch"] * 2
    parents = {r["parent"] for r in out.results}
    if start == "spawn":
        assert parents == {os.getpid()}
    elif sys.platform.startswith("linux"):
        assert os.getpid() not in parents, "torch ranks should fork from the fork server"
    printed = capfd.readouterr().out
    assert "[rank 0] hello from rank 0" in printed and "[rank 1] hello from rank 1" in printed


def test_seeds_are_offset_by_rank_and_reproducible(no_leftover_ranks):
    first = parlab.launch(workers.rank_info, 2, seed=7).results
    again = parlab.launch(workers.rank_info, 2, seed=7).results
    assert first[0]["torch_rand"] != first[1]["torch_rand"]
    assert first[0]["py_rand"] != first[1]["py_rand"]
    assert [r["torch_rand"] for r in first] == [r["torch_rand"] for r in again]


def test_a_collective_across_four_ranks(no_leftover_ranks):
    out = parlab.launch(workers.sum_of_ranks, 4)
    assert [float(r[0]) for r in out.results] == [6.0] * 4
    # the one traced operation, and on 2 cores maybe the time it waited for one
    assert {s.name for s in out.timeline} <= {"all_reduce", waiting_name("all_reduce")}
    assert "all_reduce" in {s.name for s in out.timeline}


def test_function_defined_in_main_is_sent_by_value(no_leftover_ranks):
    # What a notebook cell produces: a function and a class living in __main__, which a
    # spawned process cannot import.
    namespace = {"__name__": "__main__"}
    exec(textwrap.dedent("""
        class Scale:
            def __init__(self, k):
                self.k = k

        def cell_worker(rank, world_size, factor):
            import torch
            from parlab.torch import comm
            x = torch.tensor([float(rank) * Scale(factor).k])
            comm.all_reduce(x)
            return float(x[0])
    """), namespace)
    out = parlab.launch(namespace["cell_worker"], 2, args=(3,))
    assert out.results == [3.0, 3.0]


# A function defined in a notebook cell, launched from that kernel: lab 00's
# `first_allreduce` on 4 ranks, executed by nbval in `make test` (a test of its own here
# cost 7-13 s of the suite's 15 minutes for the same check).


def test_a_raising_rank_is_named_with_its_traceback_and_the_others_are_stopped(no_leftover_ranks):
    # The fork server up first: started cold beside 3 busy loops, it alone took 11-14 s
    # of the 20 (torch imported on 2 loaded cores); warm, the failing launch took 0.6 s.
    parlab.launch(workers.sum_of_ranks, 2)
    started = time.perf_counter()
    with pytest.raises(WorkerError) as info:
        parlab.launch(workers.raise_on_rank_1, 3, timeout=60)
    assert time.perf_counter() - started < 20  # seconds, not the 60 s timeout
    err = info.value
    assert err.rank == 1
    assert "rank 1 of 3 failed: ValueError: shard 1 is malformed" in str(err)
    assert "raise_on_rank_1" in err.remote_traceback
    # and the notebook can launch again at once
    assert parlab.launch(plain_workers.no_torch, 2, process_group=False).results == [0, 10]


def test_a_rank_killed_by_a_signal_is_reported(no_leftover_ranks):
    with pytest.raises(WorkerError) as info:
        parlab.launch(workers.sigkill_rank_0, 2, timeout=60)
    assert info.value.rank == 0
    assert "SIGKILL" in str(info.value)


@pytest.mark.slow
def test_a_hang_becomes_a_timeout_that_says_where_each_rank_was(no_leftover_ranks):
    # The timeout counts from the launch, start-up included: leave room for a slow start
    # on a loaded machine, so that the ranks are surely past the barrier when it fires.
    started = time.perf_counter()
    with pytest.raises(LaunchTimeout) as info:
        parlab.launch(workers.recv_that_never_comes, 2, timeout=12)
    elapsed = time.perf_counter() - started
    assert 12 <= elapsed < 25
    assert isinstance(info.value, TimeoutError)
    assert set(info.value.stuck) == {0, 1}
    assert "recv" in info.value.stuck[0] and "recv_that_never_comes" in info.value.stuck[0]
    assert "sleep" in info.value.stuck[1] or "recv_that_never_comes" in info.value.stuck[1]


def _start_sleeping_ranks(tmp_path, main_body: str):
    """A script whose two ranks write their pids and sleep; wait until both are up."""
    pids = tmp_path / "pids"
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        import parlab

        def worker(rank, world_size):
            with open({str(pids)!r}, "a") as fh:
                fh.write(f"{{os.getpid()}}\\n")
            time.sleep(600)

        if __name__ == "__main__":
    """) + textwrap.indent(textwrap.dedent(main_body), " " * 4))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    deadline = time.time() + 60
    while time.time() < deadline and len(_lines(pids)) < 2:
        time.sleep(0.1)
    assert len(_lines(pids)) == 2, "ranks did not start"
    return proc, [int(p) for p in _lines(pids)]


def _lines(path):
    return path.read_text().split() if path.exists() else []


def _running(pids):
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_keyboard_interrupt_stops_every_rank(tmp_path):
    proc, pids = _start_sleeping_ranks(tmp_path, """
        try:
            parlab.launch(worker, 2, process_group=False, timeout=300)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
            sys.exit(0)
    """)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert "INTERRUPTED" in out
    assert not _running(pids)


def test_ranks_exit_when_the_launching_process_is_killed(tmp_path):
    proc, pids = _start_sleeping_ranks(tmp_path, """
        parlab.launch(worker, 2, process_group=False, timeout=300)
    """)
    proc.kill()  # like a notebook kernel that is killed or restarted
    proc.wait()
    deadline = time.time() + 10
    while _running(pids) and time.time() < deadline:
        time.sleep(0.2)
    assert not _running(pids), f"orphaned ranks still running: {_running(pids)}"


def test_rank_output_is_prefixed(capfd):
    namespace = {"__name__": "__main__"}
    exec("def talk(rank, world_size):\n    print('hello from', rank)\n", namespace)
    parlab.launch(namespace["talk"], 2, process_group=False)
    out = capfd.readouterr().out
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out


def test_gloo_listens_on_loopback_only(no_leftover_ranks):
    out = parlab.launch(workers.listening_addresses, 2)
    for addrs in out.results:
        assert addrs and all(a.startswith("127.") for a in addrs), addrs


@pytest.mark.parametrize("bad", [0, -1, 2.5, "2", True])
def test_impossible_world_sizes_are_refused_at_once(bad):
    with pytest.raises(ValueError, match="world_size"):
        parlab.launch(plain_workers.no_torch, bad)


def test_bad_settings_are_refused_with_what_to_change():
    with pytest.raises(ValueError, match="timeout"):
        parlab.launch(plain_workers.no_torch, 2, timeout=0)
    with pytest.raises(ValueError, match=r"parlab.devices\(3\)"):
        parlab.launch(plain_workers.no_torch, 3, devices=parlab.devices(2))
    import threading
    with pytest.raises(TypeError, match="could not send"):
        parlab.launch(plain_workers.no_torch, 2, args=(threading.Lock(),))
    with pytest.raises(TypeError, match="callable"):
        parlab.launch("plain_workers.no_torch", 2)


def test_a_busy_port_does_not_matter_since_no_port_is_opened(no_leftover_ranks):
    # The ranks meet through a file in a private folder: port= is only checked.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        out = parlab.launch(workers.sum_of_ranks, 2, port=busy.getsockname()[1])
    assert [float(r[0]) for r in out.results] == [1.0, 1.0]


@pytest.mark.slow
def test_the_same_worker_runs_under_torchrun(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this python")
    trace_path = tmp_path / "torchrun.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "parlab", "run",
         "parlab.examples:hello_allreduce", "--trace", str(trace_path)],
        capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith('{"results"'))
    results = json.loads(line)["results"]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["sum"] == r["expected"] == 1.0 for r in results)
    trace = json.loads(trace_path.read_text())
    lanes = {e["pid"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert lanes == {0, 1}


@pytest.mark.slow
def test_under_torchrun_a_timeout_names_the_slow_rank(tmp_path):
    """No launcher watches torchrun's ranks: rank 0 names the rank that had not finished."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this python")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "parlab", "run",
         "plain_workers:one_rank_slow", "--args", "[1, 120]", "--timeout", "10"],
        capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "rank 1: had not finished its rank function" in out, out[-3000:]
    assert time.monotonic() - t0 < 110, "the run waited for the slow rank instead of its timeout"
