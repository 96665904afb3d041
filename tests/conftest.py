import os

os.environ.setdefault("MPLBACKEND", "Agg")

import psutil  # noqa: E402
import pytest  # noqa: E402


def rank_processes():
    """Our live descendants, minus multiprocessing's one shared resource tracker."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if "resource_tracker" in " ".join(child.cmdline()):
                continue
            out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture
def no_leftover_ranks():
    """Fail the test if any rank process outlives it."""
    yield
    left = rank_processes()
    assert not left, f"processes left running: {[p.cmdline() for p in left]}"
