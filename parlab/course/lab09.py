"""Lab 09 (labs/09_when_things_go_wrong.ipynb): what its notebook runs, its lessons, its
exercises.

Each part provokes one failure with a short program of ``lab09_programs`` under a
bounded timeout (``reports.provoke``), shows the trimmed report, and runs the fix.
``closing_note`` lists every failure mode with the seconds its runs took in this kernel.
"""
from __future__ import annotations

import os
import re
import textwrap

from . import lab09_programs as programs
from . import lessons, reports
from .exercise import check, register, run_on_ranks, whose  # noqa: F401 (labNN.check)
from .lab09_exercises import check_ring_shift, check_schedule  # noqa: F401 (lab09.check_...)
from .lab09_programs import FAIL_TIMEOUT, FOLDER, HANG_TIMEOUT  # noqa: F401 (lab09.HANG_TIMEOUT)
from .reports import listing  # noqa: F401 (lab09.listing)

_SECONDS: dict[str, float] = {}     # name -> seconds of the latest run of that name here


def provoke(name: str, fn, world_size: int = 2, *, timeout: float = FAIL_TIMEOUT,
            **options) -> reports.Outcome:
    """``reports.provoke`` with the lab's folder; the seconds kept for ``closing_note``."""
    out = reports.provoke(name, fn, world_size, timeout=timeout, folder=FOLDER, **options)
    _SECONDS[name] = out.seconds
    return out


# ------------------------------------------------------------------ deadlock by message order
def send_buffering(sizes=(4, 4096, 65536, 2**20, 2**24), late_s: float = 0.2) -> dict:
    """How long a blocking send waits for a receiver that posts its receive ``late_s``
    late, per message size (one launch): {bytes: seconds}. Prints a line per size."""
    out = provoke("send buffering", programs.send_while_receiver_is_late,
                  kwargs=dict(sizes=tuple(sizes), late_s=late_s))
    blocked = out.results[0]
    for nbytes, s in blocked.items():
        verdict = "waited for the receive" if s >= 0.8 * late_s else "returned before it"
        print(f"  send of {nbytes:>10,} bytes blocked {s * 1e3:6.1f} ms: {verdict}")
    buffered = [b for b, s in blocked.items() if s < 0.8 * late_s]
    print("every send waited for its receive: gloo buffered none of these messages" if not buffered
          else f"sends of up to {max(buffered):,} bytes returned before their receive was posted")
    return blocked


def lines_calling(fn, call: str) -> list[int]:
    """Line numbers (``listing``'s) of ``fn`` that call ``call`` ("comm.send")."""
    text = listing(fn)
    return [int(line.split()[0]) for line in text.splitlines()
            if re.search(rf"\b{re.escape(call)}\(", line)]


def deadlock_numbers(out: reports.Outcome) -> dict:
    """What lesson 09.deadlock_named_at_the_sends reads from a provoked ``swap``."""
    where = out.where()
    stuck = getattr(out.error, "stuck", {})
    return {"ended": out.ended, "world_size": out.world_size, "seconds": out.seconds,
            "sends": lines_calling(out.fn, "comm.send"),
            "stuck": {r: {"line": w.line, "call": w.call} for r, w in where.items()},
            "elsewhere": {r: text for r, text in stuck.items() if r not in where}}


def warm_up() -> None:
    """One quick launch, as the notebook's first cells make: the fork server the ranks
    start from is started by the first launch of a process (1-3 s), which must not eat a
    hang's timeout."""
    from ..launcher import launch
    launch(programs.swap_collective, 2, timeout=FAIL_TIMEOUT)


def _deadlock_experiment() -> dict:
    warm_up()
    return deadlock_numbers(provoke("deadlock", programs.swap, timeout=HANG_TIMEOUT))


@lessons.lesson("09.deadlock_named_at_the_sends",
                "two ranks that both send before they receive hang, and the timeout's report "
                "names the blocking send line of the program on every rank",
                _deadlock_experiment)
def deadlock_named_at_the_sends(m: dict):
    stuck, sends = m["stuck"], m["sends"]
    figures = (", ".join(f"rank {r} in {w['call']}() at line {w['line']}"
                         for r, w in sorted(stuck.items()))
               + f" (the sends: line {', '.join(map(str, sends))}); the launch {m['ended']}")
    at_send = [r for r, w in stuck.items() if w["line"] in sends and w["call"] == "send"]
    if m["ended"] != "hung":
        why = f"the launch {m['ended']} after {m['seconds']:.1f} s instead of hanging"
    else:
        off = dict(m["elsewhere"])
        off.update({r: f"at line {w['line']}" for r, w in stuck.items() if r not in at_send})
        why = "; ".join(f"rank {r} was {t}" for r, t in sorted(off.items()))
    return m["ended"] == "hung" and len(at_send) == m["world_size"], figures, why


