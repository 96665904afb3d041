"""Two nodes on one machine (parlab.two_nodes): four ranks, two in each of two network
namespaces, torchrun in each under a hostname of its own; the link between the nodes is
shaped to 100 Mbit/s, each node's loopback (its ranks' link) to 800 Mbit/s.

The course's hierarchical all-reduce (parlab.torch.two_tier) trains on them: it must end
with the weights of one device, and its timeline must show the slow link: each tier's
rate, from the spans, near what the shaper allows. Afterwards nothing of the run may
remain, after a failed run neither. Needs Linux and root (CI runs as root); skipped with
the reason elsewhere.
"""
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path

import pytest

from parlab import two_nodes
from parlab.metrics import max_difference
from parlab.spans import COMM, Span
from parlab.timeline import Timeline
from parlab.two_nodes import NodeFailed, TwoNodes

torch = pytest.importorskip("torch")
from parlab.torch.data_parallel import train_single  # noqa: E402

BETWEEN_MBIT, INSIDE_MBIT = 100, 800
# The MLP's gradient is the message: 598,538 floats, 2.4 MB. The slow link carries
# 2.4 MB a step (190 ms at 100 Mbit/s), each node's loopback 7.2 MB (72 ms at 800):
# long enough that the shaper sets the times, not 2 cores under load (unshaped, the
# same loopback phases ran at 3-5 Gbit/s here).
SIZES = [64, 1024, 512, 10]
STEPS, GLOBAL_BATCH, LR = 6, 64, 0.1
TOL = 1e-5
MBIT = 8 / 1e6                   # bytes/s -> Mbit/s
TOUCH_S = 1e-6                   # pieces of one call meet; rounding in the trace's microseconds


@pytest.fixture(scope="module")
def here():
    ok, why = two_nodes.available()
    if not ok:
        pytest.skip(why)


