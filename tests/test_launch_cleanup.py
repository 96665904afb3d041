"""What a launch leaves behind: listening sockets, processes, folders.

Nothing a launch starts may listen beyond the loopback, and nothing it starts (ranks,
processes the ranks start, stack-dump folders) may outlive it: not after a failure, a
timeout, an interrupt, nor when the launching process itself is killed.

Workers that need no framework are defined here and sent to the ranks by value (as a
notebook's would be), so a rank does not import this module and its test dependencies.
"""
import multiprocessing.context
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import cloudpickle
import pytest
import workers
from process_helpers import alive as _alive, gone_within as _gone_within, kill as _kill
from process_helpers import pids_in as _pids_in, wait_for_pids as _wait_for_pids

import parlab
from parlab import LaunchTimeout, WorkerError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = {"127.0.0.1", "::1"}


# ---------------------------------------------------------------- helpers
def _wait_until_rank_code_runs(pid, seconds=30):
    """Until the rank leads its own process group: parlab's rank code is running."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if os.getpgid(pid) == pid:
                time.sleep(0.3)
                return
        except ProcessLookupError:
            return
        time.sleep(0.02)


def _start_script(tmp_path, body: str, env=None) -> subprocess.Popen:
    """Run ``body`` as a script's main block (spawned ranks import the main script)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


