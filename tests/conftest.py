import signal

import matplotlib
import psutil
import pytest

# Figures the tests draw go nowhere. Set for this process only, not through MPLBACKEND:
# the kernels nbval starts inherit the environment, and must draw the labs' inline figures
# (the browser test shows them: see ../conftest.py).
matplotlib.use("Agg")

# The tests that press Ctrl-C need it delivered. A shell ignores SIGINT in a command it
# runs in the background (`make test &`), Python keeps an inherited "ignore", and so do
# the scripts the tests start: the launcher's interrupt tests would then hang or fail.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def rank_processes():
    """Our live descendants, minus multiprocessing's shared resource tracker and the fork
    server ranks start from (each lives as long as this process)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            command = " ".join(child.cmdline())
            if "resource_tracker" in command or "multiprocessing.forkserver" in command:
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
