"""Lab 12 (labs/12_pipeline_schedules.ipynb): pipeline schedules past 1F1B on 4 devices:
interleaved 1F1B, ZB-H1 and DualPipeV by hand and with torch.distributed.pipelining, each
equal to one device; their bubble formula, on paper, measured and replayed; the memory
each holds; the cost model's choice at scale; what its notebook runs, its lessons and its
exercise."""
from __future__ import annotations

from statistics import median

from ..launcher import LaunchResult, launch
from ..metrics import largest_difference
from ..split import SplitConfig
from . import lessons, replays
from .exercise import whose  # noqa: F401 (lab12.whose)
from .lab12_exercises import check_split_backward, check_zb_h1  # noqa: F401 (lab12.check_...)

TOL = 1e-5
DEVICES, MICRO_BATCHES = 4, 8
SCHEDULES = ("1f1b", "interleaved", "zb-h1", "dualpipev")
NAMES = {"1f1b": "1F1B", "interleaved": "interleaved 1F1B (v = 2)", "zb-h1": "ZB-H1",
         "dualpipev": "DualPipeV"}
# 8 linear layers of 512 x 512 between a small first and last: each of the 8 virtual
# stages holds one, each of 4 stages two; a
# pass (64 rows through a 512 x 512 layer) lasts about a millisecond, far above a call's
# fixed cost and a hand-over's
CONFIG = SplitConfig(sizes=(64,) + (1024,) * 9 + (10,), batch_size=512, steps=6, lr=0.05)
INTERLEAVE_CUT = 1.2        # lesson 12.interleaving_cuts_the_bubble: replayed 1F1B / interleaved
ZB_CUT = 1.3                # lesson 12.zero_bubble_at_the_same_memory: replayed 1F1B / ZB-H1
AGREE = 0.08                # lesson 12.prediction_matches_the_replay: |predicted - replayed| bubble


# ------------------------------------------------------------------ on paper
def on_paper(devices: int = DEVICES, micro_batches: int = MICRO_BATCHES) -> list[dict]:
    """Each schedule played on paper with passes of equal cost (F = B = W, free
    hand-overs): its bubble, the formula's, the micro-batches each device holds at its
    peak (in stage-loads: a chunk holds 1/v of a device's layers) and the hand-overs
    between devices per step."""
    from .. import pipeline, pipeline_orders
    rows = []
    for name in SCHEDULES:
        ops = pipeline.make(name, devices, micro_batches, 2)
        chunks, placement = pipeline.layout(ops)
        tl = pipeline.simulate(ops, devices, micro_batches, forward_s=1.0, backward_s=2.0)
        try:
            formula = pipeline_orders.bubble(name, devices, micro_batches, v=chunks)
        except ValueError:
            formula = None
        rows.append({"schedule": name, "ops": ops, "timeline": tl,
                     "bubble": pipeline.bubble_share(tl), "formula": formula,
                     "peak": max(pipeline.peak_in_flight(ops)) / chunks,
                     "hand_overs": hand_overs(ops, devices, micro_batches)})
    return rows


def hand_overs(ops, devices: int, micro_batches: int) -> int:
    """Messages between devices in a step: an activation forward and a gradient back
    across every cut between virtual stages on different devices."""
    from .. import pipeline
    chunks, placement = pipeline.layout(ops)
    stages = devices * chunks
    crossings = sum(pipeline.device_of(k, devices, placement)[0]
                    != pipeline.device_of(k + 1, devices, placement)[0] for k in range(stages - 1))
    return 2 * micro_batches * crossings


def plot_schedules(rows):
    """One step of each schedule on paper (F = B = W, free hand-overs), one panel each on
    one time scale, passes coloured by kind; time in units of a device's forward pass
    of one micro-batch."""
    fig = _panels({r["schedule"]: r["timeline"] for r in rows},
                  {r["schedule"]: r["bubble"] for r in rows}, "on paper", unit="s",
                  predicted=True, xlabel="time (a device's forward pass of one micro-batch = 1)")
    legend = fig.axes[0].get_legend()
    for text in legend.get_texts() if legend else ():
        if text.get_text().startswith("predicted"):
            text.set_text("on paper")
    return fig


