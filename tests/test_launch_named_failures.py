"""Failures of a launch named for what they are, and nothing left behind.

Each test failed before its fix: the report blamed the wrong thing, lost the results, or
named no rank; an early Ctrl-C left the launch's folder; a setting was silently dropped.
Workers are sent to the ranks by value, so ranks do not import pytest or this module.
"""
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import cloudpickle
import pytest

import parlab
from parlab import LaunchTimeout, WorkerError
from parlab.errors import TeardownWarning
from parlab import starting
from parlab.launch_folder import FOLDER_PREFIX

cloudpickle.register_pickle_by_value(sys.modules[__name__])
ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- rank code
def result_of_a_private_class(rank, world_size, folder):
    """Rank 1 returns an object of a module only it can import."""
    if rank == 1:
        sys.path.insert(0, folder)
        import only_here
        return only_here.Point(1, 2)
    return rank


class BadMessage(Exception):
    def __str__(self):
        raise RuntimeError("no message")


def raise_bad_message(rank, world_size):
    raise BadMessage()


def kill_the_fork_server(rank, world_size):
    if rank == 0:
        os.kill(os.getppid(), signal.SIGKILL)     # a forked rank's parent is the server
    time.sleep(30)


def one_collective_too_many(rank, world_size):
    from parlab.torch import comm
    import torch
    comm.all_reduce(torch.ones(4))
    if rank == 0:
        comm.all_reduce(torch.ones(4))           # rank 1 never calls this one
    return rank


def threads_here(rank, world_size):
    import torch
    return os.environ["OMP_NUM_THREADS"], torch.get_num_threads()


def slow_flush_on_rank_1(rank, world_size):
    if rank == 1:
        class SlowFlush:
            def write(self, text):
                return len(text)

            def flush(self):
                time.sleep(600)
        sys.stdout = SlowFlush()
    return rank


def stop_rank_1(rank, world_size):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)


def forked_copy_fails(rank, world_size):
    """The worker forks; the copy runs on and raises, the rank itself returns."""
    pid = os.fork()
    if pid == 0:
        raise RuntimeError("the forked copy's error")
    os.waitpid(pid, 0)
    return "the rank's own result"


def abort_while_the_traceback_is_made(rank, world_size):
    """The process aborts while its error's traceback is formatted, as TensorFlow's own
    thread can abort it a moment after a collective's timeout."""
    import linecache
    linecache.getlines = lambda *args, **kwargs: os.abort()
    raise ValueError("the deadline passed")


def nested(rank, world_size, depth, loop):
    if loop:
        result = []
        result.append(result)
        return result
    result = []
    for _ in range(depth):
        result = [result]
    return result


# ---------------------------------------------------------------- tests
def test_a_result_the_launcher_cannot_rebuild_names_its_rank(tmp_path, no_leftover_ranks):
    (tmp_path / "only_here.py").write_text(textwrap.dedent("""\
        class Point:
            def __init__(self, x, y):
                self.x, self.y = x, y
        """))
    with pytest.raises(WorkerError) as caught:
        parlab.launch(result_of_a_private_class, 2, process_group=False, timeout=60,
                      kwargs={"folder": str(tmp_path)})
    err = caught.value
    assert err.rank == 1 and "its result could not be rebuilt here" in err.summary
    assert "No module named 'only_here'" in err.summary and "plain data" in err.summary


def test_an_exception_whose_message_fails_keeps_its_type(no_leftover_ranks):
    with pytest.raises(WorkerError) as caught:
        parlab.launch(raise_bad_message, 1, process_group=False, timeout=60)
    assert "BadMessage: (its message could not be made: str() raised RuntimeError)" \
        in caught.value.summary
    assert "without reporting an error" not in str(caught.value)


def test_an_error_reaches_the_launcher_even_if_the_rank_aborts_right_after(no_leftover_ranks):
    with pytest.raises(WorkerError) as caught:
        parlab.launch(abort_while_the_traceback_is_made, 1, process_group=False, timeout=60)
    err = caught.value
    assert err.rank == 0 and err.summary == "ValueError: the deadline passed"
    assert "without reporting an error" not in str(err)
    assert ", in abort_while_the_traceback_is_made" in err.remote_traceback


