"""Command line: ``python -m parlab {info,bench,lessons,run,student-copy}``."""
from __future__ import annotations

import argparse
import base64
import importlib
import json
import math
import os
import re
import sys


def _load(parser, target: str):
    module_name, _, attr = target.partition(":")
    if not (module_name and attr):
        parser.error(f"expected the worker as MODULE:FUNCTION (e.g. parlab.examples:"
                     f"hello_allreduce), got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        parser.error(f"cannot import {module_name!r} for {target!r}: {exc}. Is its folder on "
                     "PYTHONPATH?")
    fn = getattr(module, attr, None)
    if not callable(fn):
        parser.error(f"{module_name} has no function {attr!r}")
    return fn


def _run_settings(parser, ns):
    """--nproc, --timeout and --args checked here, so errors name the flags."""
    from parlab.launch_settings import MAX_TIMEOUT_S
    if ns.nproc < 1:
        parser.error(f"--nproc must be 1 or more (ranks to start), got {ns.nproc}")
    if not (math.isfinite(ns.timeout) and 0 < ns.timeout <= MAX_TIMEOUT_S):
        parser.error(f"--timeout must be a number of seconds above 0 and at most "
                     f"{MAX_TIMEOUT_S:.0f} (30 days), got {ns.timeout:g}")
    for flag, path in (("--trace", ns.trace), ("--results", ns.results)):
        if path is not None:
            _check_writable(parser, flag, path)
    if ns.args is None:
        return []
    try:
        args = json.loads(ns.args)
    except json.JSONDecodeError as exc:
        parser.error(f"--args must be a JSON list of the worker's further arguments, e.g. "
                     f"--args '[64, \"naive\"]': {ns.args!r} is not JSON ({exc.msg} at "
                     f"character {exc.pos})")
    except RecursionError:      # json nests by recursion: thousands of '[' exhaust the stack
        parser.error("--args is nested too deeply to read: pass a JSON list of the worker's "
                     "further arguments, e.g. --args '[64, \"naive\"]'")
    if not isinstance(args, list):
        parser.error(f"--args must be a JSON list, e.g. --args '[{ns.args}]' for one "
                     f"argument; got {ns.args!r}")
    return args


def _check_writable(parser, flag: str, path: str) -> None:
    """Open the trace (or results) file before the run, not after it: a path that cannot
    be written would otherwise be found when the run is over, and what it was for lost."""
    existed = os.path.lexists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        parser.error(f"{flag} {path!r}: cannot write a file there ({exc.strerror or exc}): "
                     f"name a file in a folder you may write to, e.g. {flag} run.json")
    if not existed:
        try:
            os.unlink(path)     # the run writes it; an empty file must not stay if it fails
        except OSError:
            pass


def _devices(parser, n: int):
    """The devices ``n`` ranks would get, or the reason as a usage error naming what to change."""
    from parlab.hardware import MODE_ENV, devices
    try:
        return devices(n)
    except ValueError as exc:
        # a message about $PARLAB_DEVICES names it already; any other is about the count
        parser.error(str(exc) if MODE_ENV in str(exc) else f"--nproc {n}: {exc}")


def _cmd_run(parser, ns) -> int:
    fn = _load(parser, ns.target)
    args = _run_settings(parser, ns)
    from parlab.errors import LaunchTimeout, WorkerError
    from parlab.torch.torchrun import run_here, under_torchrun
    try:
        if under_torchrun():
            results, timeline = run_here(fn, args, timeout_s=ns.timeout)
        else:
            from parlab.launcher import launch
            out = launch(fn, ns.nproc, args=args, timeout=ns.timeout,
                         devices=_devices(parser, ns.nproc))
            results, timeline = out.results, out.timeline
    except (WorkerError, LaunchTimeout) as exc:
        print(f"parlab run: {exc}", file=sys.stderr)
        return 1
    if results is None:  # not rank 0 under torchrun
        return 0
    print(json.dumps({"results": results}, default=repr))
    print(timeline.summary())
    try:
        if ns.trace:
            print(f"trace written to {timeline.to_chrome_trace(ns.trace)}")
        if ns.results:
            with open(ns.results, "w") as fh:
                json.dump({"results": results}, fh, default=_in_full)
    except OSError as exc:     # checked before the run; changed during it
        print(f"parlab run: cannot write {exc.filename!r} ({exc.strerror or exc})",
              file=sys.stderr)
        return 1
    return 0