def changed_lines(fn, original) -> str:
    """The lines of ``fn``'s listing that are new, or in a new place, against ``original``
    (its header aside): a fix that only swaps two calls shows both of them."""
    import difflib
    import inspect
    before = [line.strip() for line in inspect.getsource(original).splitlines()]
    shown = listing(fn).splitlines()[2:]
    after = [line[5:].strip() for line in shown]
    new = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, before, after,
                                                      autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            new.update(range(j1, j2))
    return "\n".join(line for k, line in enumerate(shown) if k in new)


def swap_fixes() -> dict:
    """Each fix of ``swap`` run once: {name: Outcome}; prints its new lines and what each
    rank received."""
    outs = {}
    for fn in (programs.swap_by_parity, programs.swap_nonblocking, programs.swap_collective):
        out = outs[fn.__name__] = provoke(fn.__name__, fn)
        got = ", ".join(f"rank {r} received {v:g}" for r, v in enumerate(out.results or []))
        print(f"{fn.__name__}: {fn.__doc__}\n{changed_lines(fn, programs.swap)}\n"
              f"  -> {out.ended} in {out.seconds:.1f} s: {got}\n")
    return outs


# ------------------------------------------------------------------ collectives that do not match
def mismatch_table() -> list[dict]:
    """``programs.mismatched`` of each kind, with and without TORCH_DISTRIBUTED_DEBUG=DETAIL:
    how the launch ended and what it said (one row per run). Prints the table."""
    rows = []
    for kind in programs.MISMATCHES:
        for detail in (False, True):
            env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"} if detail else None
            name = f"mismatch {kind}" + (" DETAIL" if detail else "")
            out = provoke(name, programs.mismatched, kwargs=dict(kind=kind), env=env)
            rows.append({"kind": kind, "detail": detail, "outcome": out, "said": _said(out)})
    print(f"{'rank 1 differs in':<18}{'debug':<8}what happened")
    for row in rows:
        print(f"{row['kind']:<18}{'DETAIL' if row['detail'] else 'off':<8}{row['said']}")
    paths = [str(row["outcome"].path) for row in rows]
    print(f"each run's full report: {paths[0]} ... {paths[-1]} ({len(paths)} files)")
    return rows


def _said(out: reports.Outcome) -> str:
    """One line: a run's outcome, in the words that matter."""
    if out.ended == "finished":
        a, b = (", ".join(f"{v:.9g}" if isinstance(v, float) else str(v) for v in r)
                for r in out.results)
        return f"finished in {out.seconds:.1f} s: rank 0 got [{a}], rank 1 got [{b}]"
    err = out.error
    text = reports.clean(err.summary)
    if (m := re.search(r"killed by (SIG\w+)", text)):
        printed = [line for line in out.output.splitlines() if "what():" in line]
        cause = re.sub(r".*\] ", "", printed[0]) if printed else ""
        return f"rank {err.rank} died ({m.group(1)}) after {out.seconds:.1f} s: {cause}"
    if "differ in the following aspects:" in text:
        aspects = text.split("differ in the following aspects:")[1]
        aspects = reports.clean(aspects.replace("TensorOptions(", ", TensorDeviceTypes=TensorOptions("))
        aspects = re.sub(r"(\S)vs\b", r"\1 vs", aspects.replace("Tensor Tensor ", ""))
        aspects = "; ".join(" ".join(a.split()) for a in re.split(r"\s{2,}", aspects) if a.strip())
        return f"error after {out.seconds:.1f} s on rank {err.rank}: {aspects}"
    return f"{out.ended} after {out.seconds:.1f} s: {text.splitlines()[0]}"


# ------------------------------------------------------------------ replicas drifting apart
def replica_gap(out: reports.Outcome) -> float:
    """The largest difference between rank 0's and another rank's final parameters."""
    import numpy as np
    first = out.results[0]["state"]
    return max(float(np.abs(r["state"][k] - first[k]).max())
               for r in out.results[1:] for k in first)


def drift_line(first: dict | None) -> str:
    """The replica checksum's verdict in words."""
    if first is None:
        return "the replicas were bit for bit equal at every check"
    when = "before the first step" if first["step"] == "start" else f"after step {first['step']}"
    ranks = ", ".join(map(str, first["ranks"]))
    return (f"the replicas first differed {when}, in {', '.join(first['tensors'])}: rank "
            f"{ranks} differs from rank 0 by up to {first['max_difference']:.3g}")


