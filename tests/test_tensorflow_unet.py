"""Lab 15 in TensorFlow: the U-Net under MirroredStrategy with Keras fit and under
MultiWorkerMirroredStrategy (two processes, TF_CONFIG), each equal to one device. Run in
a fresh process: TensorFlow fixes its devices at its first operation."""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow   # TensorFlow: make test runs it, make test-fast leaves it out

pytest.importorskip("tensorflow")


def test_mirrored_fit_and_two_workers_equal_one_device():
    code = """
        import numpy as np, parlab
        from dataclasses import replace
        from parlab.course import lab15
        devs = parlab.devices(2, framework="tf")
        cfg = replace(lab15.CFG, steps=3)
        runs = lab15.run_tf_mirrored_fit(devs, cfg)
        one, mirrored = runs["one"], runs["mirrored"]
        assert mirrored["replicas"] == 2 and len(one["losses"]) == 3
        np.testing.assert_allclose(mirrored["losses"], one["losses"], rtol=1e-5)
        assert lab15.weight_difference(one["weights"], mirrored["weights"]) < 1e-5
        mw = lab15.run_tf_multi_worker(runs["initial_weights"], cfg)
        a, b = mw.results
        assert [w["tf_config"]["task"]["index"] for w in (a, b)] == [0, 1]
        assert a["tf_config"]["cluster"] == b["tf_config"]["cluster"]
        np.testing.assert_allclose(np.add(a["losses"], b["losses"]), one["losses"], rtol=1e-5)
        assert lab15.weight_difference(a["weights"], one["weights"]) < 1e-5
        assert all(np.array_equal(x, y) for x, y in zip(a["weights"], b["weights"]))
        # the weighted loss learns something: the steps' losses are not all the first
        assert len(set(np.round(one["losses"], 4))) == 3
        print("ok")
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