def _in_full(obj):
    """A numpy array whole, where the printed line shows its repr (shortened past 1000
    numbers): its bytes in base64, with dtype and shape, to be read back exactly
    (``parlab.two_nodes`` does, for the states it compares)."""
    if hasattr(obj, "tobytes") and hasattr(obj, "dtype") and not obj.dtype.hasobject:
        if obj.ndim == 0:
            return obj.item()
        return {"__ndarray__": base64.b64encode(obj.tobytes()).decode(),
                "dtype": obj.dtype.str, "shape": list(obj.shape)}
    return repr(obj)


def _cmd_info() -> int:
    from parlab.hardware import devices
    from parlab.system import system_report
    print(system_report())
    try:
        for n in (1, 2, 4):
            devs = devices(n)
            print(f"devices({n}): {devs}")
            if devs.simulated and devs.gpus_found:     # the other choice on this machine
                print(f"devices({n}, mode='shared-gpu'): {devices(n, mode='shared-gpu')}")
    except ValueError as exc:      # a bad $PARLAB_DEVICES: its message says what to change
        print(f"parlab info: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_student_copy(ns) -> int:
    from parlab.course.student import StudentCopyError, student_copy
    try:
        written, replaced = student_copy(ns.src, ns.dst, force=ns.force)
    except StudentCopyError as exc:
        print(f"parlab student-copy: {exc}", file=sys.stderr)
        return 2
    for path in replaced:
        print(f"replaced {path}")
    for path in written:
        if path not in replaced:
            print(f"wrote {path}")
    return 0


def _cmd_lessons(parser, ns) -> int:
    from parlab.course import lessons
    labs = lessons.LABS
    if ns.lab is not None:
        # digits only: "".zfill(2) would be "00" and run lab 00
        lab = ns.lab.zfill(2) if re.fullmatch(r"[0-9]{1,2}", ns.lab) else None
        if lab not in lessons.LABS:
            parser.error(f"--lab must be one of {', '.join(lessons.LABS)} (e.g. --lab 06), "
                         f"got {ns.lab!r}")
        labs = (lab,)
    if ns.runs < 1:
        parser.error(f"--runs must be 1 or more (times each lesson's experiment runs), "
                     f"got {ns.runs}")
    lessons.run(labs, ns.runs, out=lambda line: print(line, flush=True))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="parlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="what hardware is here, and what devices a lab would use")
    b = sub.add_parser("bench", help="run the benchmarks (ratios measured in one run)")
    b.add_argument("--only", help="run one benchmark by name")
    b.add_argument("--quick", action="store_true", help="fewer repetitions")
    le = sub.add_parser("lessons", help="run the labs' lesson experiments; how often each "
                        "lesson showed")
    le.add_argument("--lab", help="one lab's lessons (e.g. 06)")
    le.add_argument("--runs", type=int, default=1, help="times each experiment runs")
    r = sub.add_parser("run", help="run a worker MODULE:FUNCTION on N ranks (or under torchrun)")
    r.add_argument("target")
    r.add_argument("--nproc", type=int, default=2, help="ranks, when not under torchrun")
    r.add_argument("--args", help="JSON list of extra arguments for the worker")
    r.add_argument("--trace", help="write a Chrome/Perfetto trace to this path")
    r.add_argument("--results", help="also write the results to this JSON file, numpy "
                   "arrays in full")
    r.add_argument("--timeout", type=float, default=600.0)
    s = sub.add_parser("student-copy", help="copy the labs without solutions or outputs")
    s.add_argument("src", nargs="?", default="labs")
    s.add_argument("dst", nargs="?", default="student")
    s.add_argument("--force", action="store_true",
                   help="replace notebooks already in DST (never allowed inside SRC)")
    ns = parser.parse_args(argv)

    if ns.command == "info":
        return _cmd_info()
    if ns.command == "bench":
        from parlab import bench
        return bench.run(ns.only, ns.quick)
    if ns.command == "lessons":
        return _cmd_lessons(le, ns)
    if ns.command == "run":
        return _cmd_run(r, ns)   # errors show `parlab run`'s own usage
    if ns.command == "student-copy":
        return _cmd_student_copy(ns)
    return 2


if __name__ == "__main__":
    sys.exit(main())