# ---------------------------------------------------------------- workers
def start_helper_then(rank, world_size, pid_file, then):
    """Start a long-lived helper process (a stand-in for a server), then fail or hang."""
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(pid_file, "a") as fh:
        fh.write(f"{helper.pid}\n")
    if then == "raise" and rank == 0:
        # every rank's helper first: the launcher stops the others 0.3 s after a failure,
        # and a rank slow to start (loaded cores) would be stopped before starting its own
        deadline = time.monotonic() + 30
        while (len(Path(pid_file).read_text().split()) < world_size
               and time.monotonic() < deadline):
            time.sleep(0.02)
        raise RuntimeError("rank 0 gives up, leaving its helper behind")
    if then == "die on stack request":
        # as a multi-threaded TensorFlow rank sometimes does (SIGSEGV inside the dump)
        import faulthandler
        faulthandler.unregister(signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    time.sleep(600)


def sleep_long(rank, world_size):
    time.sleep(600)


# ---------------------------------------------------------------- 1. loopback only
@pytest.mark.parametrize("world_size", [2, 4])
def test_nothing_a_launch_starts_listens_beyond_loopback(world_size, no_leftover_ranks):
    # Asked while every rank is inside the worker: the launching process (this one) and
    # every rank, each for its own listening sockets. The ranks meet through a file.
    out = parlab.launch(workers.listening_during_launch, world_size, args=(os.getpid(),))
    assert [r["sum"] for r in out.results] == [world_size * (world_size - 1) / 2] * world_size
    ranks = [r["rank"] for r in out.results]
    assert all(ranks), "gloo should listen (on the loopback) for its peers"
    for addrs in [out.results[0]["launcher"], *ranks]:
        assert {a.rsplit(":", 1)[0].strip("[]") for a in addrs} <= LOOPBACK, addrs


# ---------------------------------------------------------------- 2. TensorFlow's servers
@pytest.mark.slow
def test_tf_servers_of_a_dead_coordinator_do_not_outlive_the_launch(tmp_path, no_leftover_ranks):
    pytest.importorskip("tensorflow")
    pids = tmp_path / "servers"
    try:
        with pytest.raises(WorkerError, match="SIGKILL"):
            parlab.launch(workers.tf_cluster_then_die, 1, kwargs={"pid_file": str(pids)},
                          process_group=False, timeout=180,
                          env={"TF_CPP_MIN_LOG_LEVEL": "2"})
        servers = _pids_in(pids)
        assert len(servers) == 2
        assert _gone_within(servers, 1), f"TensorFlow servers still running: {_alive(servers)}"
    finally:
        _kill(_pids_in(pids))


# ---------------------------------------------------------------- 3. nothing left running
def test_a_helper_of_a_rank_that_already_exited_is_stopped(tmp_path, no_leftover_ranks):
    pids = tmp_path / "helpers"
    try:
        with pytest.raises(WorkerError, match="rank 0 gives up"):
            parlab.launch(start_helper_then, 2, process_group=False, timeout=60,
                          kwargs={"pid_file": str(pids), "then": "raise"})
        helpers = _wait_for_pids(pids, 2, seconds=1)
        assert _gone_within(helpers, 1), f"helpers still running: {_alive(helpers)}"
    finally:
        _kill(_pids_in(pids))


def test_ranks_in_a_long_c_call_die_with_a_killed_launcher(tmp_path):
    pids = tmp_path / "ranks"
    script = _start_script(tmp_path, f"""
        import os, re
        import parlab

        def busy(rank, world_size):
            with open({str(pids)!r}, "a") as fh:
                fh.write(f"{{os.getpid()}}\\n")
            # catastrophic backtracking: one C call that holds the GIL for hours
            re.match(r"(a+)+$", "a" * 48 + "b")

        if __name__ == "__main__":
            parlab.launch(busy, 2, process_group=False, timeout=300)
    """)
    try:
        ranks = _wait_for_pids(pids, 2)
        time.sleep(0.3)         # both are inside the C call now
        script.kill()           # kill -9: the launcher runs no cleanup at all
        script.wait()
        assert _gone_within(ranks, 2), f"orphaned ranks still running: {_alive(ranks)}"
    finally:
        script.kill()
        _kill(_pids_in(pids))


def test_an_interrupt_while_ranks_start_leaves_none_running(monkeypatch, no_leftover_ranks):
    started = []
    real_start = multiprocessing.context.SpawnProcess.start

    def start_then_interrupt(self):
        real_start(self)
        started.append(self.pid)
        if len(started) == 2:  # Ctrl-C lands once the 2nd rank runs, before it is recorded
            _wait_until_rank_code_runs(self.pid)
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start_then_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            parlab.launch(sleep_long, 3, process_group=False, timeout=60)
        assert started and _gone_within(started, 1), f"still running: {_alive(started)}"
    finally:
        _kill(started)


@pytest.mark.slow
def test_a_rank_killed_by_the_stack_request_is_reported_and_its_helpers_stopped(
        tmp_path, no_leftover_ranks):
    pids = tmp_path / "helpers"
    try:
        with pytest.raises(LaunchTimeout) as info:
            parlab.launch(start_helper_then, 2, process_group=False, timeout=5,
                          kwargs={"pid_file": str(pids), "then": "die on stack request"})
        for rank in (0, 1):
            what = info.value.stuck[rank]
            assert "died when asked for its stack" in what and "SIGUSR1" in what, what
            assert "starting up" not in what
        helpers = _wait_for_pids(pids, 2, seconds=1)
        assert _gone_within(helpers, 1), f"helpers still running: {_alive(helpers)}"
    finally:
        _kill(_pids_in(pids))


def test_stack_folders_of_a_terminated_launcher_are_swept(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    pids = tmp_path / "ranks"
    script = _start_script(tmp_path, f"""
        import os, time
        import parlab

        def wait(rank, world_size):
            with open({str(pids)!r}, "a") as fh:
                fh.write(f"{{os.getpid()}}\\n")
            time.sleep(600)

        if __name__ == "__main__":
            parlab.launch(wait, 2, process_group=False, timeout=300)
    """, env={"TMPDIR": str(scratch)})
    try:
        ranks = _wait_for_pids(pids, 2)
        script.terminate()      # SIGTERM: Python's default is to die without cleanup
        script.wait()
        assert _gone_within(ranks, 2), f"orphaned ranks still running: {_alive(ranks)}"
        left = list(scratch.iterdir())
        assert left, "expected the terminated launcher's folder to remain until swept"
        for folder in left:     # as if it had been left there a while ago
            os.utime(folder, (time.time() - 3600, time.time() - 3600))
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))
        parlab.launch(no_framework, 1, process_group=False)
        assert not list(scratch.iterdir()), [p.name for p in scratch.iterdir()]
    finally:
        script.kill()
        _kill(_pids_in(pids))


def no_framework(rank, world_size):
    return rank


def test_a_live_launch_folder_is_never_swept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen = tmp_path / "seen"
    # rank 0 of the outer launch runs a whole launch of its own (a second launcher)
    # while the outer one's folder, backdated, is still in use
    out = parlab.launch(launch_inside, 1, process_group=False, timeout=120,
                        kwargs={"scratch": str(tmp_path), "seen": str(seen)})
    assert out.results == [[0]]
    assert "alive" in seen.read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("parlab-")]


def launch_inside(rank, world_size, scratch, seen):
    import tempfile as tf_
    import parlab as pl
    tf_.tempdir = scratch
    mine = [p for p in os.listdir(scratch) if p.startswith("parlab-")]
    for name in mine:           # make the running launch's folder look old
        os.utime(os.path.join(scratch, name), (time.time() - 3600, time.time() - 3600))
    result = pl.launch(no_framework, 1, process_group=False).results
    still = all(os.path.isdir(os.path.join(scratch, name)) for name in mine)
    with open(seen, "w") as fh:
        fh.write("alive" if mine and still else f"swept: {mine}")
    return result
