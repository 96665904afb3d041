"""Faults a launch must survive without losing time, leaving processes, or leaking.

Each test here failed before the fix it guards:
* a rank that starts a child which inherits its end of the launcher's pipe (``os.fork``,
  ``os.system("cmd &")``, ``Popen(close_fds=False)``, a fork-context multiprocessing child)
  and returns: the launch waited out its whole timeout, then blamed the exited ranks;
* a helper started in a new session (``start_new_session=True``) outlived the launch;
* a launcher killed (SIGKILL, as a kernel restart does) or terminated (SIGTERM) left the
  ranks' helpers running under init;
* a second Ctrl-C during the cleanup interrupted it: helpers that ignore SIGTERM kept
  running and the launch folder stayed;
* every rank failing with the same error was reported as "probably as a consequence".
Then a soak over the whole fault matrix checks that nothing leaks: processes, threads,
file descriptors, folders.

Workers are sent to the ranks by value (as a notebook's are), so ranks do not import
pytest or this module.
"""
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from pathlib import Path

import cloudpickle
import psutil
import pytest
from conftest import rank_processes
from process_helpers import alive as _alive, gone_within as _gone_within, kill as _kill
from process_helpers import pids_in as _pids_in, wait_for_pids as _wait_for_pids

import parlab
from parlab import LaunchTimeout, WorkerError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parents[1]
CHILD_KINDS = ("os.fork", "os.system &", "Popen(close_fds=False)", "fork-context child",
               "new session")


# ---------------------------------------------------------------- rank code
def start_child(kind, pid_file, ignore_term=False):
    """Start a child that sleeps for a minute, the way ``kind`` says; record its pid."""
    import multiprocessing
    import subprocess as sp
    sleeper = ("import signal, time; "
               + ("signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignore_term else "")
               + "time.sleep(60)")
    if kind == "os.fork":
        pid = os.fork()
        if pid == 0:
            if ignore_term:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(60)
            os._exit(0)
    elif kind == "os.system &":
        out = pid_file + ".sh"
        os.system(f"{sys.executable} -c '{sleeper}' & echo $! > {out}")
        pid = int(open(out).read())
    elif kind == "Popen(close_fds=False)":
        pid = sp.Popen([sys.executable, "-c", sleeper], close_fds=False).pid
    elif kind == "fork-context child":
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
        child.start()
        pid = child.pid
    elif kind == "new session":
        pid = sp.Popen([sys.executable, "-c", sleeper], start_new_session=True).pid
    else:
        raise ValueError(kind)
    with open(pid_file, "a") as fh:
        fh.write(f"{pid}\n")


def child_then(rank, world_size, kind, pid_file, then="return"):
    start_child(kind, f"{pid_file}.{rank}")
    if then == "raise" and rank == 0:
        raise RuntimeError("rank 0 fails after starting its child")
    return rank


def fault(rank, world_size, what):
    """One rank (the last) misbehaves as ``what`` says; the others wait for the stop."""
    if rank == world_size - 1:
        if what == "raise":
            raise RuntimeError("planted failure")
        if what == "exit":
            os._exit(3)
        if what == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if what == "hang":
            time.sleep(600)
    time.sleep(600)


def same_error_everywhere(rank, world_size):
    raise ValueError("mesh dp=3 x tp=2 needs 6 ranks, the world has 4")


# ---------------------------------------------------------------- 1. children holding the pipe
@pytest.mark.parametrize("kind", CHILD_KINDS)
def test_a_rank_that_starts_a_child_and_returns_ends_the_launch_at_once(tmp_path, kind):
    pid_file = str(tmp_path / "children")
    t0 = time.monotonic()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")      # a TeardownWarning fails the test
            out = parlab.launch(child_then, 2, kwargs={"kind": kind, "pid_file": pid_file},
                                process_group=False, timeout=40)
        took = time.monotonic() - t0
        assert out.results == [0, 1]
        children = _pids_in(f"{pid_file}.0") + _pids_in(f"{pid_file}.1")
        assert len(children) == 2
        assert _gone_within(children, 1), f"children still running: {_alive(children)}"
        assert took < 20, f"the launch took {took:.1f} s: it waited for the children"
    finally:
        _kill(_pids_in(f"{pid_file}.0") + _pids_in(f"{pid_file}.1"))


def test_a_helper_in_a_new_session_does_not_outlive_a_failed_launch(tmp_path):
    pid_file = str(tmp_path / "children")
    try:
        with pytest.raises(WorkerError, match="rank 0 fails after starting its child"):
            parlab.launch(child_then, 2, process_group=False, timeout=40,
                          kwargs={"kind": "new session", "pid_file": pid_file, "then": "raise"})
        children = _wait_for_pids(f"{pid_file}.0", 1, 1) + _pids_in(f"{pid_file}.1")
        assert _gone_within(children, 1), f"helpers still running: {_alive(children)}"
    finally:
        _kill(_pids_in(f"{pid_file}.0") + _pids_in(f"{pid_file}.1"))


# ---------------------------------------------------------------- 2. the launcher dies
LAUNCHER = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
import parlab
from test_launch_faults import start_child

def helpers_then_wait(rank, world_size, pid_file, ignore_term):
    start_child("Popen(close_fds=False)", pid_file, ignore_term)
    start_child("new session", pid_file, ignore_term)
    time.sleep(600)

if __name__ == "__main__":
    parlab.launch(helpers_then_wait, 2, process_group=False, timeout=300,
                  kwargs=dict(pid_file={pid_file!r}, ignore_term={ignore_term!r}))
"""


def _launcher(tmp_path, ignore_term=False):
    """A script that launches 2 ranks, each with 2 helpers; returns (script, helper pids)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    pid_file = tmp_path / f"helpers{time.monotonic_ns()}"
    script = tmp_path / "launcher.py"
    script.write_text(textwrap.dedent(LAUNCHER.format(
        tests=str(ROOT / "tests"), pid_file=str(pid_file), ignore_term=ignore_term)))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(scratch)})
    return proc, _wait_for_pids(pid_file, 4), scratch


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_helpers_die_with_a_killed_launcher(tmp_path, sig):
    proc, helpers, _ = _launcher(tmp_path)
    try:
        proc.send_signal(sig)
        proc.wait(timeout=30)
        assert _gone_within(helpers, 5), f"helpers still running: {_alive(helpers)}"
    finally:
        proc.kill()
        _kill(helpers)