def drift_numbers(out: reports.Outcome, planted: dict | None = None) -> dict:
    """What lesson 09.bit_flip_found_where_planted reads from ``replicas_with_a_flipped_bit``."""
    firsts = [r["first"] for r in out.results] if out.results else []
    return {"ended": out.ended, "planted": dict(planted or programs.FLIP),
            "first": firsts[0] if firsts else None,
            "agree": all(f == firsts[0] for f in firsts)}


def _flip_experiment() -> dict:
    return drift_numbers(provoke("bit flip", programs.replicas_with_a_flipped_bit))


@lessons.lesson("09.bit_flip_found_where_planted",
                "a cross-rank checksum of the replicas, taken every step, names the step, the "
                "tensor and the rank where one flipped bit made them part",
                _flip_experiment)
def bit_flip_found_where_planted(m: dict):
    p, f = m["planted"], m["first"]
    planted = f"planted: step {p['step']}, {p['tensor']}, rank {p['rank']}"
    if f is None:
        why = ("the launch " + m["ended"]) if m["ended"] != "finished" else "no check differed"
        return False, f"no difference found ({planted})", why
    figures = (f"first difference at step {f['step']}, in {', '.join(f['tensors'])}, rank "
               f"{', '.join(map(str, f['ranks']))}, by {f['max_difference']:.2g} ({planted})")
    shown = (f["step"] == p["step"] and f["tensors"] == [p["tensor"]]
             and f["ranks"] == [p["rank"]] and m["agree"])
    why = "the ranks' checks disagree with each other" if not m["agree"] else "found elsewhere"
    return shown, figures, why


# ------------------------------------------------------------------ NaN on one rank
def nan_numbers(out: reports.Outcome, planted: dict | None = None) -> dict:
    """What lesson 09.nan_traced_to_its_rank reads from ``standardized``: the first
    non-finite value found, and each rank's first NaN loss."""
    import math
    results = out.results or []
    first_nan = {r: next((i for i, x in enumerate(res["losses"]) if not math.isfinite(x)), None)
                 for r, res in enumerate(results)}
    return {"ended": out.ended, "planted": dict(planted or programs.BLANK),
            "first": results[0]["first"] if results else None, "first_nan_loss": first_nan}


def print_losses(out: reports.Outcome) -> None:
    """Each rank's loss at every step, one row per rank."""
    for r, res in enumerate(out.results):
        print(f"rank {r} loss: " + " ".join(f"{x:5.2f}" for x in res["losses"]))
    first = out.results[0]["first"]
    print("first non-finite value: " + ("none" if first is None else
          f"rank {first['rank']} at step {first['step']}, in its "
          + ", ".join(first["ranks"][first["rank"]])))


def _nan_experiment() -> dict:
    return nan_numbers(provoke("NaN", programs.standardized))


@lessons.lesson("09.nan_traced_to_its_rank",
                "a NaN that one rank's batch brings in reaches every replica through the "
                "gradient all-reduce within a step; checking every rank before the all-reduce "
                "names the rank, the step and the tensor where it started",
                _nan_experiment)
def nan_traced_to_its_rank(m: dict):
    p, f, nan = m["planted"], m["first"], m["first_nan_loss"]
    losses = ", ".join(f"rank {r} from step {s}" for r, s in nan.items())
    planted = f"planted: rank {p['rank']}, step {p['step']}"
    if f is None:
        return False, f"nothing non-finite found ({planted})", f"the launch {m['ended']}"
    figures = (f"first non-finite: rank {f['rank']} at step {f['step']}, in its {f['tensor']}; "
               f"NaN losses: {losses} ({planted})")
    spread = all(s is not None and s <= p["step"] + 1 for s in nan.values())
    shown = f["rank"] == p["rank"] and f["step"] == p["step"] and f["tensor"] == "batch" and spread
    why = "found elsewhere" if spread else "the NaN did not reach every rank within a step"
    return shown, figures, why


# ------------------------------------------------------------------ a straggler
STRAGGLER = {2: 3.0}      # rank 2 of 3 computes 3x slower (emulated)


def straggler_runs(steps: int = 20, kinds=("even", "straggler")) -> dict:
    """Data parallel on 3 ranks, all even, then rank 2 slower: {"even", "straggler"}."""
    from ..hardware import devices
    from ..launcher import launch
    runs = {}
    for name in kinds:
        slow = STRAGGLER if name == "straggler" else None
        runs[name] = launch(programs.data_parallel_with_a_straggler, 3, devices=devices(3),
                            kwargs=dict(steps=steps, slow=slow))
        _SECONDS[f"straggler: {name}"] = runs[name].wall_time
    return runs