def _tx_bytes(netns: str, dev: str) -> int:
    """Bytes the interface has sent (its shaper's output), from the kernel's counters."""
    out = subprocess.run(["ip", "-n", netns, "-s", "-j", "link", "show", "dev", dev],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["stats64"]["tx"]["bytes"]


def _marked(veth: str) -> list[int]:
    """Live processes started by the run: each inherits GLOO_SOCKET_IFNAME=<its veth>."""
    needle = f"\0GLOO_SOCKET_IFNAME={veth}\0".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                if needle in b"\0" + fh.read():
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _remains(built: list[tuple[str, str]]) -> list[str]:
    """What is left of a run's namespaces, cable, /etc/netns folders and processes."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left = []
    for netns, veth in built:
        left += [f"namespace {netns}"] * (netns in listed.split())
        left += [f"/etc/netns/{netns}"] * (Path("/etc/netns", netns).exists())
        left += [f"interface {veth}"] * (veth in links)
        left += [f"process {pid}" for pid in _marked(veth)]
    return left


class _Watch:
    """Every 50 ms, which network namespace each process of the run is in."""

    def __init__(self, built):
        self.built, self.seen, self.done = built, {}, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self.done.is_set():
            for _, veth in self.built:
                for pid in _marked(veth):
                    try:
                        self.seen[pid] = os.stat(f"/proc/{pid}/ns/net").st_ino
                    except OSError:
                        pass
            time.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


@pytest.fixture(scope="module")
def trained(here):
    """The hierarchical all-reduce trains on the two nodes, once for the module."""
    with TwoNodes(between_mbit=BETWEEN_MBIT, inside_mbit=INSIDE_MBIT) as nodes:
        built = [(n.netns, n.veth) for n in nodes.nodes]
        inodes = {os.stat(f"/run/netns/{netns}").st_ino for netns, _ in built}
        a = nodes.nodes[0]
        before = _tx_bytes(a.netns, a.veth), _tx_bytes(a.netns, "lo")
        with _Watch(built) as watch:
            run = nodes.run("parlab.torch.two_tier:train_two_tier",
                            ["hierarchical", 2, 16, STEPS, GLOBAL_BATCH, LR, SIZES])
        after = _tx_bytes(a.netns, a.veth), _tx_bytes(a.netns, "lo")
    print(f"\ntwo nodes: {len(run.results)} ranks in {run.seconds:.1f} s on {run.hostnames}")
    return {"run": run, "built": built, "left": _remains(built), "inodes": inodes,
            "seen": watch.seen, "sent": [y - x for x, y in zip(before, after)]}


@pytest.mark.slow
def test_four_ranks_on_two_hosts_train_as_one_device(trained):
    run = trained["run"]
    assert run.hostnames == ["node-a", "node-a", "node-b", "node-b"], run.hostnames
    assert len(run.results) == 4
    one = train_single("mlp", GLOBAL_BATCH, STEPS, LR, sizes=SIZES)
    for rank, result in enumerate(run.results):
        assert len(result["losses"]) == STEPS
        assert max_difference(result["state"], one["state"]) < TOL, rank
    for letter, cmd in run.commands.items():
        assert "unshare --uts" in cmd and f"node-{letter}" in cmd and "torchrun" in cmd


@pytest.mark.slow
def test_every_process_of_the_run_was_inside_its_namespaces(trained):
    # what they listened on was there too: nothing of the run reached this machine's network
    assert trained["seen"], "the watch saw no process of the run"
    outside = {pid: ino for pid, ino in trained["seen"].items() if ino not in trained["inodes"]}
    assert not outside, outside


def _calls(timeline: Timeline, name: str) -> dict[int, list[tuple[float, float]]]:
    """Rank -> (start, end) of each call of the collective ``name``: the timeline draws a
    call as pieces (waiting for the last peer, transfer, waiting for a core), rejoined."""
    out = {}
    for r in timeline.ranks:
        pieces = sorted((s.start, s.end) for s in timeline.spans if s.rank == r
                        and s.name in (name, f"{name} (core wait)"))
        calls = []
        for start, end in pieces:
            if calls and start <= calls[-1][1] + TOUCH_S:
                calls[-1] = (calls[-1][0], max(calls[-1][1], end))
            else:
                calls.append((start, end))
        out[r] = calls
    return out


def _transfer_s(calls, ranks, step: int) -> float:
    """From the last of ``ranks`` arriving at the call to the last leaving it: the time
    the data moved, once all could send (the timeline's own split of wait and transfer,
    over every rank that shares the shaped device)."""
    return (max(calls[r][step][1] for r in ranks) - max(calls[r][step][0] for r in ranks))


def tier_rates(timeline: Timeline) -> tuple[list[float], list[float]]:
    """Mbit/s of the link between the nodes and of the links inside them, each step but
    the first (connections warm up), from the spans and what gloo puts on the wire.

    S, the gradient, is what each rank hands its reduce-scatter (``bytes`` of its span).
    Per step, on 2 nodes of 2 ranks (gloo, torch 2.13; the interfaces' counters agree,
    see the test below):

    * reduce-scatter inside a node: each rank sends S (gloo's moves what an all-reduce
      would), 2S through the node's loopback, whose one shaper takes both directions;
    * all-reduce across, of each rank's S/2 chunk, with the rank of the same local index
      on the other node: a ring of two, each sends its whole chunk; both pairs share the
      cable, so each direction carries S (each direction has a shaper of its own);
    * all-gather inside: each rank sends its S/2 chunk, S through the loopback.
    """
    size = statistics.median(s.bytes for s in timeline.spans if s.kind == COMM
                             and s.name == "reduce_scatter (inside)")
    rs, across, ag = (_calls(timeline, n) for n in
                      ("reduce_scatter (inside)", "all_reduce (across)", "all_gather (inside)"))
    between, inside = [], []
    for k in range(1, len(rs[0])):
        between.append(size / _transfer_s(across, (0, 1, 2, 3), k) * MBIT)
        for node in ((0, 1), (2, 3)):
            seconds = _transfer_s(rs, node, k) + _transfer_s(ag, node, k)
            inside.append(3 * size / seconds * MBIT)
    return between, inside


@pytest.mark.slow
def test_the_link_between_the_nodes_is_the_slow_one(trained):
    between, inside = tier_rates(trained["run"].timeline)
    across_mbit, inside_mbit = statistics.median(between), statistics.median(inside)
    print(f"\nacross {across_mbit:.0f} Mbit/s (shaped {BETWEEN_MBIT}), inside "
          f"{inside_mbit:.0f} Mbit/s (shaped {INSIDE_MBIT}), ratio "
          f"{inside_mbit / across_mbit:.1f}; per step: across {[round(x) for x in between]}"
          f", inside {[round(x) for x in inside]}")
    # measured here (2 cores): across 92-96, inside 790-830, ratio 8.3-8.9, quiet and
    # beside two busy loops alike; the bands leave room for a busier machine
    assert 0.3 * BETWEEN_MBIT < across_mbit < 1.2 * BETWEEN_MBIT
    assert inside_mbit / across_mbit > 3


@pytest.mark.slow
def test_the_interfaces_carried_the_bytes_the_rates_assume(trained):
    size = sum(v.size * v.itemsize for v in trained["run"].results[0]["state"].values())
    cable, loopback = trained["sent"]       # node a's, over the whole run
    # model: the cable S a step, the loopback 3S; beyond that, packet headers (4.6% on the
    # cable's 1500-byte packets), start-up, and rank 1's result sent to rank 0 (S)
    print(f"\nnode a sent {cable / 1e6:.1f} MB on the cable, {loopback / 1e6:.1f} MB on its "
          f"loopback; S = {size / 1e6:.2f} MB, {STEPS} steps")
    assert STEPS * size < cable < 1.15 * STEPS * size
    assert 3 * STEPS * size < loopback < 1.15 * 3 * STEPS * size


@pytest.mark.slow
def test_nothing_of_the_run_remains(trained):
    assert trained["left"] == [], trained["left"]


@pytest.mark.slow
def test_a_failing_run_names_the_node_and_leaves_nothing(here, no_leftover_ranks):
    # hello_allreduce(rank, world, n="x"): every rank raises, after torchrun's start-up
    with TwoNodes(nproc_per_node=1) as nodes:
        built = [(n.netns, n.veth) for n in nodes.nodes]
        t0 = time.monotonic()
        with pytest.raises(NodeFailed) as err:
            nodes.run("parlab.examples:hello_allreduce", ["x"], rendezvous="static",
                      timeout_s=120)
        seconds = time.monotonic() - t0
    text = str(err.value)
    assert err.value.node in ("a", "b") and f"node {err.value.node} (node-" in text, text
    assert "TypeError" in text, text[-2000:]     # the ranks' own error, in the tail
    assert _remains(built) == []
    print(f"\nthe failed run was stopped after {seconds:.1f} s")


@pytest.mark.slow
def test_leaving_the_block_by_an_exception_removes_everything(here):
    with pytest.raises(KeyboardInterrupt):
        with TwoNodes() as nodes:
            built = [(n.netns, n.veth) for n in nodes.nodes]
            assert _remains(built) == [f"namespace {built[0][0]}", f"/etc/netns/{built[0][0]}",
                                       f"namespace {built[1][0]}", f"/etc/netns/{built[1][0]}"]
            raise KeyboardInterrupt
    assert _remains(built) == []


@pytest.mark.parametrize("kwargs, says", [
    ({"between_mbit": 0}, "between_mbit must be a rate in Mbit/s above 0"),
    ({"inside_mbit": -5}, "inside_mbit must be a rate in Mbit/s above 0"),
    ({"between_mbit": float("nan")}, "between_mbit must be"),
    ({"inside_mbit": "800"}, "inside_mbit must be"),
    ({"nproc_per_node": 0}, "nproc_per_node must be a whole number >= 1"),
    ({"nproc_per_node": True}, "nproc_per_node must be a whole number >= 1"),
])
def test_bad_settings_are_named(kwargs, says):
    with pytest.raises(ValueError, match=says):
        TwoNodes(**kwargs)


def test_running_outside_the_block_says_how():
    with pytest.raises(RuntimeError, match="with TwoNodes"):
        TwoNodes().run("parlab.examples:hello_allreduce")


@pytest.mark.parametrize("target, args, kwargs, says", [
    ("hello_allreduce", [], {}, "target must be 'MODULE:FUNCTION'"),
    ("parlab.no_such_module:f", [], {}, "cannot import 'parlab.no_such_module'"),
    ("parlab.examples:no_such_function", [], {}, "has no function 'no_such_function'"),
    ("parlab.examples:hello_allreduce", [object()], {}, "args must be a list of JSON"),
    ("parlab.examples:hello_allreduce", [], {"timeout_s": 0}, "timeout_s must be"),
    ("parlab.examples:hello_allreduce", [], {"rendezvous": "etcd"}, "'c10d' or 'static'"),
])
def test_bad_runs_fail_before_anything_starts(here, target, args, kwargs, says):
    with TwoNodes() as nodes:
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=says):
            nodes.run(target, args, **kwargs)
        assert time.monotonic() - t0 < 5
        assert not any(_marked(n.veth) for n in nodes.nodes)


def test_the_command_line_names_a_bad_flag(capsys):
    for argv, says in ((["nocolon"], "target must be 'MODULE:FUNCTION'"),
                       (["parlab.examples:hello_allreduce", "--args", "{"], "--args must be"),
                       (["parlab.examples:hello_allreduce", "--between-mbit", "0"],
                        "between_mbit must be a rate")):
        with pytest.raises(SystemExit) as exit_:
            two_nodes.main(argv)
        assert exit_.value.code == 2
        assert says in capsys.readouterr().err


def test_a_timeline_reads_back_from_its_chrome_trace(tmp_path):
    spans = [Span(0, "compute", "forward", 1.0, 1.5), Span(0, COMM, "all_reduce", 1.5, 2.0,
                                                          4096, None, "across"),
             Span(1, "wait", "recv", 1.2, 1.8, 0, 0), Span(1, COMM, "recv", 1.8, 2.0, 64, 0)]
    original = Timeline(spans, {0: "rank 0 · node-a cpu", 1: "rank 1 · node-b cpu"})
    back = Timeline.from_chrome_trace(original.to_chrome_trace(tmp_path / "t.json"))
    assert back.labels == original.labels and back.ranks == original.ranks
    assert len(back.spans) == len(original.spans)
    for a, b in zip(original.spans, back.spans):
        assert (a.rank, a.kind, a.name, a.bytes, a.peer, a.axis) == \
               (b.rank, b.kind, b.name, b.bytes, b.peer, b.axis)
        assert abs((a.start - original.start) - b.start) < 1e-9
        assert abs(a.duration - b.duration) < 1e-9


def test_results_files_hold_arrays_exactly():
    # `parlab run --results` writes them (TwoNodes.run reads them back to compare states)
    import numpy as np
    from parlab.__main__ import _in_full
    state = {"w": np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32),
             "step": np.int64(7), "ints": np.arange(4, dtype=np.int16)}
    back = json.loads(json.dumps({"results": [state]}, default=_in_full),
                      object_hook=two_nodes._arrays)["results"][0]
    assert back["step"] == 7
    for k in ("w", "ints"):
        assert back[k].dtype == state[k].dtype and np.array_equal(back[k], state[k])
