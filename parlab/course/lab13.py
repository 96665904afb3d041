"""Lab 13 (labs/13_checkpoints.ipynb): nothing lost when a rank dies. Sharded checkpoints
written by every rank and committed atomically, resumed on 4, 2 and 1 ranks equal to an
uninterrupted run, a crash in the middle of a save, a damaged or mismatched checkpoint,
and a restart after a rank dies; what its notebook runs, its lessons and its exercises."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..launcher import LaunchResult, launch
from ..metrics import largest_difference
from . import lessons
from .exercise import whose  # noqa: F401 (lab13.whose)
from .lab13_exercises import check_newest_complete, check_reads  # noqa: F401 (lab13.check_...)

TOL = 1e-5
DEVICES, STEPS, EVERY = 4, 6, 3
BYTES_OFF = 0.10            # lesson 13.bytes_per_rank_match_formula: within 10 % (DCP's headers)
_FOLDERS = tempfile.TemporaryDirectory(prefix="parlab-lab13-")   # removed when Python exits


def config():
    """The lab's model: an MLP of widths (64, 512, 512, 10), 301,066 parameters, Adam,
    a global batch of 64 digits (``checkpoint.Config``)."""
    from ..torch.checkpoint import Config
    return Config(sizes=(64, 512, 512, 10), batch_size=64, lr=1e-3)


def folder(name: str) -> Path:
    """A fresh folder for one run's checkpoints (under a temporary folder of this session)."""
    path = Path(_FOLDERS.name) / name
    shutil.rmtree(path, ignore_errors=True)
    return path


def train(where: Path, world_size: int, *, steps: int = STEPS, every: int = EVERY,
          resume: bool = False, devices=None, cfg=None, **kw) -> LaunchResult:
    """``checkpoint.train`` on ``world_size`` ranks (FSDP2 unless told otherwise)."""
    from ..torch import checkpoint
    if devices is not None and devices.n != world_size:     # the same kind, fewer of them
        devices = devices.like(world_size)
    return launch(checkpoint.train, world_size, devices=devices, args=(cfg or config(),),
                  kwargs=dict(steps=steps, every=every, folder=str(where), resume=resume, **kw),
                  timeout=240)


def copy_of(src: Path, name: str) -> Path:
    """A copy of a checkpoint folder, so that several runs resume from the same one."""
    dst = folder(name)
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------ what a save writes
def bytes_rows(run: LaunchResult, world_size: int = DEVICES) -> list[dict]:
    """Per rank: the bytes it wrote for its first checkpoint against 12 bytes a parameter
    over the ranks (float32 weights and Adam's two moments, sharded), and the seconds a
    save and a step took."""
    from statistics import median

    from ..torch.checkpoint import expected_bytes
    out = []
    for rank, r in enumerate(run.results):
        step, wrote = r["saved"][0]
        out.append({"rank": rank, "step": step, "bytes": wrote,
                    "formula": expected_bytes(r["params"], world_size),
                    "save_s": median(r["save_s"]), "step_s": median(r["step_s"])})
    return out


# ------------------------------------------------------------------ resuming
def weights_of(run: LaunchResult) -> dict:
    return run.results[0]["state"]


def loss_curve(run: LaunchResult) -> dict:
    """{step: loss of the whole batch}: the mean over the ranks of their rows' losses."""
    steps = {}
    for r in run.results:
        for step, loss in r["losses"]:
            steps.setdefault(step, []).append(loss)
    return {s: sum(v) / len(v) for s, v in sorted(steps.items())}


def resume_numbers(whole: LaunchResult, resumed: dict) -> dict:
    """resumed: {label: LaunchResult}. The largest difference of each from the
    uninterrupted run's final weights and losses, and the step each resumed from."""
    ref_w, ref_l = weights_of(whole), loss_curve(whole)
    rows = {}
    for label, run in resumed.items():
        curve = loss_curve(run)
        rows[label] = {"start": run.results[0]["start"], "ranks": len(run.results),
                       "weights": largest_difference((weights_of(run)[k], v)
                                                     for k, v in ref_w.items()),
                       "losses": largest_difference((curve[s], ref_l[s]) for s in curve)}
    return {"rows": rows}