def straggler_numbers(run, skip: int = 2, link=None) -> dict:
    """What lesson 09.straggler_is_waited_for reads from the straggler run replayed on
    dedicated devices (``replays.replayed``: its measured work, no rank waiting for a
    core), per warm step: which rank arrived last at the gradient all-reduce (the one
    that waited least), each rank's shares of its warm steps (waiting, computing), and
    the median step; ``link``: the replay's (this machine's idle link by default)."""
    import statistics

    from . import replays
    tl = replays.replayed(run, link)
    n = len(run.results)
    windows = {r: tl.step_windows("forward", rank=r)[skip:-1] for r in range(n)}
    steps = min(len(w) for w in windows.values())
    waits = {r: [sum(min(s.end, b) - max(s.start, a) for s in tl.spans
                     if s.rank == r and s.kind == "wait" and s.end > a and s.start < b)
                 for a, b in windows[r][:steps]] for r in range(n)}
    last = [min(range(n), key=lambda r: waits[r][k]) for k in range(steps)]
    shares = {}
    for r in range(n):
        a, b = windows[r][0][0], windows[r][steps - 1][1]
        secs = tl.window(a, b).seconds_by_kind(r)
        shares[r] = {k: secs.get(k, 0.0) / (b - a) for k in ("wait", "compute")}
    return {"planted": next(iter(STRAGGLER)), "steps": steps, "source": replays.source(tl),
            "last": {r: last.count(r) for r in range(n)}, "shares": shares,
            "step_ms": statistics.median(b - a for a, b in windows[0][:steps]) * 1e3}


def _straggler_experiment() -> dict:
    return straggler_numbers(straggler_runs(kinds=("straggler",))["straggler"])


@lessons.lesson("09.straggler_is_waited_for",
                "a rank that computes 3x slower is the one everyone waits for: it arrives last "
                "at the gradient all-reduce in at least 80 % of the warm steps, and the other "
                "ranks spend at least a third of their time waiting (2/3 for a 3x straggler "
                "without communication costs)",
                _straggler_experiment)
def straggler_is_waited_for(m: dict):
    p, last, sh = m["planted"], m["last"], m["shares"]
    others = [r for r in sh if r != p]
    figures = (f"rank {p} arrived last in {last[p]} of {m['steps']} warm steps; waiting: "
               + ", ".join(f"rank {r} {sh[r]['wait']:.0%}" for r in sorted(sh)))
    shown = last[p] >= 0.8 * m["steps"] and all(sh[r]["wait"] >= 1 / 3 for r in others)
    why = "computing: " + ", ".join(f"rank {r} {sh[r]['compute']:.0%}" for r in sorted(sh))
    return shown, figures, why


def plot_straggler(run, steps: int = 3, title: str | None = None, measured: bool = False):
    """Three warm steps of the straggler run, replayed on dedicated devices (``measured``:
    as this machine ran them), each lane named by its role."""
    from .. import plot
    from . import replays
    p = next(iter(STRAGGLER))
    tl = run.timeline if measured else replays.replayed(run)
    role = {p: f" · {STRAGGLER[p]:g}x slower (emulated)"}
    labels = {r: f"rank {r}" + role.get(r, "") for r in range(len(run.results))}
    shown = replays.lanes_named(tl.step(4, rank=0, count=steps), labels)
    how = "measured on this machine" if measured else "replayed on dedicated devices"
    return plot.timeline(shown, color_by="name", title=title or (
        f"data parallel, rank {p} {STRAGGLER[p]:g}x slower: {steps} warm steps ({how})"))


# ------------------------------------------------------------------ a rank that dies
def deaths() -> dict:
    """``programs.dies`` three ways (an exception, an exit, SIGKILL): {how: Outcome}, each
    report shown."""
    outs = {}
    for how in ("raise", "exit", "killed"):
        outs[how] = provoke(f"dies: {how}", programs.dies, kwargs=dict(how=how))
        outs[how].show()
    return outs


