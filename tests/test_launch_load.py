"""Many launches in one process, through success and failure, leak nothing."""
import os
import subprocess
import sys
import tempfile
import threading
import time

import cloudpickle
import psutil
import pytest
import workers
from conftest import rank_processes

import parlab
from parlab import LaunchTimeout, WorkerError

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def no_framework(rank, world_size):
    return rank * 10


def fail(rank, world_size, how):
    """Fail as launches do: an exception, a hang, or an exception leaving a helper behind."""
    if how == "helper left behind" and rank == 1:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if how != "hang" and rank == 1:
        raise RuntimeError("plain failure")
    time.sleep(30)  # stopped by the launcher when rank 1 fails, or at the timeout


# (how, the error it ends with, timeout); the process-group failure goes through torch
FAILURES = ([("raise", WorkerError, 60)] * 14 + [("hang", LaunchTimeout, 1.5)] * 2
            + [("helper left behind", WorkerError, 60)] * 2
            + [("process group", WorkerError, 60)] * 2)


def _marked(marker: str) -> list[int]:
    """Processes anywhere on this machine carrying our marker in their environment:
    ranks, and anything they started, even after it was re-parented away from us."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PARLAB_LOAD_TEST") == marker:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


@pytest.mark.slow
def test_fifty_launches_and_twenty_relaunches_after_failures_leak_nothing(
        tmp_path, monkeypatch, no_leftover_ranks):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # folders land where we count
    env = {"PARLAB_LOAD_TEST": str(os.getpid())}
    me = psutil.Process()
    parlab.launch(no_framework, 2, process_group=False, env=env)  # warm up lazy imports
    parlab.launch(workers.sum_of_ranks, 2, env=env)
    fds, threads = me.num_fds(), threading.active_count()
    started = time.perf_counter()
    for _ in range(50):
        assert parlab.launch(no_framework, 2, process_group=False, env=env).results == [0, 10]
    for how, error, timeout in FAILURES:
        with pytest.raises(error):
            if how == "process group":
                parlab.launch(workers.raise_on_rank_1, 2, env=env)
            else:
                parlab.launch(fail, 2, kwargs={"how": how}, process_group=False, timeout=timeout,
                              env=env)
        assert parlab.launch(no_framework, 2, process_group=False, env=env).results == [0, 10]
    parlab.launch(workers.sum_of_ranks, 2, env=env)
    elapsed = time.perf_counter() - started
    assert not rank_processes()
    leaked = _marked(env["PARLAB_LOAD_TEST"])
    for pid in leaked:  # so that a failure here leaves this machine clean
        os.kill(pid, 9)
    assert not leaked, f"{len(leaked)} processes outlived their launch"
    assert not list(tmp_path.iterdir()), [p.name for p in tmp_path.iterdir()]
    assert me.num_fds() <= fds + 2, (fds, me.num_fds())
    assert threading.active_count() <= threads, (threads, threading.active_count())
    print(f"{50 + 2 * len(FAILURES) + 1} launches in {elapsed:.1f} s")
