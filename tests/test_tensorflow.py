"""TensorFlow parts, each run in a fresh process: TF fixes its devices at its first op."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parlab.experiments import run_tf_cluster

pytestmark = pytest.mark.slow   # TensorFlow: make test runs it, make test-fast leaves it out

pytest.importorskip("tensorflow")


def _run(code: str, timeout: int = 240) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_tf_split_on_logical_devices_equals_the_unsplit_model():
    out = _run("""
        import numpy as np, parlab
        devs = parlab.devices(4, framework="tf")
        from parlab.tf import split
        from parlab.split import SplitConfig
        ref = split.train(SplitConfig(steps=5), devs.names[:1])
        for bounds in ([2], [1, 2, 3]):
            n = len(bounds) + 1
            got = split.train(SplitConfig(steps=5, bounds=bounds), devs.names[:n], timeline=True)
            for a, b in zip(ref["first_grads"], got["first_grads"]):
                np.testing.assert_allclose(a, b, atol=1e-6)
            np.testing.assert_allclose(ref["first_logits"], got["first_logits"], atol=1e-6)
            for a, b in zip(ref["weights"], got["weights"]):
                np.testing.assert_allclose(a, b, atol=1e-6)
            placed = sorted(set(got["placement"].values()))
            assert placed == list(devs.names[:n]), placed
            sizes = got["bytes_per_device"]
            assert sum(sizes.values()) == sum(ref["bytes_per_device"].values())
            assert max(sizes.values()) < sum(sizes.values())
            assert got["timeline"].ranks == list(range(n + 1))
        print("OK")
    """)
    assert "OK" in out


def test_tf_models_learn_and_both_training_paths_work():
    out = _run("""
        import numpy as np, parlab
        parlab.devices(1, framework="tf")
        from parlab import data
        from parlab.tf import models, single
        x, y = data.digits("train"); xt, yt = data.digits("test")
        h = single.train_custom(models.mlp(), x, y, epochs=3, x_test=xt, y_test=yt, progress=False)
        assert h["test_accuracy"][-1] > 0.85, h["test_accuracy"]
        f = single.train_fit(models.mlp(), x, y, epochs=3, x_test=xt, y_test=yt, verbose=0)
        assert f["val_accuracy"][-1] > 0.85, f
        tl = single.step_timeline(models.mlp(), x, y, steps=2)
        assert [s.name for s in tl if s.kind != "core_wait"][:4] == ["data", "forward", "backward", "update"]
        est = single.memory_estimate(models.mlp(), 64)
        assert est["parameters"] == models.mlp().count_params() * 4
        xi, _ = data.digits("train", flat=False)
        assert models.cnn()(np.transpose(xi[:2], (0, 2, 3, 1))).shape == (2, 10)
        xw, _ = data.waves(2)
        assert models.deep_lstm(layers_=2, hidden=8)(xw).shape == (2, 4)
        xs, _ = data.shapes(2)
        assert models.unet(4)(np.transpose(xs, (0, 2, 3, 1))).shape == (2, 32, 32, 3)
        print("OK")
    """)
    assert "OK" in out


def test_tf_column_and_row_slices_equal_the_dense_layer():
    out = _run("""
        import numpy as np, parlab
        devs = parlab.devices(2, framework="tf")
        import tensorflow as tf, keras
        from parlab.tf import tensor_parallel as ttp
        tf.random.set_seed(0)
        x = tf.random.normal((4, 8))
        l1, l2 = keras.layers.Dense(10), keras.layers.Dense(3)
        l1.build((None, 8)); l2.build((None, 10))
        dense = l1(x)
        y, where = ttp.column_parallel(x, l1.kernel, l1.bias, devs.names)
        assert np.allclose(y, dense, atol=1e-5) and [w[-5:] for w in where] == ["CPU:0", "CPU:1"]
        y, where = ttp.row_parallel(x, l1.kernel, l1.bias, devs.names)
        assert np.allclose(y, dense, atol=1e-5) and [w[-5:] for w in where] == ["CPU:0", "CPU:1"]
        pair = ttp.column_row_pair(x, l1.kernel, l1.bias, l2.kernel, l2.bias, devs.names)
        assert np.allclose(pair, l2(tf.nn.relu(dense)), atol=1e-5)
        try:
            ttp.column_parallel(x, l1.kernel, l1.bias, ["/device:CPU:0"] * 3)
        except ValueError as e:
            assert "10 units" in str(e)
        else:
            raise AssertionError("an uneven split must be refused")
        print("OK")
    """)
    assert "OK" in out


def test_tf_lstm_stack_placed_on_logical_devices():
    out = _run("""
        import numpy as np, parlab
        devs = parlab.devices(2, framework="tf")
        import tensorflow as tf
        from parlab import data
        from parlab.tf import pipeline as tpl
        x = tf.constant(data.waves(8, 12)[0])
        placed = tpl.build_stack(4, 16, devs.names)
        one = tpl.build_stack(4, 16, devs.names[:1])
        from parlab.tf.split import device_of
        devices = [device_of(l.trainable_variables[0]) for l in placed]
        assert devices == [devs.names[0], devs.names[1], devs.names[0], devs.names[1]], devices
        res = tpl.timed(placed, devs.names, x, repeats=1)
        ref = tpl.forward(one, devs.names[:1], x).numpy()
        for r in res.values():
            np.testing.assert_allclose(r["y"], ref, atol=1e-5)
            assert r["seconds"] > 0
        print("OK")
    """)
    assert "OK" in out


def test_tf_mirrored_strategy_step_equals_one_device():
    out = _run("""
        import parlab
        devs = parlab.devices(2, framework="tf")
        from parlab.tf import data_parallel as tf_dp
        eq = tf_dp.one_step_equivalence(devs.names, global_batch=32)
        assert eq["replicas"] == 2 and eq["rows per replica"] == [16, 16], eq
        assert eq["max weight difference"] < 1e-5, eq
        assert [d[-5:] for d in eq["copies of the first kernel"]] == ["CPU:0", "CPU:1"]
        print("OK")
    """)
    assert "OK" in out


def test_tf_multi_worker_mirrored_trains_identical_workers_and_leaves_none(no_leftover_ranks):
    import numpy as np
    import psutil

    import parlab
    from parlab.tf import data_parallel as tf_dp  # the workers import TensorFlow in their own processes
    from parlab.tf.cluster import free_ports
    ports = free_ports(2)
    out = parlab.launch(tf_dp.multi_worker, 2, args=(ports, 10), process_group=False,
                        timeout=180, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    a, b = out.results
    assert a["tf_config"]["task"]["index"] == 0 and b["tf_config"]["task"]["index"] == 1
    assert a["tf_config"]["cluster"]["worker"] == [f"127.0.0.1:{p}" for p in ports]
    assert all(np.array_equal(x, y) for x, y in zip(a["weights"], b["weights"]))
    assert a["losses"][-1] < a["losses"][0]
    assert not any(psutil.pid_exists(r["pid"]) and psutil.Process(r["pid"]).status() != psutil.STATUS_ZOMBIE
                   for r in out.results)


def test_central_storage_keeps_one_copy_and_equals_one_device():
    out = _run("""
        import parlab
        devs = parlab.devices(3, framework="tf")
        from parlab.tf import central_storage as tf_cs, data_parallel as tf_dp
        strategy = tf_cs.central_storage(devs.names[1:], parameter_device=devs.names[0])
        eq = tf_dp.strategy_step_equivalence(strategy, global_batch=64)
        assert eq["max weight difference"] < 1e-5, eq
        assert eq["replicas"] == 2 and eq["rows per replica"] == [32, 32], eq
        assert len(eq["copies of the first kernel"]) == 1, eq
        assert eq["copies of the first kernel"][0].endswith("CPU:0"), eq
        print("OK")
    """)
    assert "OK" in out


MARK = {"PARLAB_TEST_CLUSTER": str(os.getpid())}   # inherited by every process of the cluster


def _spawned_alive(before: set) -> list:
    """Processes of this test's clusters (they carry MARK) started since ``before``, alive.

    Marked rather than machine-wide: other programs on a shared machine start processes too.
    """
    import psutil
    alive = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["pid"] in before or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            marked = proc.environ().get("PARLAB_TEST_CLUSTER") == MARK["PARLAB_TEST_CLUSTER"]
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if marked:
            alive.append(" ".join(proc.info["cmdline"] or []))
    return alive


def test_parameter_server_strategy_in_process_cluster(no_leftover_ranks):
    import psutil

    report = run_tf_cluster(num_workers=2, chunks=3, steps_per_chunk=20)
    assert report["variable device"].startswith("/job:ps/")
    assert all(a.startswith("127.0.0.1:") for kind in report["cluster"].values() for a in kind)
    progress = report["progress"]
    assert progress[-1]["steps run"] == 60 and progress[-1]["mean loss"] < progress[0]["mean loss"]
    # no worker died: the server counted each step's loss exactly once
    assert [p["step runs counted on the server"] for p in progress] == [20, 20, 20]
    assert not psutil.pid_exists(report["coordinator pid"])


def test_parameter_server_strategy_survives_a_dead_worker_and_cleans_up(no_leftover_ranks):
    import psutil

    before = set(psutil.pids())
    report = run_tf_cluster(num_workers=2, chunks=4, steps_per_chunk=20,
                            workers_in_process=False, kill_worker=1, kill_after_chunk=1, env=MARK)
    last = report["progress"][-1]
    assert report["progress"][1]["worker killed here"] and last["workers alive"] == 1
    assert last["steps run"] == last["steps scheduled"] == 80
    # a step lost with the worker may run twice (at least once), never less than once
    assert all(p["step runs counted on the server"] >= 20 for p in report["progress"])
    assert last["mean loss"] < report["progress"][0]["mean loss"]
    assert not [p for p in report["server pids"] + [report["coordinator pid"]] if psutil.pid_exists(p)]
    assert not _spawned_alive(before)
    # TensorFlow's gRPC complaints went to a file, summarised in one line (lab 06 prints it)
    errors = report["errors"]
    assert errors["lines"] > 0 and "worker 1" in errors["summary"] and errors["log"] in errors["summary"]
    assert "UnavailableError" in Path(errors["log"]).read_text()


def test_a_failing_coordinator_takes_its_servers_down(no_leftover_ranks):
    import psutil

    import parlab
    from parlab.tf import parameter_server as tf_ps
    before = set(psutil.pids())
    # lr is checked by Keras only after the worker processes are up
    with pytest.raises(parlab.WorkerError, match="learning_rate"):
        run_tf_cluster(num_workers=2, chunks=1, workers_in_process=False, lr="fast", env=MARK)
    assert not _spawned_alive(before)
    with pytest.raises(ValueError, match="workers_in_process=False"):
        tf_ps.cluster_training(0, 1, kill_worker=0)
    with pytest.raises(ValueError, match="only worker"):
        tf_ps.cluster_training(0, 1, num_workers=1, kill_worker=0, workers_in_process=False)
