"""Two nodes on one machine, joined by a slow link: torchrun across two network namespaces.

A cluster's nodes talk over a network far slower than the links inside a node. Linux
can build that on one machine: two network namespaces (each with its own interfaces,
addresses and ports, as a separate machine has), a virtual cable between them (a veth
pair), and a token-bucket shaper (``tc ... tbf``) on the cable and on each namespace's
loopback. ``torchrun`` then runs in each namespace under a hostname of its own, as on two
machines::

    with TwoNodes(between_mbit=100, inside_mbit=800) as nodes:
        run = nodes.run("parlab.examples:hello_allreduce")
    run.results, run.hostnames, run.timeline, run.commands

or ``python -m parlab.two_nodes parlab.examples:hello_allreduce``. It needs Linux, root,
``ip``, ``tc``, ``unshare`` and ``hostname`` (``available()`` says what is missing).
All a run starts listens inside its namespaces; leaving the ``with`` block, even by an
error or Ctrl-C, stops every process of the run and removes namespaces, cable and their
``/etc/netns`` folders. What a process killed by SIGKILL left, the next TwoNodes removes.
docs/torchrun.md, "Two nodes on one machine", has the commands.
"""
from __future__ import annotations

import atexit
import base64
import ipaddress
import json
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from .errors import counted
from .launch_settings import MAX_TIMEOUT_S
from .timeline import Timeline

NETNS_ETC = Path("/etc/netns")        # `ip netns exec NS` mounts /etc/netns/NS/* over /etc/*
PREFIX = "parlab-"                    # namespaces: parlab-<pid>-<suffix>-a and -b
# a namespace of this module's: the pid that made it (alive or not) in its name
OURS = re.compile(rf"^{PREFIX}(?:probe-)?(\d+)-[0-9a-f]{{4}}(?:-[ab])?$")
ROOT = Path(__file__).resolve().parents[1]
# torchrun's rendezvous port on node A: the namespace is new, so nothing else holds it
RDZV_PORT = 29400
NODES = ("a", "b")
TAIL_CHARS = 3000                     # of each node's output, in an error
COMMAND_S = 20                        # for one `ip` or `tc` command


class NodeFailed(RuntimeError):
    """A node's torchrun exited with an error; the other node was stopped. ``node``: "a"
    or "b", the first to fail; ``outputs``: each node's (stdout, stderr)."""

    def __init__(self, message: str, node: str, outputs: dict):
        super().__init__(message)
        self.node, self.outputs = node, outputs


class NodesTimedOut(NodeFailed, TimeoutError):
    """A run was still going when its timeout ran out; both nodes were stopped."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip``/``tc`` (the first argument); on failure an error with its message."""
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=COMMAND_S)
    if check and done.returncode:
        raise OSError(f"`{shlex.join(args)}` failed: {done.stderr.strip() or done.returncode}")
    return done


def available() -> tuple[bool, str]:
    """Whether two nodes can be built here: (True, "") or (False, the reason in words)."""
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces are Linux's, this is {sys.platform}"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root (run as root, e.g. in CI)"
    missing = [t for t in ("ip", "tc", "unshare", "hostname") if shutil.which(t) is None]
    if missing:
        return False, (f"{', '.join(missing)} not found on PATH (packages iproute2, "
                       "util-linux, hostname)")
    probe = f"{PREFIX}probe-{os.getpid()}-{secrets.token_hex(2)}"
    try:
        _ip("ip", "netns", "add", probe)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"cannot create a network namespace here: {exc}"
    _ip("ip", "netns", "del", probe, check=False)
    return True, ""


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.0.0.0/8 that no address or route of this machine overlaps."""
    text = _ip("ip", "-o", "-4", "addr").stdout + _ip("ip", "-4", "route").stdout
    used = [ipaddress.ip_network(word, strict=False)
            for word in re.findall(r"\b\d+\.\d+\.\d+\.\d+(?:/\d+)?\b", text)]
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{1 + secrets.randbelow(254)}."
                                   f"{secrets.randbelow(256)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise OSError("no free /24 left in 10.0.0.0/8 on this machine")


def _burst_bytes(mbit: float, mtu: int) -> int:
    """The shaper's bucket: 2.5 ms at the rate, and never less than two packets (a packet
    larger than the bucket could never be sent; loopback's packets are 64 KiB)."""
    return max(int(mbit * 1e6 / 8 * 0.0025), 2 * mtu)


