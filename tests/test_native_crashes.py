"""A rank that crashes inside a library's native code is reported as such.

Lab 06's TensorFlow coordinator, rarely, took a segmentation fault in TensorFlow's own
code while a worker died (``identity`` copying a step's result, in a thread of
TensorFlow's coordinator); the report named only the main thread, waiting in ``join``.
The report now names the thread that crashed and the library it was in, and the lab
runs such a cluster once more instead of failing.
"""
import sys
import textwrap
import types

import cloudpickle
import pytest

import parlab
from parlab import WorkerError
from parlab.rank_stacks import crashed_in_library

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def crash_in_a_thread(rank, world_size, folder, library):
    """A thread of this rank takes SIGSEGV inside a package installed in ``folder``."""
    import importlib
    import threading
    sys.path.insert(0, folder)
    module = importlib.import_module(library) if library else None
    if module is None:
        import faulthandler
        target = faulthandler._sigsegv          # a C function: the innermost frame is here
    else:
        target = module.boom
    thread = threading.Thread(target=target)
    thread.start()
    thread.join()


def _library(tmp_path, name="fakelib"):
    """A package under a folder named site-packages, whose ``boom`` segfaults."""
    package = tmp_path / "site-packages" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent("""\
        import faulthandler

        def boom():
            faulthandler._sigsegv()
        """))
    return str(tmp_path / "site-packages")


def test_a_crash_inside_a_library_names_the_library_and_the_thread(tmp_path):
    folder = _library(tmp_path)
    with pytest.raises(WorkerError) as caught:
        parlab.launch(crash_in_a_thread, 1, process_group=False, timeout=60,
                      kwargs={"folder": folder, "library": "fakelib"})
    err = caught.value
    assert "killed by SIGSEGV" in err.summary and "inside fakelib's own code" in err.summary
    assert "the crash was in another thread, at boom (fakelib/__init__.py:4) <- run" in err.summary
    main_thread = err.summary.split("; the main thread was at ")[1]   # starting that thread
    assert "crash_in_a_thread (tests/test_native_crashes.py" in main_thread
    assert crashed_in_library(err.remote_traceback) == "fakelib"


def test_a_crash_outside_any_library_is_not_blamed_on_one(tmp_path):
    with pytest.raises(WorkerError) as caught:
        parlab.launch(crash_in_a_thread, 1, process_group=False, timeout=60,
                      kwargs={"folder": str(tmp_path), "library": None})
    err = caught.value
    assert "died (killed by SIGSEGV (exit code -11)) without reporting an error" in err.summary
    assert "the crash was in another thread" in err.summary and "own code" not in err.summary
    assert crashed_in_library(err.remote_traceback) is None


TF_CRASH = textwrap.dedent("""\
    Fatal Python error: Segmentation fault

    Current thread 0x00007f0000000002 (most recent call first):
      File "/x/site-packages/tensorflow/python/ops/gen_array_ops.py", line 4283 in identity
      File "/x/site-packages/tensorflow/python/distribute/coordinator/values.py", line 123 in copy_tensor

    Thread 0x00007f0000000001 (most recent call first):
      File "/x/threading.py", line 327 in wait
    """)


def _crashing_launch(failures):
    """A stand-in for ``launch`` that fails as ``failures`` says, then succeeds."""
    calls = []

    def launch(fn, world_size, **kwargs):
        calls.append(kwargs)
        if len(calls) <= failures:
            raise WorkerError(0, 1, "the process crashed (killed by SIGSEGV (exit code -11)) "
                                    "inside tensorflow's own code", TF_CRASH)
        return types.SimpleNamespace(results=[{"trained": True}])
    return launch, calls


def test_lab06_runs_a_crashed_tensorflow_cluster_once_more(monkeypatch, capsys):
    from parlab.course import lab06
    launch, calls = _crashing_launch(failures=1)
    monkeypatch.setattr(lab06, "launch", launch)
    assert lab06.run_tf_cluster(chunks=1) == {"trained": True} and len(calls) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "crashed in TensorFlow's own code (killed by SIGSEGV)" in out
    assert "once more, in a fresh process" in out


def test_lab06_fails_on_a_second_crash_and_on_any_other_error(monkeypatch):
    from parlab.course import lab06
    launch, calls = _crashing_launch(failures=2)
    monkeypatch.setattr(lab06, "launch", launch)
    with pytest.raises(WorkerError, match="inside tensorflow's own code"):
        lab06.run_tf_cluster(chunks=1)
    assert len(calls) == 2

    def failing(fn, world_size, **kwargs):
        calls.append(kwargs)
        raise WorkerError(0, 1, "ValueError: bad learning rate", "Traceback ...")
    calls.clear()
    monkeypatch.setattr(lab06, "launch", failing)
    with pytest.raises(WorkerError, match="bad learning rate"):
        lab06.run_tf_cluster(chunks=1)
    assert len(calls) == 1                          # the course's own errors are not retried