@pytest.mark.slow
@pytest.mark.skipif(not starting.uses_fork_server(True),
                    reason="ranks start from a fork server only on Linux")
def test_a_killed_fork_server_is_named_and_the_next_launch_works(no_leftover_ranks):
    with pytest.raises(WorkerError, match="the fork server that starts the ranks died "
                                          r"during the launch \(killed by SIGKILL"):
        parlab.launch(kill_the_fork_server, 2, timeout=60)
    assert parlab.launch(threads_here, 2, timeout=60).results[0][1] == 1


@pytest.mark.slow
def test_a_collective_the_peer_never_calls_says_the_peer_returned(no_leftover_ranks):
    with pytest.raises(WorkerError) as caught:
        parlab.launch(one_collective_too_many, 2, timeout=60)
    err = caught.value
    assert err.rank == 0
    assert ("rank 1 had already returned its result and exited normally: rank 0 called a "
            "collective, send or receive that its peers never called") in err.summary


def test_omp_num_threads_in_env_is_honoured_and_checked(no_leftover_ranks):
    out = parlab.launch(threads_here, 2, timeout=60, env={"OMP_NUM_THREADS": "2"})
    assert out.results == [("2", 2), ("2", 2)]
    with pytest.raises(ValueError, match=r"OMP_NUM_THREADS.*whole number, at least 1"):
        parlab.launch(threads_here, 2, timeout=60, env={"OMP_NUM_THREADS": "two"})


@pytest.mark.slow
def test_a_teardown_warning_points_at_the_callers_line(no_leftover_ranks):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = parlab.launch(slow_flush_on_rank_1, 2, process_group=False, timeout=5)
    assert out.results == [0, 1]
    teardown = [w for w in caught if issubclass(w.category, TeardownWarning)]
    assert teardown and teardown[0].filename == __file__


def test_a_script_read_from_standard_input_is_told_why_it_cannot_launch():
    script = textwrap.dedent("""\
        import parlab

        def hello(rank, world_size):
            return rank

        if __name__ == "__main__":
            parlab.launch(hello, 2, process_group=False, timeout=60)
        """)
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0
    assert "this script was read from <stdin>" in done.stderr
    assert "Save the script to a file" in done.stderr
    assert "if __name__" not in done.stderr.split("RuntimeError:")[-1]   # it is there already


@pytest.mark.slow
def test_a_stopped_rank_is_reported_as_stopped(no_leftover_ranks):
    with pytest.raises(LaunchTimeout) as caught:
        parlab.launch(stop_rank_1, 2, process_group=False, timeout=4)
    assert "stopped by a signal (SIGSTOP, SIGTSTP) or a debugger" in caught.value.stuck[1]


def test_a_forked_copy_of_a_rank_does_not_speak_for_it(no_leftover_ranks):
    out = parlab.launch(forked_copy_fails, 2, process_group=False, timeout=60)
    assert out.results == ["the rank's own result"] * 2


@pytest.mark.parametrize("depth, loop", [(5000, False), (0, True)])
def test_a_result_too_deep_to_send_is_named(depth, loop, no_leftover_ranks):
    with pytest.raises(WorkerError, match="nested too deeply, or contains itself"):
        parlab.launch(nested, 1, timeout=60, kwargs={"depth": depth, "loop": loop})


def test_ctrl_c_while_the_launch_starts_leaves_no_folder(monkeypatch, no_leftover_ranks):
    from parlab import launcher
    real = launcher.Guardian

    def interrupted(mark):        # Ctrl-C lands while the guardian starts
        signal.raise_signal(signal.SIGINT)
        return real(mark)
    monkeypatch.setattr(launcher, "Guardian", interrupted)
    before = {p.name for p in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}{os.getpid()}-*")}
    with pytest.raises(KeyboardInterrupt):
        parlab.launch(threads_here, 1, process_group=False, timeout=60)
    after = {p.name for p in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}{os.getpid()}-*")}
    assert after <= before
