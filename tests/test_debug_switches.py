"""What lab 09 needed of the launcher and the rank runtime.

* ``TORCH_DISTRIBUTED_DEBUG`` given through ``launch(env=...)`` reaches a rank forked from
  the fork server (which imported torch, and read the variable, before it was set): before
  the fix, DETAIL's collective checks never started there, and a mismatched all-reduce
  aborted a rank instead of being reported.
* A rank that is stopped (SIGSTOP: a debugger, a frozen machine emulated) dies at the
  launcher's SIGTERM instead of after the SIGKILL grace: before the fix a stopped rank kept
  SIGTERM pending and every such launch took ``STOP_GRACE_S`` longer.
* Forked ranks find ``torch._dynamo`` imported: the first optimizer a process builds
  imports it (1.3 s of CPU per rank, measured on 2 cores).
"""
import os
import signal
import sys
import time

import cloudpickle
import pytest

import parlab
from parlab import LaunchTimeout, WorkerError, launcher, rank_stacks, starting
from parlab.course import lab09_programs as programs

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_distributed_debug_detail_reaches_forked_ranks(no_leftover_ranks):
    with pytest.raises(WorkerError) as info:
        parlab.launch(programs.mismatched, 2, kwargs=dict(kind="length"), timeout=60,
                      env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert "Detected mismatch between collectives" in info.value.summary
    assert "TensorShape=[8]" in info.value.summary and "TensorShape=[4]" in info.value.summary


def stops_itself(rank, world_size):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)


@pytest.mark.slow
def test_a_stopped_rank_is_stopped_without_waiting_out_the_kill_grace(no_leftover_ranks):
    timeout = 2.0
    parlab.launch(programs.swap_collective, 2, timeout=60)     # the fork server is up
    t0 = time.perf_counter()
    with pytest.raises(LaunchTimeout):
        parlab.launch(stops_itself, 2, timeout=timeout)
    took = time.perf_counter() - t0
    # before: timeout + the stack request's wait + the full SIGTERM grace, then SIGKILL
    assert took < timeout + rank_stacks.DUMP_WAIT_S + launcher.STOP_GRACE_S, took


def dynamo_imported(rank, world_size):
    return "torch._dynamo" in sys.modules


@pytest.mark.skipif(not starting.uses_fork_server(True), reason="ranks are spawned here")
def test_forked_ranks_find_dynamo_imported():
    assert parlab.launch(dynamo_imported, 2, timeout=60).results == [True, True]
