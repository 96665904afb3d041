"""parlab.course.reports: a provoked failure, trimmed to the lines that matter.

The parsing and trimming are checked on planted reports (no ranks); ``provoke`` on real
ranks: what they print at the file-descriptor level lands in the report's file, not in
the caller's output, and a real deadlock is located at the program's lines.
"""
import os
import sys

import cloudpickle
import pytest

from parlab import LaunchTimeout, WorkerError
from parlab.course import lab09_programs as programs
from parlab.course import reports

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SWAP_SEND = programs.swap.__code__.co_firstlineno + 6      # `comm.send(mine, peer)`: line 7


def stuck_in_swap(line=SWAP_SEND, call="send"):
    return ("stack, most recent call first: send (distributed/distributed_c10d.py:2753) <- "
            f"wrapper (distributed/c10d_logger.py:83) <- {call} (torch/comm.py:140) <- "
            f"swap (course/lab09_programs.py:{line})")


def test_listing_numbers_lines_from_the_def():
    text = reports.listing(programs.swap).splitlines()
    assert text[0].split()[:2] == ["1", "def"]
    assert text[6].split(None, 1) == ["7", "comm.send(mine, peer)"]


def test_where_in_a_stack_report_names_the_line_and_the_call():
    w = reports.where_in(programs.swap, stuck_in_swap())
    assert (w.line, w.code, w.call) == (7, "comm.send(mine, peer)", "send")
    assert str(w) == "in send() at line 7: comm.send(mine, peer)"
    assert reports.where_in(programs.swap_by_parity, stuck_in_swap()) is None   # another function


def test_where_in_a_traceback_takes_the_innermost_frame_of_the_function():
    first = programs.dies.__code__.co_firstlineno
    tb = ('Traceback (most recent call last):\n'
          '  File "/x/parlab/_worker.py", line 161, in main\n'
          f'  File "/x/parlab/course/lab09_programs.py", line {first + 15}, in dies\n'
          '    raise ValueError("record 3 of shard 1 is malformed")\n'
          'ValueError: record 3 of shard 1 is malformed\n')
    w = reports.where_in(programs.dies, tb)
    assert w.line == 16 and w.code.startswith("raise ValueError") and w.call == ""


def test_clean_drops_build_paths_device_options_and_tensorflow_frames():
    gloo = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
            "Connection closed by peer [127.0.0.1]:2734. This is typically caused by a remote "
            "worker crashing. Check the logs of the remote worker before reporting an error. GLHF!")
    assert reports.clean(gloo) == ("RuntimeError: [gloo pair.cc:553] Connection closed by peer "
                                   "[127.0.0.1]:2734. This is typically caused by a remote "
                                   "worker crashing.")
    detail = ("CollectiveFingerPrint(SequenceNumber=2, OpType=ALLREDUCE, TensorShape=[4], "
              "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), "
              "device=cpu, memory_format=(nullopt))), but")
    assert reports.clean(detail) == ("CollectiveFingerPrint(SequenceNumber=2, OpType=ALLREDUCE, "
                                     "TensorShape=[4], TensorDtypes=Float), but")
    tf = ("DeadlineExceededError: Graph execution error:\n\nDetected at node X defined at (most "
          "recent call last):\n  File \"a.py\", line 1, in <module>\n\nCollective has timed out.")
    assert reports.clean(tf) == "DeadlineExceededError: Graph execution error:\nCollective has timed out."


def test_a_hang_is_shown_rank_by_rank_with_where_the_full_text_is(tmp_path):
    err = LaunchTimeout(4.0, 2, {0: stuck_in_swap(), 1: "still starting up: importing (for 4.0 s)"})
    out = reports.Outcome("deadlock", programs.swap, 2, 4.2, error=err, path=tmp_path / "d.txt")
    lines = out.lines()
    assert out.ended == "hung" and lines[0].startswith("deadlock: hung")
    assert lines[1] == "  rank 0: in send() at line 7: comm.send(mine, peer)"
    assert lines[2] == "  rank 1: still starting up: importing (for 4.0 s)"
    assert lines[-1] == f"  full report ({len(out.text().splitlines())} lines): {tmp_path / 'd.txt'}"
    assert out.where() == {0: reports.Where(7, "comm.send(mine, peer)", "send")}


def test_a_crash_shows_the_library_s_last_words_and_what_followed():
    err = WorkerError(0, 2, "the process died (killed by SIGABRT (exit code -6)) without reporting "
                      "an error; last stack: " + stuck_in_swap(),
                      other_failures=["rank 1: RuntimeError: Connection reset by peer"])
    printed = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
               "  what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
               "tcp/pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4.\n")
    text = "\n".join(reports.Outcome("crash", programs.swap, 2, 0.3, error=err,
                                     output=printed).lines())
    assert "rank 0 of 2: the process died (killed by SIGABRT" in text
    assert "rank 0 was in send() at line 7: comm.send(mine, peer)" in text
    assert "printed: [enforce fail at [gloo pair.cc:456]] op.preamble.length" not in text
    assert "printed: [enforce fail at" in text and "8 vs 4." in text
    assert "then rank 1: RuntimeError: Connection reset by peer" in text
    assert "full report" not in text                         # no file was written


def printing(rank, world_size):
    """Prints from Python and straight to file descriptor 2, as a C++ library does."""
    print(f"python line from rank {rank}")
    os.write(2, f"C-level line from rank {rank}\n".encode())
    return rank


def test_provoke_keeps_what_ranks_print_in_the_file_not_in_the_output(tmp_path, capfd):
    out = reports.provoke("printing", printing, 2, timeout=60, process_group=False,
                          folder=tmp_path)
    assert out.ended == "finished" and out.results == [0, 1]
    seen = capfd.readouterr()
    assert "line from rank" not in seen.out + seen.err
    for r in (0, 1):
        assert f"C-level line from rank {r}" in out.output
        assert f"[rank {r}] python line from rank {r}" in out.output
    saved = (tmp_path / "printing.txt").read_text()
    assert "C-level line from rank 1" in saved and "def printing(rank, world_size):" in saved
    print("after")                                           # the descriptors are back
    assert capfd.readouterr().out == "after\n"


@pytest.mark.slow
def test_provoke_locates_a_real_deadlock(tmp_path, no_leftover_ranks):
    from parlab.course import lab09
    lab09.warm_up()          # the first launch of a process starts the fork server
    out = reports.provoke("deadlock", programs.swap, 2, timeout=programs.HANG_TIMEOUT,
                          folder=tmp_path)
    assert out.ended == "hung"
    assert {r: (w.line, w.call) for r, w in out.where().items()} == {0: (7, "send"), 1: (7, "send")}
    assert out.seconds < programs.HANG_TIMEOUT + 3


@pytest.mark.slow
def test_a_frozen_tensorflow_worker_is_reported_by_its_collective_s_timeout(tmp_path, monkeypatch,
                                                                            no_leftover_ranks):
    pytest.importorskip("tensorflow")
    from parlab.course import lab09
    monkeypatch.setattr(lab09, "FOLDER", str(tmp_path))
    out = lab09.run_tf_frozen_worker()
    assert out.ended == "failed" and out.error.rank == 0
    assert out.error.summary.startswith("DeadlineExceededError")
    text = "\n".join(out.lines())
    assert "Collective has timed out during execution." in text
    assert "rank 0 was in step() at line 27: step()" in text