WHAT_TO_SEE = {
    "1f1b": "the first devices wait for a gradient, the last idle at the end",
    "zb-h1": "the last devices' put-off W's (olive) fill 1F1B's idle end",
    "interleaved": "half-size passes: the pipeline fills and drains sooner",
    "dualpipev": "pieces in a V: the devices finish together"}


def _panels(timelines: dict, bubbles: dict, how: str, *, unit="ms", predicted=False,
            xlabel=None):
    """Each schedule's step in a panel of its own, one lane per device, on one time axis;
    each title says what to see and gives the bubble."""
    from .. import plot
    fig, axes = plot.pyplot().subplots(4, 1, figsize=(13, 10.5), sharex=True)
    for ax, name in zip(axes, SCHEDULES):
        plot.timeline(_stacked({name: timelines[name]}), ax=ax, unit=unit, color_by="name",
                      names=False, order=KINDS, predicted=predicted, legend=ax is axes[0])
        ax.set_title("")                        # the kind of timeline: in ``how``
        ax.set_title(f"{_short(name)} ({how}, bubble {bubbles[name]:.0%}): {WHAT_TO_SEE[name]}",
                     loc="left", fontsize=plot.style.FONT)
        if ax is not axes[-1]:
            ax.set_xlabel("")
    if xlabel:
        axes[-1].set_xlabel(xlabel)
    fig.tight_layout()
    return plot.finish(fig)


KINDS = ("forward", "backward", "backward: input", "backward: weights")


def _kind_of(name: str, split: set) -> str | None:
    op = _parts(name)
    if op is None:
        return None
    kind, i, c = op
    if kind == "F":
        return "forward"
    if kind == "W":
        return "backward: weights"
    return "backward: input" if (i, c) in split else "backward"


def _stacked(timelines: dict, devices: int = DEVICES):
    """One timeline whose lanes are every schedule's devices, each starting at 0,
    passes renamed by kind (F, B, input gradient, weights' gradient)."""
    from ..spans import Span
    from ..timeline import Timeline
    spans, labels = [], {}
    for n, (name, tl) in enumerate(timelines.items()):
        t0 = tl.start
        splits = {}
        for s in tl:
            op = _parts(s.name)
            if op and op[0] == "W":
                splits.setdefault(s.rank, set()).add(op[1:])
        for s in tl:
            kind = _kind_of(s.name, splits.get(s.rank, set()))
            if kind is None or s.rank >= devices:
                continue
            lane = n * devices + s.rank
            # a number after the kind keeps neighbouring passes apart in the figure
            spans.append(Span(lane, s.kind, f"{kind}{len(spans)}", s.start - t0, s.end - t0))
            labels[lane] = f"device {s.rank}"
    first = next(iter(timelines.values()))
    if getattr(first, "replayed", False):       # drawn as a replay (its title says so)
        from ..sim import ReplayedTimeline
        return ReplayedTimeline(spans, labels, notes=first.notes)
    return Timeline(spans, labels)


def sim_replayed(spans, like):
    """Spans of a replay as a replayed timeline, with ``like``'s notes."""
    from ..sim import ReplayedTimeline
    return ReplayedTimeline(spans, notes=like.notes)


def _parts(name: str):
    from ..pipeline import pass_of
    op = pass_of(name.split(" (")[0])
    if op is None:
        return None
    return op if len(op) == 3 else (*op, 0)


# ------------------------------------------------------------------ on the ranks
def run_order(fn, *, devices=None) -> float:
    """Exercise 12.2's order trained on 4 ranks with this lab's model: its largest
    difference from one device (``lab12_exercises.run_order``)."""
    from .lab12_exercises import run_order as run
    return run(fn, CONFIG, devices=devices)


def plans(cfg: SplitConfig = CONFIG, devices: int = DEVICES,
          micro_batches: int = MICRO_BATCHES) -> dict:
    """{schedule: (its config, cut into devices x chunks pieces, and its order)}."""
    from ..torch import pipeline_chunks
    return {name: pipeline_chunks.prepare(cfg, devices, micro_batches, name)
            for name in SCHEDULES}


