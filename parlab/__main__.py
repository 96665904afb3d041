"""Command line: ``python -m parlab {info,bench,run,student-copy}``."""
from __future__ import annotations

import argparse
import importlib
import json
import sys


def _load(target: str):
    module_name, _, attr = target.partition(":")
    if not attr:
        raise SystemExit(f"expected MODULE:FUNCTION, got {target!r}")
    return getattr(importlib.import_module(module_name), attr)


def _cmd_run(ns) -> int:
    fn = _load(ns.target)
    args = json.loads(ns.args) if ns.args else []
    from parlab.torch.torchrun import run_here, under_torchrun
    if under_torchrun():
        results, timeline = run_here(fn, args, timeout_s=ns.timeout)
    else:
        from parlab.launcher import launch
        out = launch(fn, ns.nproc, args=args, timeout=ns.timeout)
        results, timeline = out.results, out.timeline
    if results is None:  # not rank 0 under torchrun
        return 0
    print(json.dumps({"results": results}, default=repr))
    print(timeline.summary())
    if ns.trace:
        print(f"trace written to {timeline.to_chrome_trace(ns.trace)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="parlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="what hardware is here, and what devices a lab would use")
    b = sub.add_parser("bench", help="run the benchmarks (ratios measured in one run)")
    b.add_argument("--only", help="run one benchmark by name")
    b.add_argument("--quick", action="store_true", help="fewer repetitions")
    r = sub.add_parser("run", help="run a worker MODULE:FUNCTION on N ranks (or under torchrun)")
    r.add_argument("target")
    r.add_argument("--nproc", type=int, default=2, help="ranks, when not under torchrun")
    r.add_argument("--args", help="JSON list of extra arguments for the worker")
    r.add_argument("--trace", help="write a Chrome/Perfetto trace to this path")
    r.add_argument("--timeout", type=float, default=600.0)
    s = sub.add_parser("student-copy", help="copy the labs without solutions or outputs")
    s.add_argument("src", nargs="?", default="labs")
    s.add_argument("dst", nargs="?", default="student")
    ns = parser.parse_args(argv)

    if ns.command == "info":
        from parlab.hardware import devices
        from parlab.system import system_report
        print(system_report())
        for n in (1, 2, 4):
            devs = devices(n)
            print(f"devices({n}): {devs}")
            if devs.simulated and devs.gpus_found:     # the other choice on this machine
                print(f"devices({n}, mode='shared-gpu'): {devices(n, mode='shared-gpu')}")
        return 0
    if ns.command == "bench":
        from parlab import bench
        return bench.run(ns.only, ns.quick)
    if ns.command == "run":
        return _cmd_run(ns)
    if ns.command == "student-copy":
        from parlab.exercises import student_copy
        for path in student_copy(ns.src, ns.dst):
            print(f"wrote {path}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