def _check_rate(value, what: str):
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not (math.isfinite(value) and value > 0)):
        raise ValueError(f"{what} must be a rate in Mbit/s above 0 (or None: unshaped), "
                         f"got {value!r}")
    return None if value is None else float(value)


@dataclass
class Node:
    """One namespace: its name, hostname, end of the cable and address."""

    letter: str
    netns: str
    hostname: str
    veth: str
    address: str


@dataclass
class TwoNodesRun:
    """What ``TwoNodes.run`` returns."""

    results: list                 # the rank function's result, per rank
    timeline: Timeline            # every rank's spans, read back from rank 0's trace
    seconds: float                # from starting torchrun on both nodes to both exiting
    commands: dict                # node letter -> the command line that ran there
    outputs: dict = field(repr=False)   # node letter -> (stdout, stderr)

    @property
    def hostnames(self) -> list[str]:
        """The hostname each rank ran on (from the timeline's labels)."""
        return [next(iter(re.findall(r"· (\S+) ", self.timeline.labels[r])), "?")
                for r in self.timeline.ranks]


_OPEN: "weakref.WeakSet[TwoNodes]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """A TwoNodes entered and never left (``__enter__`` called by hand, in a notebook whose
    kernel is shut down): remove what it built."""
    for nodes in list(_OPEN):
        nodes.close()


class TwoNodes:
    """Two network namespaces joined by a shaped veth pair; ``run`` runs torchrun in both.

    between_mbit: the cable's rate, each direction; inside_mbit: each namespace's
    loopback, which carries the traffic between ranks of one node (None: unshaped);
    nproc_per_node: ranks per node.
    """

    def __init__(self, between_mbit: float | None = 100, inside_mbit: float | None = 800,
                 nproc_per_node: int = 2):
        self.between_mbit = _check_rate(between_mbit, "between_mbit")
        self.inside_mbit = _check_rate(inside_mbit, "inside_mbit")
        self.nproc_per_node = counted(nproc_per_node, "nproc_per_node", 1,
                                      "the ranks on each node, e.g. nproc_per_node=2")
        self.nodes: list[Node] = []
        self.subnet = None

    # -- building and removing
    def __enter__(self) -> "TwoNodes":
        ok, why = available()
        if not ok:
            raise OSError(f"TwoNodes cannot run here: {why}")
        if self.nodes:
            raise RuntimeError("this TwoNodes is built already: enter it once")
        _OPEN.add(self)
        try:
            _remove_stale()
            self._build()
        except BaseException:       # Ctrl-C halfway through too: nothing may stay
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        tag = f"{os.getpid()}{secrets.token_hex(2)}"           # pid, then a random suffix
        self.subnet = _free_subnet()
        hosts = list(self.subnet.hosts())
        # an interface name has at most 15 characters: "pl", a pid of up to 7 digits,
        # 4 hex digits, the letter
        self.nodes = [Node(letter, f"{PREFIX}{os.getpid()}-{tag[-4:]}-{letter}",
                           f"node-{letter}", f"pl{tag}{letter}", str(hosts[i]))
                      for i, letter in enumerate(NODES)]
        for n in self.nodes:
            _ip("ip", "netns", "add", n.netns)
        a, b = self.nodes
        # made inside the namespaces: the cable never shows among this machine's interfaces
        _ip("ip", "link", "add", a.veth, "netns", a.netns, "type", "veth",
            "peer", "name", b.veth, "netns", b.netns)
        lines = ["127.0.0.1 localhost", "::1 localhost",
                 *(f"{n.address} {n.hostname}" for n in self.nodes)]
        for n in self.nodes:
            _ip("ip", "-n", n.netns, "addr", "add", f"{n.address}/{self.subnet.prefixlen}",
                "dev", n.veth)
            for dev in ("lo", n.veth):
                _ip("ip", "-n", n.netns, "link", "set", dev, "up")
            for dev, mbit, mtu in ((n.veth, self.between_mbit, 1500),
                                   ("lo", self.inside_mbit, 65536)):
                if mbit is not None:
                    _ip("tc", "-n", n.netns, "qdisc", "add", "dev", dev, "root", "tbf",
                        "rate", f"{mbit:g}mbit", "burst", str(_burst_bytes(mbit, mtu)),
                        "latency", "400ms")
            # both names resolve in both namespaces, as a cluster's hostnames do
            folder = NETNS_ETC / n.netns
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text("\n".join(lines) + "\n")

    def close(self) -> None:
        """Stop every process left in the namespaces, remove them, the cable and their
        /etc/netns folders. Safe to call twice, and after a build that failed halfway."""
        for n in self.nodes:
            _remove_namespace(n.netns)
            _ip("ip", "link", "del", n.veth, check=False)        # a cable that never moved
        self.nodes = []
        _OPEN.discard(self)

    @staticmethod
    def _stop(procs) -> None:
        """SIGTERM each node's process group (torchrun passes it to its workers), then
        SIGKILL what is left after a short grace."""
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            end = time.monotonic() + grace
            while any(p.poll() is None for p in procs) and time.monotonic() < end:
                time.sleep(0.05)

    # -- running
    def commands(self, target: str, args=(), *, rendezvous: str = "c10d",
                 trace: str = "run.json", results: str = "results.json",
                 timeout_s: float = 300) -> dict:
        """The command line each node runs (node letter -> argv)."""
        if rendezvous not in ("c10d", "static"):
            raise ValueError(f"rendezvous must be 'c10d' or 'static', got {rendezvous!r}")
        if not self.nodes:
            raise RuntimeError("the nodes are not built: use `with TwoNodes() as nodes: "
                               "nodes.run(...)`")
        torchrun = Path(sys.executable).with_name("torchrun")
        launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m",
                                                                 "torch.distributed.run"]
        head = self.nodes[0].hostname
        out = {}
        for rank, n in enumerate(self.nodes):
            if rendezvous == "c10d":
                # the join order decides nothing: c10d ranks nodes by hostname, node-a first
                meet = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{head}:{RDZV_PORT}",
                        "--rdzv-id", self.nodes[0].netns[:-2]]
            else:
                meet = ["--master-addr", head, "--master-port", str(RDZV_PORT)]
            run = [*launcher, "--nnodes", "2", "--nproc-per-node", str(self.nproc_per_node),
                   "--node-rank", str(rank), *meet, "-m", "parlab", "run", target,
                   "--args", json.dumps(list(args)), "--trace", trace,
                   "--results", results, "--timeout", f"{timeout_s:g}"]
            # its own hostname (a UTS namespace), as each machine of a cluster has
            out[n.letter] = ["ip", "netns", "exec", n.netns, "unshare", "--uts", "--", "sh",
                             "-c", 'hostname "$0" && exec "$@"', n.hostname, *run]
        return out

    def _env(self, node: Node) -> dict:
        path = os.pathsep.join(p for p in (str(ROOT), os.getcwd(),
                                           os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path,
                # gloo's sockets on the cable's address, as a cluster names its NIC
                "GLOO_SOCKET_IFNAME": node.veth,
                "PARLAB_DEVICES": "cpu", "OMP_NUM_THREADS": "1"}

    def run(self, target: str, args=(), *, timeout_s: float = 300,
            rendezvous: str = "c10d") -> TwoNodesRun:
        """Run ``target`` ("MODULE:FUNCTION", a rank function) on 2 x nproc_per_node ranks,
        torchrun on each node; returns results, timeline, seconds, commands, outputs.

        A node that fails (or a run past ``timeout_s``) stops both, and raises
        ``NodeFailed`` (``NodesTimedOut``) naming the node, with each node's output tail.
        """
        if not self.nodes:
            raise RuntimeError("the nodes are not built: use `with TwoNodes() as nodes: "
                               "nodes.run(...)`")
        _check_target(target)
        try:
            json.dumps(list(args))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"args must be a list of JSON values (they travel to every "
                             f"rank as --args JSON): {exc}") from None
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
                math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
            raise ValueError(f"timeout_s must be a number of seconds above 0 and at most "
                             f"{MAX_TIMEOUT_S} (30 days), got {timeout_s!r}")
        with tempfile.TemporaryDirectory(prefix="parlab-two-nodes-") as folder:
            trace = os.path.join(folder, "trace.json")
            results = os.path.join(folder, "results.json")
            cmds = self.commands(target, args, rendezvous=rendezvous, trace=trace,
                                 results=results, timeout_s=timeout_s)
            started = time.monotonic()
            outputs, failed = self._run_both(cmds, folder, timeout_s)
            seconds = time.monotonic() - started
            if failed is None:
                if os.path.exists(results) and os.path.exists(trace):
                    with open(results) as fh:
                        found = json.load(fh, object_hook=_arrays)["results"]
                    return TwoNodesRun(found, Timeline.from_chrome_trace(trace), seconds,
                                       {k: shlex.join(v) for k, v in cmds.items()}, outputs)
                failed = ("a", "ended without writing rank 0's results and trace", False)
        letter, what, timed_out = failed
        tails = "\n".join(f"--- node {k} (node-{k}) {name}:\n{text[-TAIL_CHARS:]}"
                          for k, (out, err) in outputs.items()
                          for name, text in (("stdout", out), ("stderr", err)) if text.strip())
        raise (NodesTimedOut if timed_out else NodeFailed)(
            f"node {letter} (node-{letter}) {what}; both nodes were stopped.\n{tails}",
            letter, outputs)

    def _run_both(self, cmds: dict, folder: str, timeout_s: float):
        """Start both nodes, wait; on the first failure or the timeout stop both.
        Returns (outputs, None) or (outputs, (node letter, what happened, timed out))."""
        files, procs = {}, {}
        try:
            for n in self.nodes:
                out, err = files[n.letter] = tuple(
                    open(os.path.join(folder, f"{n.letter}.{std}"), "w+") for std in ("out", "err"))
                # a process group per node: stopping it reaches torchrun and its workers
                p = subprocess.Popen(cmds[n.letter], stdout=out, stderr=err,
                                     stdin=subprocess.DEVNULL, env=self._env(n),
                                     start_new_session=True)
                procs[n.letter] = p
            failed, end = None, time.monotonic() + timeout_s
            while failed is None:
                codes = {k: p.poll() for k, p in procs.items()}
                bad = [k for k, c in codes.items() if c not in (None, 0)]
                if bad:
                    failed = (bad[0], f"failed (torchrun exit code {codes[bad[0]]})", False)
                elif all(c == 0 for c in codes.values()):
                    break
                elif time.monotonic() > end:
                    late = [k for k, c in codes.items() if c is None]
                    failed = (late[0], f"still running after timeout_s={timeout_s:g} s", True)
                else:
                    time.sleep(0.05)
        finally:
            self._stop(list(procs.values()))
            for n in self.nodes:
                _stop_inside(n.netns)
            outputs = {k: tuple(_read_and_close(f) for f in pair) for k, pair in files.items()}
        return outputs, failed


def _read_and_close(fh) -> str:
    with fh:
        fh.seek(0)
        return fh.read()


def _stop_inside(netns: str) -> None:
    """SIGKILL any process still in the namespace (one that left its process group)."""
    for _ in range(3):
        done = _ip("ip", "netns", "pids", netns, check=False)
        pids = [int(p) for p in done.stdout.split() if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.2)


def _remove_namespace(netns: str) -> None:
    _stop_inside(netns)     # first: a namespace with a process in it outlives its name
    _ip("ip", "netns", "del", netns, check=False)         # takes its end of the cable along
    shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)
    try:
        NETNS_ETC.rmdir()           # only when empty: other namespaces' folders stay
    except OSError:
        pass


def _remove_stale() -> None:
    """Remove the namespaces (and /etc/netns folders) of runs whose process is gone: one
    killed by SIGKILL never reached its cleanup."""
    listed = _ip("ip", "netns", "list", check=False).stdout.split("\n")
    names = {line.split()[0] for line in listed if line.strip()}
    if NETNS_ETC.is_dir():
        names |= {p.name for p in NETNS_ETC.iterdir()}
    for name in names:
        m = OURS.match(name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _remove_namespace(name)


def _arrays(obj: dict):
    """The numpy arrays ``parlab run --results`` wrote in full, as arrays again."""
    if "__ndarray__" not in obj:
        return obj
    import numpy as np
    data = base64.b64decode(obj["__ndarray__"])
    return np.frombuffer(data, dtype=obj["dtype"]).reshape(obj["shape"]).copy()


def _check_target(target) -> None:
    """MODULE:FUNCTION, importable and callable: found here in a second, not by four ranks
    after torchrun's start-up."""
    import importlib
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(f"target must be 'MODULE:FUNCTION' (e.g. "
                         f"'parlab.examples:hello_allreduce'), got {target!r}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"target {target!r}: cannot import {module_name!r} ({exc}); is "
                         "its folder on PYTHONPATH?") from None
    if not callable(getattr(module, attr, None)):
        raise ValueError(f"target {target!r}: {module_name} has no function {attr!r}")


