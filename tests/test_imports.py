import subprocess
import sys

import parlab


def test_import_parlab_imports_no_framework():
    code = ("import sys, parlab\n"
            "parlab.span, parlab.Timeline, parlab.plot, parlab.metrics, parlab.exercises\n"
            "parlab.data.digits, parlab.split.balance\n"
            "print('torch' in sys.modules, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_public_api_is_sorted_and_functions_stay_functions():
    import parlab.hardware  # noqa: F401 - importing submodules must not shadow the API
    import parlab.launcher  # noqa: F401
    assert parlab.__all__ == sorted(parlab.__all__)
    assert callable(parlab.devices) and callable(parlab.launch) and callable(parlab.span)
    for name in parlab.__all__:
        assert getattr(parlab, name) is not None


def test_every_public_name_resolves_in_a_fresh_process():
    code = "import parlab\nfor n in parlab.__all__: getattr(parlab, n)\nprint('OK')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-2000:]