def run(*, devices=None, cfg: SplitConfig = CONFIG, micro_batches: int = MICRO_BATCHES,
        library: bool = True, timeout: float = 240.0) -> LaunchResult:
    """The four schedules by hand, one after the other, then the library's interleaved
    1F1B, zero bubble and DualPipeV, in one launch on 4 devices."""
    from ..torch import pipeline_chunks
    made = plans(cfg, DEVICES, micro_batches)
    return launch(pipeline_chunks.train_each, DEVICES, devices=devices,
                  args=(made, micro_batches),
                  kwargs={"library": SCHEDULES[1:] if library else ()}, timeout=timeout)


def reference(cfg: SplitConfig = CONFIG) -> dict:
    from ..torch import split
    return split.train_reference(cfg)


def equivalence(results, ref: dict) -> list[dict]:
    """Per schedule, by hand and with the library: the largest difference from one
    device in loss, first gradients and final weights."""
    rows = []
    for name in SCHEDULES:
        grads = {k: v for r in results for k, v in r[name]["first_grads"].items()}
        losses = [x for r in results for x in r[name]["losses"]]
        state = {k: v for r in results for k, v in r[name]["state"].items()}
        row = {"schedule": name,
               "loss": largest_difference(zip(losses, ref["losses"])),
               "gradients": largest_difference((grads[k], v) for k, v in ref["first_grads"].items()),
               "weights": largest_difference((state[k], v) for k, v in ref["state"].items()),
               "library": None}
        if f"library {name}" in results[0]:
            lib = {k: v for r in results for k, v in r[f"library {name}"]["grads"].items()}
            row["library"] = largest_difference((lib[k], v) for k, v in ref["first_grads"].items())
        rows.append(row)
    return rows


def windows(tl) -> dict:
    """{schedule: (start, end)} of its part of the launch, from its "schedule" spans."""
    out = {}
    for s in tl:
        if s.name.startswith("schedule "):
            name = s.name[len("schedule "):]
            a, b = out.get(name, (s.start, s.end))
            out[name] = (min(a, s.start), max(b, s.end))
    return out


def step_bubbles(tl, made: dict) -> dict:
    """{schedule: the bubble of each of its steps} read from ``tl`` (measured or replayed)."""
    from ..torch.pipeline_chunks import bubble_by_step
    ranks = list(range(DEVICES))
    return {name: bubble_by_step(tl.window(*span), made[name][1], ranks)
            for name, span in windows(tl).items() if name in made}


def cost_model(step: dict, made: dict, link, cfg: SplitConfig) -> tuple:
    """The cost model for this lab's MLP calibrated on 1F1B's replayed step alone
    (``step``: {rank: its passes}): each stage's median F and B shared among its layers
    by their FLOPs (``sim.Measured``), 4 dedicated devices on ``link``. It leaves out the
    work between passes (posting a message, taking one in, the executor's bookkeeping),
    which the replay keeps. Returns (network, costs, cluster)."""
    from .. import sim
    net = sim.Network.mlp(cfg.sizes)
    cuts = [0, *_layer_bounds(made["1f1b"][0].bounds), len(net)]
    fwd, bwd = [0.0] * len(net), [0.0] * len(net)
    for d in range(DEVICES):
        layers = range(cuts[d], cuts[d + 1])
        total = sum(net.layers[i].flops for i in layers)
        for kind, out in (("F", fwd), ("B", bwd)):
            took = median(s.duration for s in step[d] if _parts(s.name)[0] == kind)
            for i in layers:
                out[i] = took * net.layers[i].flops / total
    costs = sim.Measured(tuple(fwd), tuple(bwd), 0.0, cfg.batch_size // MICRO_BATCHES,
                         net.params, source="1F1B's replayed step")
    here = sim.calibrate.this_machine(link, flops=sim.calibrate.compute_rate(net, costs),
                                      devices=DEVICES)
    return net, costs, here