def mbit(text: str) -> float | None:
    """A rate in Mbit/s on the command line; "none": unshaped."""
    return None if text.lower() == "none" else float(text)


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m parlab.two_nodes",
                                     description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("target", help="rank function, MODULE:FUNCTION")
    add("--args", default="[]", help="JSON list of its further arguments")
    add("--between-mbit", type=mbit, default=100.0, help="between the nodes (none: unshaped)")
    add("--inside-mbit", type=mbit, default=800.0, help="inside each node (none: unshaped)")
    add("--nproc-per-node", type=int, default=2)
    add("--rendezvous", choices=("c10d", "static"), default="c10d")
    add("--timeout", type=float, default=300.0, help="seconds")
    add("--trace", help="also write the Chrome/Perfetto trace here")
    ns = parser.parse_args(argv)
    try:
        args = json.loads(ns.args)
    except json.JSONDecodeError as exc:
        parser.error(f"--args must be a JSON list, e.g. --args '[64]': {exc.msg}")
    if not isinstance(args, list):
        parser.error(f"--args must be a JSON list, e.g. --args '[{ns.args}]'")
    try:
        nodes = TwoNodes(ns.between_mbit, ns.inside_mbit, ns.nproc_per_node)
        _check_target(ns.target)
    except ValueError as exc:
        parser.error(str(exc))
    ok, why = available()
    if not ok:
        print(f"two_nodes: {why}", file=sys.stderr)
        return 2
    try:
        with nodes:
            run = nodes.run(ns.target, args, timeout_s=ns.timeout, rendezvous=ns.rendezvous)
    except (NodeFailed, ValueError) as exc:
        print(f"two_nodes: {exc}", file=sys.stderr)
        return 1
    for letter, cmd in run.commands.items():
        print(f"node {letter}: {cmd}")
    print(f"{len(run.results)} ranks in {run.seconds:.1f} s, on "
          + ", ".join(f"rank {r}: {host}" for r, host in enumerate(run.hostnames)))
    print(run.timeline.summary())
    if ns.trace:
        print(f"trace written to {run.timeline.to_chrome_trace(ns.trace)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
