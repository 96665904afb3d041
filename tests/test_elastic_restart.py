"""Elastic restart: a rank is killed (SIGKILL) after step 5 of 6, checkpoints every 2
steps; the job starts again, resumes from step 4's checkpoint, loses one step, and ends
with the weights of a run that was never interrupted. Once under torchrun
(``--max-restarts 1``), once with the course's launcher (``launch_with_restarts``)."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import parlab
from parlab.errors import WorkerError
from parlab.metrics import max_difference
from parlab.restarts import launch_with_restarts

torch = pytest.importorskip("torch")
from parlab.torch import checkpoint as ck, elastic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CFG = ck.Config()
STEPS, EVERY, KILL_RANK, KILL_STEP = 6, 2, 1, 5
RESUMED_FROM = KILL_STEP // EVERY * EVERY     # the newest checkpoint the killed run left
TOL = 1e-5
TIMEOUT = 60


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Rank 0's result of the same run on 2 ranks, never stopped."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    kwargs = {"steps": STEPS, "every": EVERY, "folder": str(folder)}
    return parlab.launch(ck.train, 2, args=(CFG,), kwargs=kwargs, timeout=TIMEOUT).results[0]


def _listeners(root: psutil.Process, seen: dict) -> None:
    """Record (address -> who) for every listening TCP socket of ``root``'s process tree;
    who is "agent" for torchrun itself, else the worker's RANK."""
    try:
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            who = "agent" if p.pid == root.pid else f"rank {p.environ().get('RANK', '?')}"
            for c in p.net_connections("tcp"):
                if c.status == psutil.CONN_LISTEN:
                    seen[f"{c.laddr.ip}:{c.laddr.port}"] = who
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def _run_torchrun(torchrun: Path, folder: Path, timeout_s: float = 180):
    args = [dataclasses.asdict(CFG), STEPS, EVERY, str(folder),
            KILL_RANK, KILL_STEP]
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           # gloo listens on the interface it is given (else on the host name's address)
           "GLOO_SOCKET_IFNAME": "lo",
           # By default the restarted workers share torchrun's rendezvous store with the
           # first attempt's, whose stale gloo addresses they may read: the second
           # attempt then fails to connect ("Connection refused"), 2 runs in 5 here.
           # Unshared, rank 0 of each attempt hosts a new store (pytorch issue #135712).
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    cmd = [str(torchrun), "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
           "--max-restarts", "1", "-m", "parlab", "run",
           "parlab.torch.elastic:train_elastic", "--args", json.dumps(args)]
    # its own process group: on a timeout the agent and every worker are killed together
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=folder.parent, start_new_session=True)
    seen, done = {}, threading.Event()

    def watch():
        root = psutil.Process(proc.pid)
        while not done.is_set():
            _listeners(root, seen)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun still running after {timeout_s} s: {err[-3000:]}")
    finally:
        done.set()
        watcher.join()
    return proc.returncode, out, err, seen


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun test: Linux only")
def test_torchrun_restarts_the_killed_job_from_the_last_checkpoint(
        uninterrupted, tmp_path, no_leftover_ranks):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this python")
    folder = tmp_path / "ckpt"
    t0 = time.monotonic()
    rc, out, err, seen = _run_torchrun(torchrun, folder)
    wall = time.monotonic() - t0
    assert rc == 0, err[-4000:]
    # attempt 0: rank 1 was killed by SIGKILL; attempt 1 ran through
    assert f"exitcode: -9) local_rank: {KILL_RANK}" in err, err[-4000:]
    line = next(ln for ln in out.splitlines() if ln.startswith('{"results"'))
    results = json.loads(line)["results"]
    assert [r["attempt"] for r in results] == [1, 1]
    assert [r["start"] for r in results] == [RESUMED_FROM] * 2
    assert [s for s, _ in results[0]["losses"]] == list(range(RESUMED_FROM + 1, STEPS + 1))
    written = sorted(p.name for p in folder.glob("result-attempt*"))
    assert written == ["result-attempt1.json", "result-attempt1.npz"]   # attempt 0 never ended
    assert ck.latest(folder).name == ck.step_name(STEPS)

    final = dict(np.load(folder / "result-attempt1.npz"))
    assert max_difference(final, uninterrupted["state"]) < TOL
    want = dict(uninterrupted["losses"])
    for step, loss in results[0]["losses"]:
        assert abs(loss - want[step]) < TOL
    lost = KILL_STEP - RESUMED_FROM
    print(f"\ntorchrun: rank {KILL_RANK} killed after step {KILL_STEP}; attempt 1 resumed "
          f"from step {RESUMED_FROM}'s checkpoint, {lost} step(s) lost; {wall:.1f} s")

    # gloo's sockets are on the loopback; torchrun's c10d stores (TCPStore) listen on every
    # interface, whatever host they are given: the agent's and each attempt's rank 0's
    print(f"listening: {seen}")
    wide = {a: who for a, who in seen.items() if not a.startswith(("127.", "::1"))}
    assert set(wide.values()) <= {"agent", "rank 0"}, wide


def test_the_launcher_restarts_after_a_rank_dies_and_resumes(
        uninterrupted, tmp_path, no_leftover_ranks):
    kwargs = {"kill_rank": KILL_RANK, "kill_step": KILL_STEP, "folder": str(tmp_path),
              "steps": STEPS, "every": EVERY}
    t0 = time.monotonic()
    out, attempts = launch_with_restarts(elastic.train_killed_once, 2, restarts=1,
                                         args=(CFG,), kwargs=kwargs, timeout=TIMEOUT)
    wall = time.monotonic() - t0
    assert len(attempts) == 1 and attempts[0].startswith(f"rank {KILL_RANK} of 2: "), attempts
    assert "SIGKILL" in attempts[0], attempts
    assert (tmp_path / elastic.MARKER).exists()
    for r in out.results:
        assert r["start"] == RESUMED_FROM
        assert [s for s, _ in r["losses"]] == list(range(RESUMED_FROM + 1, STEPS + 1))
        assert max_difference(r["state"], uninterrupted["state"]) < TOL
    print(f"\nlaunch_with_restarts: {attempts[0]}; resumed from step {RESUMED_FROM}, "
          f"{KILL_STEP - RESUMED_FROM} step(s) lost; {wall:.1f} s")


def test_without_restarts_the_dead_rank_is_named(tmp_path, no_leftover_ranks):
    kwargs = {"kill_rank": KILL_RANK, "kill_step": KILL_STEP, "folder": str(tmp_path),
              "steps": STEPS, "every": EVERY}
    with pytest.raises(WorkerError) as err:
        launch_with_restarts(elastic.train_killed_once, 2, restarts=0, args=(CFG,),
                             kwargs=kwargs, timeout=TIMEOUT)
    assert err.value.rank == KILL_RANK
    notes = " ".join(getattr(err.value, "__notes__", []))
    assert "1 attempt(s) made (restarts=0)" in notes and "SIGKILL" in notes, notes
    assert ck.latest(tmp_path).name == ck.step_name(RESUMED_FROM)


def test_restarts_must_be_a_count():
    with pytest.raises(ValueError, match="restarts= must be a whole number >= 0"):
        launch_with_restarts(elastic.train_killed_once, 2, restarts=-1)