def plot_losses(runs: dict):
    """Loss per step: the uninterrupted run (a band), each run resumed whole (markers of
    three sizes, one inside the other, so that all three show where they coincide) and
    the run resumed from its weights alone (dashed)."""
    from .. import plot
    plt = plot.pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.6))
    whole = loss_curve(runs["whole"])
    ax.plot(list(whole), list(whole.values()), "-", lw=10, alpha=0.3, color="tab:blue",
            solid_capstyle="round", label="4 ranks, uninterrupted")
    for (label, run), (marker, size) in zip(runs["resumed"].items(),
                                            (("o", 16), ("s", 10), ("^", 6))):
        curve = loss_curve(run)
        off = largest_difference((curve[s], whole[s]) for s in curve)
        said = "bit for bit" if off == 0 else f"within {off:.0e}"
        ax.plot(list(curve), list(curve.values()), marker, ms=size, mfc="none", mew=2,
                label=f"{label} ({said})")
    alone = loss_curve(runs["weights_only"])
    ax.plot(list(alone), list(alone.values()), "--", color="black", lw=2,
            label="4 ranks, resumed from the weights alone")
    ax.set_xlabel("step", fontsize=plot.style.FONT)
    ax.set_ylabel("loss of the global batch", fontsize=plot.style.FONT)
    ax.set_title("resumed whole, the loss goes on unchanged; from the weights alone, it "
                 "does not", fontsize=plot.style.FONT + 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False,
              fontsize=plot.style.FONT - 2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return plot.finish(fig)


def _xy(curve: dict):
    return list(curve), list(curve.values())


# ------------------------------------------------------------------ a crash while saving
def crash_while_saving(where: Path, devices=None) -> dict:
    """Save at step 3, then rank 1 dies in the middle of saving step 6: what is left, and
    what a resume does with it."""
    from ..errors import WorkerError
    from ..torch.checkpoint import latest
    error = None
    try:
        train(where, DEVICES, devices=devices, fail_at=(1, STEPS))
    except WorkerError as exc:
        error = str(exc).splitlines()[0]
    left = sorted(p.name for p in where.iterdir())
    partial = [p for p in where.iterdir() if p.name.startswith(".")]
    files = sorted(f.name for f in partial[0].iterdir()) if partial else []
    newest = latest(where)
    resumed = train(where, 2, devices=devices, resume=True)
    return {"error": error, "left": left, "latest": newest.name if newest else None,
            "partial_files": files, "resumed": resumed}


def refusal(where: Path, sizes=(64, 256, 512, 10)) -> str:
    """What ``checkpoint.check`` says of the newest checkpoint in ``where`` against a
    model of other widths."""
    from ..torch import checkpoint, models
    try:
        checkpoint.check(checkpoint.latest(where), models.mlp(sizes))
    except ValueError as exc:
        return str(exc)
    return "accepted"


def damaged_refusal(where: Path) -> str:
    """What ``checkpoint.check`` says of a copy of the newest checkpoint in ``where`` whose
    first shard file lost its second half (a disk that filled up, a copy cut short)."""
    from ..torch import checkpoint, models
    newest = checkpoint.latest(where)
    copy = copy_of(newest, f"{newest.name}-copy")
    shard = sorted(copy.glob("*.distcp"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    try:
        checkpoint.check(copy, models.mlp(config().sizes))
    except ValueError as exc:
        return str(exc)
    return "accepted"


def manifest_of(where: Path) -> dict:
    """The newest checkpoint's manifest in ``where``, and the files beside it."""
    from ..torch import checkpoint
    path = checkpoint.latest(where)
    return {"files": sorted(f.name for f in path.iterdir()),
            "manifest": checkpoint.read_manifest(path)}


# ------------------------------------------------------------------ the whole experiment
def resume_runs(devices=None) -> dict:
    """The uninterrupted run on 4 ranks, the run stopped after its step-3 checkpoint, and
    that checkpoint resumed on 4, 2 and 1 ranks: {"whole", "stopped", "resumed": {label:
    run}, "folder": the stopped run's checkpoints}."""
    whole_at = folder("uninterrupted")
    whole = train(whole_at, DEVICES, devices=devices)
    stopped_at = folder("stopped")
    stopped = train(stopped_at, DEVICES, steps=EVERY, devices=devices)
    resumed = {f"resumed on {n} rank{'s' * (n > 1)}":
               train(copy_of(stopped_at, f"resumed-{n}"), n, resume=True, devices=devices)
               for n in (4, 2, 1)}
    weights_only = train(copy_of(stopped_at, "weights-only"), DEVICES, resume=True,
                         restore="weights", devices=devices)
    return {"whole": whole, "stopped": stopped, "resumed": resumed, "folder": stopped_at,
            "whole_folder": whole_at, "weights_only": weights_only}


def numbers(runs: dict, crash: dict | None = None) -> dict:
    """What the lessons read from ``resume_runs`` and ``crash_while_saving``."""
    out = resume_numbers(runs["whole"], runs["resumed"])
    out["weights_only"] = resume_numbers(runs["whole"],
                                         {"weights alone": runs["weights_only"]})["rows"]["weights alone"]
    out["bytes"] = bytes_rows(runs["whole"])
    if crash is None:
        return out
    ref = weights_of(runs["whole"])
    out["crash"] = {k: crash[k] for k in ("error", "left", "latest", "partial_files")}
    out["crash"]["weights"] = largest_difference((weights_of(crash["resumed"])[k], v)
                                                 for k, v in ref.items())
    out["crash"]["start"] = crash["resumed"].results[0]["start"]
    return out


def _experiment() -> dict:
    return numbers(resume_runs(), crash_while_saving(folder("crash")))


# ------------------------------------------------------------------ a restart
KILL_RANK, KILL_STEP, RESTART_EVERY = 1, 5, 2


def restart_run(devices=None) -> dict:
    """4 ranks train 6 steps, saving every 2; rank 1 is killed (SIGKILL) after step 5, the
    first time only. ``launch_with_restarts`` launches again with resume=True: the new
    launch starts from step 4's checkpoint. Returns what the lesson reads, with the
    uninterrupted run's weights beside the restarted run's."""
    from ..restarts import launch_with_restarts
    from ..torch import elastic
    where = folder("restart")
    out, attempts = launch_with_restarts(
        elastic.train_killed_once, DEVICES, restarts=1, devices=devices, args=(config(),),
        kwargs=dict(kill_rank=KILL_RANK, kill_step=KILL_STEP, folder=str(where),
                    steps=STEPS, every=RESTART_EVERY), timeout=240)
    whole = train(folder("restart-reference"), DEVICES, every=RESTART_EVERY, devices=devices)
    start = out.results[0]["start"]
    return {"attempts": attempts, "start": start, "killed_after": KILL_STEP,
            "lost": KILL_STEP - start, "steps": STEPS,
            "weights": largest_difference((weights_of(out)[k], v)
                                          for k, v in weights_of(whole).items())}


@lessons.lesson("13.bytes_per_rank_match_formula",
                f"each of 4 ranks writes its shard: 12 bytes a parameter over the ranks "
                f"(float32 weights and Adam's two moments), within {BYTES_OFF:.0%}",
                _experiment)
def bytes_per_rank_match_formula(m: dict):
    rows = m["bytes"]
    off = max(abs(r["bytes"] / r["formula"] - 1) for r in rows)
    figures = ", ".join(f"rank {r['rank']} {r['bytes']:,}" for r in rows) + \
        f" bytes against {rows[0]['formula']:,.0f} ({off:.1%} off at most)"
    return off <= BYTES_OFF, figures, "a rank wrote more or less than its shard"


@lessons.lesson("13.resumed_equals_uninterrupted",
                f"a checkpoint saved on 4 ranks and resumed on 4, 2 or 1 trains on as the "
                f"uninterrupted run (weights and losses within {TOL:g}); resumed from its "
                f"weights alone, it does not",
                _experiment)
def resumed_equals_uninterrupted(m: dict):
    rows = m["rows"]
    worst = max(max(r["weights"], r["losses"]) for r in rows.values())
    alone = m["weights_only"]
    figures = "; ".join(f"{label} from step {r['start']}: weights {r['weights']:.1e}, losses "
                        f"{r['losses']:.1e}" for label, r in rows.items()) + \
        f"; from the weights alone: weights {alone['weights']:.1e}, losses {alone['losses']:.1e}"
    return (worst <= TOL < alone["weights"], figures,
            "a resumed run went its own way, or the weights alone were enough")


@lessons.lesson("13.crash_while_saving_loses_nothing",
                "a rank that dies in the middle of a save leaves the previous checkpoint "
                "whole: the run resumes from it and ends as the uninterrupted run",
                _experiment)
def crash_while_saving_loses_nothing(m: dict):
    c = m["crash"]
    figures = (f"{c['error']}; left: {', '.join(c['left'])}; resumed from {c['latest']} "
               f"(step {c['start']}), weights {c['weights']:.1e} from the uninterrupted run")
    shown = (c["error"] is not None and c["latest"] == "step-000003" and c["start"] == EVERY
             and c["weights"] <= TOL)
    return shown, figures, "the crash cost the previous checkpoint or the run's equality"


@lessons.lesson("13.restart_loses_only_the_steps_since_the_checkpoint",
                "after a rank dies, the job restarts from its last checkpoint, loses only "
                f"the steps since, and ends with the uninterrupted run's weights (within "
                f"{TOL:g})",
                lambda: restart_run())     # an experiment of its own: one launch that fails
def restart_loses_only_the_steps_since_the_checkpoint(m: dict):
    figures = (f"{len(m['attempts'])} launch failed ({'; '.join(m['attempts'])}); the next "
               f"resumed from step {m['start']}: {m['lost']} step lost of {m['steps']}; "
               f"weights {m['weights']:.1e} from the uninterrupted run")
    shown = (len(m["attempts"]) == 1 and m["start"] == m["killed_after"] // RESTART_EVERY
             * RESTART_EVERY and m["weights"] <= TOL)
    return shown, figures, "the restart lost more, or changed the training"


# ------------------------------------------------------------------ saving in the background
def save_times(devices=None) -> dict:
    """The same 6 steps on 4 ranks, saving every 2 steps, synchronously and in the
    background (``dcp.async_save``): per save, the median milliseconds training stopped
    and the whole save took, and a step's. Measured on this machine's wall clock."""
    from statistics import median
    out = {}
    for how, background in (("synchronous", False), ("asynchronous", True)):
        run = train(folder(f"saves-{how}"), DEVICES, every=2, async_save=background,
                    devices=devices)
        r = run.results[0]
        out[how] = {"blocked_ms": median(r["blocked_s"]) * 1e3,
                    "save_ms": median(r["save_s"]) * 1e3, "step_ms": median(r["step_s"]) * 1e3}
    return out


# ------------------------------------------------------------------ ZeRO-3 by hand
def zero3_resumed(whole: LaunchResult, devices=None) -> dict:
    """Lab 08's ZeRO-3 by hand saved on 4 ranks at step 3 and resumed on 2: its weights
    at step 6 against ``whole`` (FSDP2 on 4 ranks, never stopped), and its bytes a rank."""
    from ..torch import checkpoint_zero3
    where = folder("zero3")
    kw = dict(every=EVERY, folder=str(where))
    first = launch(checkpoint_zero3.train_zero3, DEVICES, devices=devices,
                   args=(config(),), kwargs=dict(steps=EVERY, **kw), timeout=240)
    two = devices.like(2) if devices is not None else None
    resumed = launch(checkpoint_zero3.train_zero3, 2, devices=two, args=(config(),),
                     kwargs=dict(steps=STEPS, resume=True, **kw), timeout=240)
    return {"bytes": [r["saved"][0][1] for r in first.results],
            "start": resumed.results[0]["start"],
            "weights": largest_difference((weights_of(resumed)[k], v)
                                          for k, v in weights_of(whole).items())}