@pytest.mark.slow
def test_a_second_ctrl_c_waits_for_the_cleanup(tmp_path):
    proc, helpers, scratch = _launcher(tmp_path, ignore_term=True)
    try:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)                     # inside the 2 s between SIGTERM and SIGKILL
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        assert _gone_within(helpers, 1), f"helpers still running: {_alive(helpers)}"
        assert not [p.name for p in scratch.iterdir() if p.name.startswith("parlab-launch")]
    finally:
        proc.kill()
        _kill(helpers)


# ---------------------------------------------------------------- 3. what the error says
def test_every_rank_failing_alike_is_not_called_a_consequence():
    with pytest.raises(WorkerError) as info:
        parlab.launch(same_error_everywhere, 3, process_group=False, timeout=60)
    text = str(info.value)
    assert "consequence" not in text, text
    assert "the same error" in text and "needs 6 ranks" in text, text


# ---------------------------------------------------------------- 4. the soak
def _fds():
    return psutil.Process().num_fds()


def _launch_folders():
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("parlab-launch-")}


@pytest.mark.slow
def test_a_soak_over_the_fault_matrix_leaks_nothing(tmp_path, monkeypatch):
    """At least 30 launches that fail every way, then nothing of them is left."""
    scratch = tmp_path / "launch-folders"      # this test's alone: other runs share /tmp
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    # the first launch of a process starts multiprocessing's resource tracker (one pipe
    # kept for the process's life): start it before counting
    parlab.launch(child_then, 1, process_group=False, kwargs={"kind": "os.fork",
                                                              "pid_file": str(tmp_path / "w")})
    fds, threads, folders = _fds(), threading.active_count(), _launch_folders()
    started, launches = [], 0
    t0 = time.monotonic()
    try:
        for round_ in range(2):
            for what in ("raise", "exit", "segfault"):
                with pytest.raises(WorkerError):
                    parlab.launch(fault, 2, args=(what,), process_group=False, timeout=60)
                launches += 1
            with pytest.raises(LaunchTimeout):
                parlab.launch(fault, 2, args=("hang",), process_group=False, timeout=3)
            launches += 1
            for kind in CHILD_KINDS:
                for then in ("return", "raise"):
                    pid_file = str(tmp_path / f"c{launches}")
                    try:
                        parlab.launch(child_then, 1, process_group=False, timeout=30,
                                      kwargs={"kind": kind, "pid_file": pid_file, "then": then})
                    except WorkerError:
                        assert then == "raise"
                    started += _pids_in(f"{pid_file}.0")
                    launches += 1
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            proc, helpers, _ = _launcher(tmp_path)
            started += helpers
            proc.send_signal(sig)
            proc.wait(timeout=30)
            launches += 1
        assert launches >= 30
        assert _gone_within(started, 5), f"still running: {_alive(started)}"
        assert not rank_processes(), [p.cmdline() for p in rank_processes()]
        assert _fds() == fds, f"file descriptors {fds} -> {_fds()}"
        assert threading.active_count() == threads
        assert _launch_folders() <= folders, _launch_folders() - folders
        print(f"{launches} launches in {time.monotonic() - t0:.1f} s: nothing left")
    finally:
        _kill(started)