# ------------------------------------------------------------------ debug switches
def detail_cost(calls: int = 200) -> dict:
    """Median seconds of one small all-reduce on 2 ranks, plain and under
    TORCH_DISTRIBUTED_DEBUG=DETAIL (its checks run before every collective)."""
    out = {}
    for name, env in (("off", None), ("DETAIL", {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})):
        run = provoke(f"all-reduce cost, debug {name}", programs.small_all_reduces,
                      kwargs=dict(calls=calls), env=env)
        out[name] = max(r for r in run.results)
    print(f"one all-reduce of 4 numbers on 2 ranks (median of {calls}): "
          f"{out['off'] * 1e6:.0f} us plain, {out['DETAIL'] * 1e6:.0f} us with DETAIL's checks, "
          f"{out['DETAIL'] / out['off']:.1f}x")
    return out


NCCL_LOG = "nccl_debug_info_h100.txt"           # in data/: recorded on one H100 (see data/README.md)
NCCL_LINES = (r"NCCL version", r"Using network", r"NET/IB : No device", r"Init START",
              r"nRanks \d+ nNodes", r"Channel 00/", r"Init COMPLETE", r"Init timings",
              r"Destroy COMPLETE")


def nccl_debug_excerpt() -> list[str]:
    """The lines of a recorded NCCL_DEBUG=INFO log that say what NCCL chose, then where the
    whole log is; returns them."""
    from ..data import DATA_DIR
    path = DATA_DIR / NCCL_LOG
    lines = path.read_text().splitlines()
    keep = [line for line in lines if any(re.search(p, line) for p in NCCL_LINES)]
    # "vm:491:491 [0] NCCL INFO ...": host:pid:thread [device] — the same on every line here
    keep = [textwrap.shorten(re.sub(r"^\S+ \[\d+\] NCCL INFO |comm 0x\w+ |commId 0x\w+ ", "",
                                    line), WIDTH, placeholder=" ...")
            for line in keep]
    # the path as the notebook (in labs/) or a script in another folder can open it
    keep.append(f"  ... {len(lines) - len(keep)} more lines: {os.path.relpath(path)}")
    print("\n".join(keep))
    return keep


WIDTH = reports.WIDTH


# ------------------------------------------------------------------ TensorFlow
def run_tf_frozen_worker(freeze_at: int = 3, timeout_s: float = 2.0,
                         timeout: float = 60.0) -> reports.Outcome:
    """Two MultiWorkerMirroredStrategy workers (TF_CONFIG on 127.0.0.1); worker 1 stops
    answering at step ``freeze_at``; collectives give up after ``timeout_s``."""
    from ..system import free_ports     # parlab.tf would import TensorFlow into this kernel
    return provoke("TensorFlow worker frozen", programs.tf_worker_that_freezes, timeout=timeout,
                   kwargs=dict(ports=free_ports(2), freeze_at=freeze_at, timeout_s=timeout_s),
                   process_group=False, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


# ------------------------------------------------------------------ the closing note
MODES = [  # (failure mode, symptom, what finds it, the runs that show it)
    ("deadlock by message order", "hangs", "the timeout's stacks", ("deadlock",)),
    ("a collective one rank calls", "hangs", "the timeout's stacks", ("collective on rank 0",)),
    ("mismatched lengths", "a rank aborts (gloo)", "TORCH_DISTRIBUTED_DEBUG=DETAIL",
     ("mismatch length", "mismatch length DETAIL")),
    ("same bytes, other shape/type", "none: wrong numbers", "TORCH_DISTRIBUTED_DEBUG=DETAIL",
     ("mismatch shape", "mismatch shape DETAIL")),
    ("replicas drifting apart", "none: every loss falls", "the replica checksum",
     ("own seeds", "bit flip")),
    ("NaN on one rank", "NaN loss on every rank", "the non-finite check", ("NaN",)),
    ("a dead rank", "WorkerError", "the launcher", ("dies: raise", "dies: killed")),
    ("a frozen rank", "hangs", "a process group timeout", ("dies: frozen",)),
    ("a straggler", "slow steps", "the timeline's waits", ("straggler: straggler",)),
    ("a frozen TensorFlow worker", "hangs", "CommunicationOptions' timeout",
     ("TensorFlow worker frozen",)),
]


def closing_note() -> None:
    """Each failure mode, how it shows, what finds it, and the seconds the runs above
    took to show and diagnose it (each run from launch to report, start-up included)."""
    print(f"{'failure mode':<29}{'symptom':<25}{'found by':<33}seconds to show and diagnose")
    for mode, symptom, found, runs in MODES:
        secs = [_SECONDS[r] for r in runs if r in _SECONDS]
        took = (" + ".join(f"{s:.1f}" for s in secs) if len(secs) == len(runs)
                else "not run yet in this kernel")
        print(f"{mode:<29}{symptom:<25}{found:<33}{took}")
