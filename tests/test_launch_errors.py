"""Honest errors: each wrong setting named with what to pass instead, each slow phase named.

Workers here need no framework; they are sent to the ranks by value, as a notebook's are.
"""
import math
import sys
import time

import cloudpickle
import numpy as np
import pytest

import parlab
from parlab import LaunchTimeout
from parlab.errors import TeardownWarning

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def no_framework(rank, world_size):
    return rank * 10


def scaled(rank, world_size, base, *, scale=1, label="x"):
    return f"{label}{(base + rank) * scale}"


class _SlowFlush:
    """A stream whose flush hangs: what the rank does after sending its result."""

    def write(self, text):
        return len(text)

    def flush(self):
        time.sleep(600)


def slow_teardown_on_rank_1(rank, world_size):
    if rank == 1:
        sys.stdout = _SlowFlush()
    return rank + 100


# ---------------------------------------------------------------- 4a. results are kept
@pytest.mark.slow
def test_results_that_arrived_are_kept_when_only_teardown_is_slow(no_leftover_ranks):
    started = time.perf_counter()
    with pytest.warns(TeardownWarning, match=r"rank 1\b.*tearing down") as caught:
        out = parlab.launch(slow_teardown_on_rank_1, 2, process_group=False, timeout=5)
    assert out.results == [100, 101]
    assert "rank 0" not in str(caught[0].message)
    assert time.perf_counter() - started < 15


# ---------------------------------------------------------------- 4b. wrong settings
@pytest.mark.parametrize("bad", [float("inf"), float("nan"), True, "5", -1, 0])
def test_a_wrong_timeout_is_named(bad, no_leftover_ranks):
    with pytest.raises(ValueError, match=r"timeout=.*(seconds|number)") as info:
        parlab.launch(no_framework, 2, process_group=False, timeout=bad)
    assert "port" not in str(info.value)


@pytest.mark.parametrize("bad", [70000, -1, "29500", 2.5, True])
def test_a_wrong_port_is_named_not_called_busy(bad):
    with pytest.raises(ValueError, match=r"port=.*0 to 65535") as info:
        parlab.launch(no_framework, 2, port=bad)
    assert "busy" not in str(info.value)


def test_a_valid_port_is_accepted_and_opens_nothing(no_leftover_ranks):
    # Ranks meet through a private file: a port number, even one in use, changes nothing.
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        out = parlab.launch(no_framework, 2, process_group=False, port=busy.getsockname()[1])
    assert out.results == [0, 10]


def test_numpy_whole_numbers_are_whole_numbers(no_leftover_ranks):
    out = parlab.launch(no_framework, np.int64(2), process_group=False, timeout=np.float64(60),
                        seed=np.int32(3))
    assert out.results == [0, 10]
    assert parlab.devices(np.int64(2), simulate=True).n == 2


@pytest.mark.parametrize("bad", ["no", 1, "False"])
def test_simulate_must_be_true_false_or_none(bad):
    with pytest.raises(ValueError, match=r"simulate=.*True.*False.*None"):
        parlab.devices(2, simulate=bad)


def test_other_wrong_settings_are_named_with_what_to_pass():
    cases = [
        (dict(args=5), r"args=.*\(5,\)"),
        (dict(args="ab"), r"args=.*tuple"),
        (dict(kwargs=[("scale", 2)]), r"kwargs=.*dict"),
        (dict(kwargs={1: 2}), r"kwargs=.*string"),
        (dict(env={"A": 1}), r"env=.*string"),
        (dict(devices=2), r"devices=.*parlab.devices\(2\)"),
        (dict(process_group="yes"), r"process_group=.*True or False"),
        (dict(seed=1.5), r"seed=.*whole number"),
    ]
    for settings, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            parlab.launch(no_framework, 2, **settings)


# ---------------------------------------------------------------- 4c. slow start-up
@pytest.mark.slow
def test_a_timeout_during_start_up_says_so(tmp_path, monkeypatch, no_leftover_ranks):
    # A worker whose module takes long to import in the ranks (only there: the variable
    # comes with env=), like 16 ranks importing torch on 2 cores.
    (tmp_path / "slow_to_import.py").write_text(
        "import os, time\n"
        "if os.environ.get('PARLAB_TEST_SLOW_IMPORT'):\n"
        "    time.sleep(600)\n\n"
        "def worker(rank, world_size):\n"
        "    return rank\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_to_import
    started = time.perf_counter()
    with pytest.raises(LaunchTimeout) as info:
        parlab.launch(slow_to_import.worker, 2, process_group=False, timeout=4,
                      env={"PARLAB_TEST_SLOW_IMPORT": "1"})
    assert time.perf_counter() - started < 12
    err = info.value
    text = str(err)
    assert "start-up" in text and "none had reached the worker" in text, text
    assert "importlib" not in text and "_bootstrap" not in text, text
    assert err.starting == {0, 1}


# ---------------------------------------------------------------- 6. keyword arguments
def test_keyword_arguments_reach_the_worker(no_leftover_ranks):
    out = parlab.launch(scaled, 2, args=(1,), kwargs={"scale": 3, "label": "n="},
                        process_group=False)
    assert out.results == ["n=3", "n=6"]


def test_a_timeout_that_is_huge_but_finite_is_fine(no_leftover_ranks):
    out = parlab.launch(no_framework, 1, process_group=False, timeout=7 * 24 * 3600.0)
    assert out.results == [0] and not math.isnan(out.wall_time)
