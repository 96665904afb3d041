"""Without a GPU the GPU-only parts say so in one line and succeed."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible: "
                                "tests/test_gpu.py covers this machine")


def test_gpu_benchmark_lines_are_one_line_saying_no_gpu():
    from parlab.bench import labs as bench
    lines = bench.gpu_lines()
    assert len(lines) == 1 and lines[0].startswith("no GPU: skipped")


def test_the_gpu_test_run_prints_one_line_and_succeeds():
    out = subprocess.run(["bash", str(ROOT / "scripts" / "test-gpu.sh")], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0], out.stdout