def _layer_bounds(bounds) -> list[int]:
    """The cuts between the model's modules (Linear, ReLU, Linear, ...) as cuts between
    its linear layers, the cost model's layers."""
    return [(b + 1) // 2 for b in bounds]


def predict(name: str, made: dict, model: tuple, cfg: SplitConfig):
    """``sim.pipeline``'s timeline of schedule ``name`` with ``model`` (``cost_model``)."""
    from .. import pipeline, sim
    net, costs, here = model
    chunks = pipeline.layout(made[name][1])[0]
    return sim.pipeline(net, here, cfg.batch_size, stages=DEVICES, micro_batches=MICRO_BATCHES,
                        schedule=name, costs=costs, bounds=_layer_bounds(made[name][0].bounds),
                        **({"chunks": chunks} if chunks > 1 else {}))


def _pass_bubble(tl) -> float:
    """1 - the devices' pass time over devices x the span from the first pass to the last."""
    passes = [s for s in tl if s.rank < DEVICES and _parts(s.name)]
    t0, t1 = min(s.start for s in passes), max(s.end for s in passes)
    return 1 - sum(s.duration for s in passes) / (DEVICES * (t1 - t0))


def numbers(run_: LaunchResult, ref: dict, replay=None, cfg: SplitConfig | None = None) -> dict:
    """What the lessons read: equivalence, bubbles and steps (measured, replayed: each
    schedule's least disturbed step after the first; predicted by the cost model
    calibrated on 1F1B's replayed step; the formula), the activations each device held
    and the hand-overs."""
    from .. import pipeline
    cfg = cfg or CONFIG
    link = replays.idle_link()
    tl = replay if replay is not None else replays.replayed(run_, link)
    made = plans(cfg)
    measured = step_bubbles(run_.timeline, made)
    paper = {r["schedule"]: r for r in on_paper()}
    quiet = quietest_steps(tl, made)
    model = cost_model(quiet["1f1b"][1], made, link, cfg)
    rows = []
    for name in SCHEDULES:
        ops = made[name][1]
        predicted = predict(name, made, model, cfg)
        chunks = pipeline.layout(ops)[0]
        k, step, bubble = quiet[name]
        rows.append({"schedule": name, "measured": min(measured[name][1:]),
                     "replayed": bubble,
                     "predicted": _pass_bubble(predicted),
                     "step_s": _duration(step), "predicted_step_s": predicted.step_s,
                     "formula": paper[name]["formula"], "paper": paper[name]["bubble"],
                     "peak": max(r[name]["peak_micro_batches"] for r in run_.results) / chunks,
                     "peak_bytes": max(r[name]["peak_activation_bytes"] for r in run_.results),
                     "hand_overs": hand_overs(ops, DEVICES, MICRO_BATCHES),
                     "sent": sum(r[name]["sends_per_step"] for r in run_.results)})
    return {"equivalence": equivalence(run_.results, ref), "bubbles": rows}


def _duration(step: dict) -> float:
    from ..torch.pipeline_chunks import span_of
    t0, t1 = span_of(step)
    return t1 - t0


def quietest_steps(tl, made: dict) -> dict:
    """{schedule: (index, {rank: spans}, bubble) of its least disturbed step after the
    first}: the one with the smallest bubble."""
    from ..torch.pipeline_chunks import bubble_by_step, steps_of
    ranks = list(range(DEVICES))
    out = {}
    for name, (a, b) in windows(tl).items():
        if name in made:
            seg = tl.window(a, b)
            bubbles = bubble_by_step(seg, made[name][1], ranks)
            k = 1 + min(range(len(bubbles) - 1), key=lambda j: bubbles[j + 1])
            out[name] = (k, steps_of(seg, made[name][1], ranks)[k], bubbles[k])
    return out


def plot_replayed(run_: LaunchResult, replay=None, cfg: SplitConfig | None = None):
    """The least disturbed step of each schedule, replayed on 4 dedicated devices."""
    tl = replay if replay is not None else replays.replayed(run_)
    steps, bubbles = {}, {}
    for name, (_, step, bubble) in quietest_steps(tl, plans(cfg or CONFIG)).items():
        steps[name] = sim_replayed([s for spans in step.values() for s in spans], tl)
        bubbles[name] = bubble
    return _panels(steps, bubbles, "replayed")


# ------------------------------------------------------------------ lessons
def _experiment() -> dict:
    return numbers(run(), reference())


@lessons.lesson("12.schedules_equal_one_device",
                f"interleaved 1F1B, ZB-H1 and DualPipeV, by hand and with "
                f"torch.distributed.pipelining, train as one device does: losses, gradients "
                f"and weights within {TOL:g}",
                _experiment)
def schedules_equal_one_device(m: dict):
    rows = m["equivalence"]
    worst = max(max(r["loss"], r["gradients"], r["weights"], r["library"] or 0.0) for r in rows)
    figures = "; ".join(f"{_short(r['schedule'])} {max(r['loss'], r['gradients'], r['weights']):.1e}"
                        + (f" (library {r['library']:.1e})" if r["library"] is not None else "")
                        for r in rows)
    return worst <= TOL, "largest difference: " + figures, "a schedule changed the training"


def _formula_cut(name: str) -> float:
    """1F1B's bubble over ``name``'s by formula, on this lab's 4 devices and 8 micro-batches."""
    from ..pipeline_orders import bubble
    return (bubble("1f1b", DEVICES, MICRO_BATCHES)
            / bubble(name, DEVICES, MICRO_BATCHES, v=2 if name == "interleaved" else 1))


def _row(m, name):
    return next(r for r in m["bubbles"] if r["schedule"] == name)


@lessons.lesson("12.interleaving_cuts_the_bubble",
                f"two chunks per device cut 1F1B's bubble at least {INTERLEAVE_CUT:g}x "
                f"(the formula: {_formula_cut('interleaved'):.1f}x), for more than twice the "
                "hand-overs",
                _experiment)
def interleaving_cuts_the_bubble(m: dict):
    one, inter = _row(m, "1f1b"), _row(m, "interleaved")
    ratio = one["replayed"] / inter["replayed"]
    figures = (f"bubble {one['replayed']:.1%} against {inter['replayed']:.1%} ({ratio:.2f}x), "
               f"hand-overs {one['sent']} against {inter['sent']} a step")
    shown = ratio >= INTERLEAVE_CUT and inter["sent"] > 2 * one["sent"]
    return shown, figures, "interleaving did not cut the bubble", \
        "replayed on 4 dedicated devices, least disturbed step"


@lessons.lesson("12.zero_bubble_at_the_same_memory",
                f"ZB-H1 cuts 1F1B's bubble at least {ZB_CUT:g}x (the formula: "
                f"{_formula_cut('zb-h1'):.1f}x) and holds no more micro-batches at its peak",
                _experiment)
def zero_bubble_at_the_same_memory(m: dict):
    one, zb = _row(m, "1f1b"), _row(m, "zb-h1")
    ratio = one["replayed"] / zb["replayed"]
    figures = (f"bubble {one['replayed']:.1%} against {zb['replayed']:.1%} ({ratio:.2f}x); "
               f"peak {one['peak']:g} against {zb['peak']:g} micro-batches")
    return (ratio >= ZB_CUT and zb["peak"] <= one["peak"], figures,
            "ZB-H1 did not cut the bubble at the same memory",
            "replayed on 4 dedicated devices; peaks counted on the ranks")


@lessons.lesson("12.dualpipev_idles_least",
                "DualPipeV leaves the smallest bubble of the four, and holds more "
                "activations than 1F1B",
                _experiment)
def dualpipev_idles_least(m: dict):
    rows = {r["schedule"]: r for r in m["bubbles"]}
    least = min(rows, key=lambda n: rows[n]["replayed"])
    figures = ", ".join(f"{_short(n)} {r['replayed']:.1%}" for n, r in rows.items()) \
        + f"; peak {rows['dualpipev']['peak']:g} against 1F1B's {rows['1f1b']['peak']:g} stage-loads"
    return (least == "dualpipev" and rows["dualpipev"]["peak"] > rows["1f1b"]["peak"], figures,
            f"{least} idled least", "replayed on 4 dedicated devices, least disturbed step")


@lessons.lesson("12.prediction_matches_the_replay",
                f"the cost model, calibrated on 1F1B's replayed step alone, predicts each "
                f"schedule's bubble within {AGREE * 100:g} points of the replayed one",
                _experiment)
def prediction_matches_the_replay(m: dict):
    off = {r["schedule"]: abs(r["predicted"] - r["replayed"]) for r in m["bubbles"]}
    figures = ", ".join(f"{_short(r['schedule'])} {r['predicted']:.1%} ({r['replayed']:.1%})"
                        for r in m["bubbles"])
    worst = max(off, key=off.get)
    return (off[worst] <= AGREE, "bubble predicted (replayed): " + figures,
            f"{worst} off by {off[worst] * 100:.1f} points",
            "the cost model against the replay on 4 dedicated devices")


def _short(name: str) -> str:
    return NAMES[name].split(" (")[0]


# ------------------------------------------------------------------ at scale, predicted
# Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Tables 3 and 4: a GPT-3-like
# 6.2B model (30 layers, width 4096, 32 heads, sequence 1024) on 8 A100 SXM 80 GB as 8
# stages, micro-batches of 3, m = 24; measured samples per GPU per second and memory (GB).
ZB_PAPER = {"1f1b": (3.50, 39), "zb-h1": (3.88, 42)}     # ZB-1p: ZB-H1's bubble (Table 5)
UNPUBLISHED = {"interleaved": "ran a piece per layer", "dualpipev": "not in the paper"}


def at_scale(micro_batches: int = 24) -> list[dict]:
    """The four schedules for the zero-bubble paper's 6.2B model on 8 A100s, predicted by
    the cost model: step, throughput against 1F1B's, the busiest device's memory; beside
    what the paper measured where it ran the schedule."""
    from .. import sim
    from ..sim.validate import megatron_bounds
    net = sim.Network.decoder("6.2B", 30, 4096, 32, 1024, 50257, tied=False, flash=True)
    cluster, rows = sim.a100_nvlink(8), []
    for name in SCHEDULES:
        chunks = 2 if name in ("interleaved", "dualpipev") else 1
        extra = {"chunks": chunks} if chunks > 1 else {}
        step = sim.pipeline(net, cluster, 3 * micro_batches, stages=8, schedule=name,
                            micro_batches=micro_batches, bounds=megatron_bounds(net, 8 * chunks),
                            **extra).step_s
        mem = sim.memory(net, 3 * micro_batches, pp=8, micro_batches=micro_batches,
                         schedule=name, **extra)
        rows.append({"schedule": name, "step_s": step, "memory_gb": mem.total / 1e9,
                     "published": ZB_PAPER.get(name) if micro_batches == 24 else None})
    for r in rows:
        r["speed_up"] = rows[0]["step_s"] / r["step_s"]
    return rows


def print_at_scale(micro_batches: int = 24) -> None:
    rows = at_scale(micro_batches)
    base = ZB_PAPER["1f1b"]
    print(f"{'':<26}{'PREDICTED':^26}   {'published (measured)':^24}")
    print(f"{'schedule':<26}{'step s':>8}{'speed':>8}{'memory':>10}   {'speed':>10}{'memory':>10}")
    for r in rows:
        pub = r["published"]
        said = (f"{pub[0] / base[0]:>9.2f}x{pub[1] / base[1]:>9.2f}x" if pub
                else f"{UNPUBLISHED[r['schedule']]:>20}")
        print(f"{NAMES[r['schedule']]:<26}{r['step_s']:>8.2f}{r['speed_up']:>7.2f}x"
              f"{r['memory_gb'] / rows[0]['memory_gb']:>9.2f}x   {said}")
    print(f"speed and memory against 1F1B's; a GPT-3-like 6.2B model on 8 A100s as 8 stages, "
          f"{micro_batches} micro-batches of 3; published: Qi et al. 2024, Table 4")
