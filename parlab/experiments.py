"""Experiments the labs run: check the settings, start the ranks, return what was measured.

This module sits above the strategies (``parlab.torch.*``, ``parlab.tf.*``) and the
launcher: a strategy module only says what one rank does, and never starts processes
itself. A notebook calls one function here instead of validating and launching by hand.
"""
from __future__ import annotations

from .launcher import LaunchResult, launch


def run_pipeline(cfg, stages: int, micro_batches: int, schedule="1f1b", *,
                 timeout: float = 120.0, devices=None) -> LaunchResult:
    """A micro-batch pipeline of ``stages`` ranks: validated first, then launched.

    schedule: "gpipe", "1f1b" or explicit per-stage lists of ("F" | "B", i). A batch
    that does not divide into the micro-batches, a schedule that deadlocks or more stages
    than layers are refused before any rank starts.
    """
    from .torch import pipeline
    cfg, ops = pipeline.prepare(cfg, stages, micro_batches, schedule)
    return launch(pipeline.train_pipeline, stages, args=(cfg, micro_batches, ops),
                  timeout=timeout, devices=devices)


# --------------------------------------------------------------------------- lab 07
HYBRID_SHAPES = ({"dp": 1, "tp": 4}, {"dp": 4, "tp": 1}, {"dp": 2, "tp": 2},
                 {"dp": 1, "pp": 4}, {"dp": 4, "pp": 1}, {"dp": 2, "pp": 2})


def check_hybrid(shape: dict, *, sizes=None, global_batch: int = 64, micro_batches: int = 4,
                 schedule="1f1b", steps: int = 5, lr: float = 0.1, devices=None):
    """Everything about a hybrid run that can be wrong, said before any rank starts.

    shape: {"dp": d, "tp": t} or {"dp": d, "pp": p}, the last axis varying fastest.
    Refuses: axes other than these, a mesh whose size is not the number of devices, a
    global batch that does not split over the replicas, an MLP whose widths do not
    split over tp, a pipeline that ``pipeline.prepare`` refuses. Returns the grid and,
    for dp × pp, the replica's prepared config and schedule.
    """
    from .grid import Grid
    axes = tuple(shape)
    if axes not in (("dp", "tp"), ("dp", "pp")):
        raise ValueError(f"a hybrid mesh here is {{'dp': d, 'tp': t}} or {{'dp': d, 'pp': p}}, "
                         f"got {shape}: data parallel first (outer), the model's axis last")
    grid = Grid(**shape)
    if devices is not None:
        grid.check_world(devices.n)
    if global_batch % shape["dp"]:
        raise ValueError(f"a global batch of {global_batch} does not split over dp="
                         f"{shape['dp']} replicas: use a multiple of {shape['dp']}")
    from .torch import hybrid, models, pipeline
    from .torch import tensor_parallel as tp
    sizes = tuple(sizes or hybrid.SIZES)
    if "tp" in shape:
        if shape["tp"] > 1:
            try:   # build this rank's slices of the real model, as rank 0 of tp would
                tp.slice_mlp(models.mlp(sizes), "column_row", tp.layout(shape["tp"]))
            except ValueError as exc:
                raise ValueError(f"the MLP {sizes} does not split over tp={shape['tp']}: "
                                 f"{exc}") from None
        return grid, None, None
    from .splitting import SplitConfig
    cfg = hybrid.replica_config(SplitConfig(sizes=sizes, batch_size=global_batch, steps=steps,
                                            lr=lr), shape["dp"])
    # one stage is no pipeline: it needs no micro-batches
    cfg, ops = pipeline.prepare(cfg, shape["pp"], micro_batches if shape["pp"] > 1 else 1,
                                schedule)
    return grid, cfg, ops


def _mesh_labelled(res: LaunchResult) -> LaunchResult:
    """The launch with its timeline's lanes named by mesh coordinates (mesh.labels())."""
    from dataclasses import replace

    from .trace import Timeline
    labels = res.results[0]["labels"]
    return replace(res, timeline=Timeline(res.timeline.spans, labels, res.timeline.ranks))


def run_hybrid(shape: dict, *, sizes=None, global_batch: int = 64, steps: int = 5,
               lr: float = 0.1, micro_batches: int = 4, schedule="1f1b", bucket: bool = True,
               timeout: float = 120.0, devices=None) -> LaunchResult:
    """Train the MLP on a dp × tp or dp × pp mesh by hand: validated, then launched.

    dp × tp: ``hybrid.train_dp_tp``; dp × pp: ``hybrid.train_dp_pp`` with the replica's
    pipeline (``micro_batches``, ``schedule``). The timeline's lanes carry the ranks'
    mesh coordinates. See ``check_hybrid`` for what is refused before any rank starts.
    """
    from .torch import hybrid
    grid, cfg, ops = check_hybrid(shape, sizes=sizes, global_batch=global_batch,
                                  micro_batches=micro_batches, schedule=schedule, steps=steps,
                                  lr=lr, devices=devices)
    sizes = tuple(sizes or hybrid.SIZES)
    if "tp" in shape:
        res = launch(hybrid.train_dp_tp, grid.world_size,
                     args=(shape["dp"], shape["tp"], sizes, global_batch, steps, lr, 0, bucket),
                     timeout=timeout, devices=devices)
    else:
        m = micro_batches if shape["pp"] > 1 else 1
        res = launch(hybrid.train_dp_pp, grid.world_size,
                     args=(cfg, m, ops, shape["dp"], shape["pp"], bucket),
                     timeout=timeout, devices=devices)
    return _mesh_labelled(res)


def run_hybrid_library(shape: dict | None = None, *, sizes=None, global_batch: int = 64,
                       steps: int = 5, lr: float = 0.1,
                       data=("fsdp", "ddp", "ddp_process_group"), timeout: float = 180.0,
                       devices=None) -> LaunchResult:
    """DTensor tensor parallel × PyTorch data parallel (``hybrid.library_dp_tp``)."""
    from .torch import hybrid
    shape = shape or {"dp": 2, "tp": 2}
    grid, _, _ = check_hybrid(shape, sizes=sizes, global_batch=global_batch, devices=devices)
    if "tp" not in shape:
        raise ValueError("the library version combines tensor parallel and data parallel: "
                         "give {'dp': d, 'tp': t}")
    sizes = tuple(sizes or hybrid.SIZES)
    res = launch(hybrid.library_dp_tp, grid.world_size,
                 args=(shape["dp"], shape["tp"], sizes, global_batch, steps, lr, 0, tuple(data)),
                 timeout=timeout, devices=devices)
    return _mesh_labelled(res)


def step_seconds(timeline, marker: str, skip: int = 2) -> float:
    """Median time from one step's ``marker`` span to the next's on the first rank.

    The first ``skip`` steps (start-up) and the last (it has no next) are left out.
    """
    import numpy as np
    windows = timeline.step_windows(marker)[skip:-1]
    if not windows:
        raise ValueError(f"too few steps to time: run more than {skip + 1}")
    return float(np.median([b - a for a, b in windows]))


def typical_step(timeline, marker: str = "forward", skip: int = 2):
    """The median step after the first ``skip`` (start-up), cut at ``marker`` on the first
    rank: a step as it usually goes, to set beside a prediction (steps jitter here)."""
    windows = timeline.step_windows(marker)[skip:-1] or timeline.step_windows(marker)[skip:]
    if not windows:
        raise ValueError(f"too few steps to choose from: run more than {skip + 1}")
    start, end = sorted(windows, key=lambda w: w[1] - w[0])[len(windows) // 2]
    return timeline.window(start, end)


def quickest_step(timeline, marker: str = "forward", skip: int = 2):
    """The quickest complete step after the first ``skip``: the one least disturbed by
    whatever else the machine was doing, which shows a step's structure most plainly.

    Steps run from one ``marker`` span to the next on the first rank. Say that it is the
    quickest wherever it is shown: it is a measured step, not a typical one.
    """
    windows = timeline.step_windows(marker)[skip:-1]
    if not windows:
        raise ValueError(f"too few steps to choose from: run more than {skip + 1}")
    start, end = min(windows, key=lambda w: w[1] - w[0])
    return timeline.window(start, end)


def survey_hybrid(shapes=HYBRID_SHAPES, *, sizes=None, global_batch: int = 64, steps: int = 8,
                  micro_batches: int = 4, schedule="1f1b", timeout: float = 240.0,
                  devices=None) -> dict:
    """Calibrate the cost model here, then measure every mesh shape, in one launch.

    Returns {"cluster": the calibrated ``sim.Cluster``, "calibration": the raw costs,
    "rows": per shape its measured step time, its PREDICTED one (``sim.predict``) and
    bytes per rank per step on each axis, measured and from the formula,
    "timeline": every shape's steps, lanes by global rank}.
    """
    import numpy as np

    from . import sim
    from .torch import hybrid
    sizes = tuple(sizes or hybrid.SIZES)
    worlds = set()
    for shape in shapes:
        grid, _, _ = check_hybrid(shape, sizes=sizes, global_batch=global_batch,
                                  micro_batches=micro_batches, schedule=schedule, steps=steps,
                                  devices=devices)
        worlds.add(grid.world_size)
    if len(worlds) != 1:
        raise ValueError(f"every shape must cover the same ranks; these need {sorted(worlds)}")
    world = worlds.pop()
    res = launch(hybrid.survey, world, args=(list(shapes), sizes, global_batch, steps,
                                             micro_batches, schedule),
                 timeout=timeout, devices=devices)
    cal = res.results[0]["calibration"]
    cluster = sim.calibrated(cal, sizes, devices=world)
    workload = sim.Workload.mlp(sizes)
    rows = []
    for entry in res.results[0]["shapes"]:
        shape = entry["shape"]
        window = res.timeline.window(*entry["window"])
        model_axis = "tp" if "tp" in shape else "pp"
        marker = "forward" if model_axis == "tp" else "F0"
        m = micro_batches if shape.get("pp", 1) > 1 else 1
        plan = sim.Plan(dp=shape["dp"], tp=shape.get("tp", 1), pp=shape.get("pp", 1),
                        micro_batches=m)
        n_steps = len(window.step_windows(marker))
        measured_bytes = {a: float(np.mean([window.comm_bytes(r, a) for r in window.ranks]))
                          / n_steps for a in ("dp", model_axis)}
        if model_axis == "tp":
            expected = hybrid.expected_dp_tp(sizes, global_batch, shape["dp"], shape["tp"])
        else:
            _, cfg, _ = check_hybrid(shape, sizes=sizes, global_batch=global_batch,
                                     micro_batches=micro_batches, schedule=schedule, steps=steps)
            per_stage = hybrid.expected_dp_pp(cfg, shape["dp"])
            expected = {a: float(np.mean([per_stage[r % shape["pp"]][a] for r in range(world)]))
                        for a in ("dp", "pp")}
        rows.append({"shape": shape, "label": " × ".join(f"{a} {n}" for a, n in shape.items()),
                     "measured_s": step_seconds(window, marker),
                     "predicted": sim.predict(workload, cluster, plan, global_batch),
                     "bytes": measured_bytes, "expected_bytes": expected})
    return {"cluster": cluster, "calibration": cal, "rows": rows, "timeline": res.timeline}


# Parts of a PREDICTED step, in the colours of the timelines: compute blue, the
# pipeline's idle slots grey, each axis's transfers in its axis colour.
def _part_colors():
    from . import plot
    from .trace import COMPUTE, IDLE
    return {"compute": plot.COLORS[COMPUTE], "bubble": plot.COLORS[IDLE],
            "tp": plot.AXIS_COLORS["tp"], "pp": plot.AXIS_COLORS["pp"],
            "dp": plot.AXIS_COLORS["dp"]}


PART_LABELS = {"compute": "compute", "bubble": "pipeline bubble (idle)",
               "tp": "tp all-reduces", "pp": "pp sends", "dp": "dp all-reduce"}


def plot_step_parts(entries, *, title: str, ax=None, unit: str = "ms"):
    """Stacked bars of PREDICTED step times (dotted), a measured bar beside each if given.

    entries: (label, ``sim.Prediction``, measured seconds or None). A plan that does not
    fit in memory gets an empty bar and says so.
    """
    import matplotlib.pyplot as plt

    from . import plot
    scale = {"s": 1.0, "ms": 1e3}[unit]
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(13, 5.2))
    else:
        fig = ax.figure
    colors = _part_colors()
    measured_any = any(m is not None for _, _, m in entries)
    width = 0.38 if measured_any else 0.7
    used = set()
    for i, (label, pred, measured) in enumerate(entries):
        x = i - width / 2 if measured_any else i
        if not pred.fits:
            ax.text(x, 0, "does not\nfit in\nmemory", ha="center", va="bottom",
                    fontsize=plot.FONT - 4, color="black")
        else:
            bottom = 0.0
            for part, seconds in pred.parts.items():
                if seconds <= 0:
                    continue
                used.add(part)
                ax.bar(x, seconds * scale, width, bottom=bottom, color=colors[part],
                       hatch=plot.HATCHES[plot.PREDICTED], edgecolor="white", linewidth=0.6)
                bottom += seconds * scale
        if measured is not None:
            ax.bar(i + width / 2, measured * scale, width, color="#333333")
    ax.set_xticks(range(len(entries)))
    ax.set_xticklabels([label for label, _, _ in entries], fontsize=plot.FONT - 3)
    ax.set_ylabel(f"time per step ({unit})", fontsize=plot.FONT - 1)
    ax.set_title(title, fontsize=plot.FONT)
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=colors[p], hatch=plot.HATCHES[plot.PREDICTED],
                             edgecolor="white") for p in PART_LABELS if p in used]
    names = [f"PREDICTED: {PART_LABELS[p]}" for p in PART_LABELS if p in used]
    if measured_any:
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="#333333"))
        names.append("measured here")
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1),
              fontsize=plot.FONT - 3, frameon=False)
    ax.tick_params(labelsize=plot.FONT - 3)
    ax.grid(axis="y", alpha=0.3)
    if own:
        fig.tight_layout()
        plt.close(fig)
    return fig


def run_tf_cluster(timeout: float = 180.0, env: dict | None = None, **options) -> dict:
    """A TensorFlow parameter-server cluster, trained in a fresh process; its report.

    ``options`` go to ``parlab.tf.parameter_server.cluster_training`` (num_workers,
    chunks, steps_per_chunk, workers_in_process, kill_worker, ...); ``env``: extra
    environment variables for the cluster's processes. The process and every
    server it started are gone when this returns, whether training succeeded or not.
    """
    import functools

    from .tf import parameter_server
    result = launch(functools.partial(parameter_server.cluster_training, **options), 1,
                    process_group=False, timeout=timeout,
                    env={"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
    return result.results[0]


def run_multi_worker(workers: int = 2, steps: int = 20, *, timeout: float = 180.0,
                     **options) -> LaunchResult:
    """MultiWorkerMirroredStrategy: ``workers`` TensorFlow worker processes, TF_CONFIG each.

    Ports on 127.0.0.1 are chosen here; every process is gone when this returns.
    ``options`` go to ``parlab.tf.data_parallel.multi_worker`` (global_batch, lr).
    """
    from .tf.cluster import free_ports
    from .tf.data_parallel import multi_worker
    return launch(multi_worker, workers, kwargs=dict(ports=free_ports(workers), steps=steps, **options),
                  process_group=False, timeout=timeout, env={"TF_CPP_MIN_LOG_LEVEL": "2"})



# --------------------------------------------------------------------------- lab 08
def run_zero(*, devices=None, variants=None, sizes=None, global_batch: int = 64, steps: int = 5,
             lr: float = 1e-3, timeout: float = 240.0) -> LaunchResult:
    """Plain data parallel, ZeRO stages 1-3 by hand, stage 2 with offload, and FSDP2, one
    after the other in one launch (``zero.train_zero``; 4 ranks unless ``devices`` says)."""
    from .torch import zero
    n = devices.n if devices is not None else 4
    if global_batch % n:
        raise ValueError(f"a global batch of {global_batch} does not split over {n} ranks: "
                         f"use a multiple of {n}")
    kwargs = dict(variants=tuple(variants or zero.VARIANTS), sizes=tuple(sizes or zero.SIZES),
                  global_batch=global_batch, steps=steps, lr=lr)
    return launch(zero.train_zero, n, kwargs=kwargs, timeout=timeout, devices=devices)


def plot_zero_steps(run, variants=("ddp", "zero1", "zero2", "zero3"), *, rank: int = 0,
                    title: str = ""):
    """One lane per variant: ``rank``'s quickest step of each variant of a ``run_zero``
    run, each from its own start; transfers coloured by their collective (drawn as
    ``plot.timeline``'s axis colours: all_gather, all_reduce, reduce_scatter)."""
    from . import plot, zero_memory
    from .torch import zero
    from .trace import Span, Timeline
    windows = zero.variant_windows(run.timeline, variants)
    spans, labels = [], {}
    for lane, v in enumerate(variants):
        step = quickest_step(run.timeline.window(*windows[v]).filter(ranks=[rank]), skip=1)
        labels[lane] = zero.LABELS[v]
        spans += [Span(lane, s.kind, s.name.replace("grad ", "").replace("param ", ""),
                       s.start - step.start, s.end - step.start, s.bytes,
                       axis=zero_memory.op_of(s.name) if s.kind == "comm" else None)
                  for s in step.spans]
    return plot.timeline(Timeline(spans, labels), color_by="axis", names=False,
                         title=title or f"rank {rank}, the quickest step of each (measured)")


def zero_fit(params: int, devices: int, mixed_precision: bool = True):
    """What each ZeRO stage keeps per device for ``params`` parameters on ``devices``
    devices (``parlab.zero_memory``, computed): lines saying whether it fits on a 16 GB
    and an 80 GB GPU, and stacked bars with those two capacities drawn across."""
    from . import plot, zero_memory
    breakdowns, lines = {}, []
    for stage in zero_memory.STAGES:
        got = zero_memory.per_device_bytes(params, devices, stage, mixed_precision=mixed_precision)
        total = got.pop("total")
        name = "plain DP" if stage == 0 else f"ZeRO-{stage}"
        breakdowns[name] = got
        verdict = ", ".join(f"{gpu}: {'fits' if total <= cap else 'does NOT fit'}"
                            for gpu, cap in zero_memory.GPUS.items())
        lines.append(f"{name:<9} {total / 1e9:9.2f} GB per device: {verdict}")
    fig = plot.memory(breakdowns, unit="GB",
                      title=f"{params / 1e9:.3g} B parameters on {devices} devices (computed)")
    ax = fig.axes[0]
    top = max(sum(d.values()) for d in breakdowns.values()) / 1e9
    for gpu, cap in zero_memory.GPUS.items():
        if cap / 1e9 <= 1.5 * top:
            ax.axhline(cap / 1e9, color="black", ls="--", lw=1)
            ax.text(-0.4, cap / 1e9, gpu, va="bottom", ha="left", fontsize=plot.FONT - 3)
    return lines, fig


def zero_explorer():
    """Sliders for a model's size and the number of devices: what each ZeRO stage keeps
    per device (``zero_fit``, computed at once), and whether it fits on a 16 GB or an
    80 GB GPU."""
    import ipywidgets as w
    from IPython.display import display

    style, wide = {"description_width": "initial"}, w.Layout(width="420px")
    size = w.FloatLogSlider(value=1.5e9, base=10, min=6, max=12, step=0.05,
                            description="parameters", style=style, layout=wide,
                            readout_format=".3g")
    n = w.IntSlider(value=8, min=1, max=1024, description="devices N", style=style, layout=wide)
    mixed = w.Checkbox(value=True, description="mixed precision (2 + 2 + 12 bytes)")
    out = w.Output()

    def draw(*_):
        lines, fig = zero_fit(int(size.value), n.value, mixed.value)
        with out:
            out.clear_output(wait=True)
            print("model states only; activations come on top")
            print("\n".join(lines))
            display(fig)

    for widget in (size, n, mixed):
        widget.observe(draw, names="value")
    draw()
    return w.VBox([w.HBox([size, n]), mixed, out])


def plot_checkpointing(rows, *, title: str = ""):
    """Left: activation bytes of a deep MLP, kept after the forward pass and recomputed
    for the largest segment, per number of checkpointed segments. Right: the step time.
    ``rows`` from ``parlab.torch.memory.checkpointing``."""
    from . import plot
    plt = plot._pyplot()
    names = ["none" if r["segments"] is None else str(r["segments"]) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.4))
    kept = [r["kept"] / 1e6 for r in rows]
    again = [r["recomputed"] / 1e6 for r in rows]
    left.bar(names, kept, color=plot.MEMORY_COLORS["activations"], label="kept after forward")
    left.bar(names, again, bottom=kept, color=plot.OKABE_ITO["yellow"],
             label="+ largest segment, recomputed in backward")
    left.set_ylim(0, 1.5 * max(k + a for k, a in zip(kept, again)))
    left.set_xlabel("checkpointed segments", fontsize=plot.FONT)
    left.set_ylabel("activations held (MB)", fontsize=plot.FONT)
    left.set_title("memory for the backward pass (measured)", fontsize=plot.FONT)
    left.legend(fontsize=plot.FONT - 3, frameon=False, loc="upper center")
    right.bar(names, [r["step_s"] * 1e3 for r in rows], color=plot.COLORS["compute"])
    right.set_xlabel("checkpointed segments", fontsize=plot.FONT)
    right.set_ylabel("forward + backward (ms)", fontsize=plot.FONT)
    right.set_title("time of a step (measured, quickest run)", fontsize=plot.FONT)
    for ax in (left, right):
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(labelsize=plot.FONT - 2)
    if title:
        fig.suptitle(title, fontsize=plot.FONT + 1)
    fig.tight_layout()
    return plot._finish(fig)




# --------------------------------------------------------------------------- measured | predicted
MEASURED_TITLE, PREDICTED_TITLE = "measured here", "PREDICTED (cost model)"


def measured_vs_predicted(measured, predicted, *, title: str | None = None, unit: str = "ms",
                          color_by: str = "kind", names: bool = True, share_time: bool = True):
    """Two timelines side by side: what this machine measured (left), what the cost model
    predicts for the same run (right, dotted), on one time scale when ``share_time``.

    The legend lists every colour of both, below them. Titles say which is which.
    """
    from . import plot
    plt = plot._pyplot()
    lanes = max(len(measured.ranks), len(predicted.ranks))
    fig, (left, right) = plt.subplots(1, 2, figsize=(16, 0.75 * lanes + 2.6), sharex=share_time)
    plot.timeline(measured, ax=left, unit=unit, color_by=color_by, names=names,
                  title=MEASURED_TITLE)
    plot.timeline(predicted, ax=right, unit=unit, color_by=color_by, names=names, predicted=True,
                  title=PREDICTED_TITLE)
    handles, labels = {}, []
    for ax in (left, right):
        legend = ax.get_legend()
        if legend is None:
            continue
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            if text.get_text() not in handles:
                handles[text.get_text()] = handle
                labels.append(text.get_text())
        legend.remove()
    if share_time:      # both drawn: the longer one sets the shared scale
        width = max(measured.duration, predicted.duration) * {"s": 1, "ms": 1e3, "us": 1e6}[unit]
        left.set_xlim(0, width)
    fig.legend([handles[label] for label in labels], labels, loc="lower center",
               ncol=min(len(labels), 7), fontsize=plot.FONT - 3, frameon=False)
    if title:
        fig.suptitle(title, fontsize=plot.FONT + 1)
    fig.tight_layout(rect=(0, 0.1 if lanes > 2 else 0.14, 1, 1))
    return plot._finish(fig)


# --------------------------------------------------------------------------- lab 00
def predicted_uneven_all_reduce(compute_s, nbytes: float, link, *, steps: int = 1,
                                overhead_s: float = 0.0):
    """PREDICTED timeline of lab 00's first collective: rank r computes ``compute_s[r]``
    seconds, then every rank joins one ring all-reduce of ``nbytes`` (``sim.all_reduce_s``
    on ``link``, plus ``overhead_s`` per call), ``steps`` times.

    A rank waits in the all-reduce from its arrival until the last rank arrives (the
    slowest sets the pace); then the data moves for everyone at once. The cost model
    knows nothing of cores: every rank computes at full speed, all at the same time.
    """
    from . import sim
    from .trace import COMM, COMPUTE, WAIT, Span
    n = len(compute_s)
    transfer = sim.all_reduce_s(nbytes, n, link) + overhead_s
    spans, t = [], 0.0
    for _ in range(steps):
        last = t + max(compute_s)
        for r, c in enumerate(compute_s):
            spans.append(Span(r, COMPUTE, "compute", t, t + c))
            if t + c < last:
                spans.append(Span(r, WAIT, "all_reduce", t + c, last))
            spans.append(Span(r, COMM, "all_reduce", last, last + transfer, int(nbytes)))
        t = last + transfer
    return sim.PredictedTimeline(spans, {r: f"rank {r} (predicted)" for r in range(n)},
                                 steps=steps, notes={"strategy": "uneven work, then all-reduce",
                                                     "cluster": str(link)})


# --------------------------------------------------------------------------- calibration
# The cost model needs a few numbers about this machine. Each lab takes them from a
# measurement it has already made, and never from the number it then compares against.
def link_from_transfers(timeline, *, ranks=None, names=None, all_reduce_over: int = 0):
    """The link (``sim.Link``) fitted to the measured transfers of a timeline.

    Every transfer span (kind "comm", the part after any wait) is one point (bytes,
    seconds); ``metrics.fit_link`` draws t = A + S / B through them. Point to point,
    that is alpha and beta. For all-reduces over ``all_reduce_over`` = n ranks the ring
    model says t = 2(n-1) alpha + 2(n-1)/n S / beta, so alpha and beta
    are taken back out of A and B. With a single message size, the link is that size
    over its median time (no latency of its own).
    """
    from .metrics import fit_link
    from .trace import COMM
    pts = [(s.bytes, s.duration) for s in timeline.spans
           if s.kind == COMM and s.bytes > 0 and (ranks is None or s.rank in ranks)
           and (names is None or s.name in names)]
    if not pts:
        raise ValueError("the timeline has no transfers to fit a link to")
    if len({b for b, _ in pts}) < 2:      # one size: its bytes over its median time
        import statistics

        from .metrics import LinkFit
        size = pts[0][0]
        fit = LinkFit(0.0, size / statistics.median(t for _, t in pts))
    else:
        fit = fit_link([b for b, _ in pts], [t for _, t in pts])
    return _link_from_fit(fit, all_reduce_over, collective=all_reduce_over > 1)


def link_from_records(records, op: str = "all_reduce", world_size: int = 2):
    """The link fitted to sweep records ({op, world_size, bytes, seconds}: lab 00's
    ``bandwidth.sweep``, lab 05's ``ring_bandwidth``), taken back out of the ring model
    for all-reduces (see ``link_from_transfers``)."""
    from .metrics import fit_link
    rs = [r for r in records if r.get("op", op) == op and r["world_size"] == world_size
          and r.get("impl", "library") == "library"]
    fit = fit_link([r["bytes"] for r in rs], [r["seconds"] for r in rs])
    return _link_from_fit(fit, world_size, collective=op == "all_reduce")


def _link_from_fit(fit, n: int, collective: bool):
    from . import sim
    if not collective:
        return sim.Link(fit.latency_s, fit.bandwidth_Bps)
    return sim.Link(fit.latency_s / (2 * (n - 1)), fit.bandwidth_Bps * 2 * (n - 1) / n)


def this_machine(link, *, flops: float, layer_overhead_s: float = 0.0, devices: int = 4,
                 name: str = "this machine (calibrated in this lab)"):
    """A ``sim.Cluster`` for this machine from what a lab measured: one link for every
    pair (loopback), a sustained rate for compute and a fixed cost per layer pass.

    Every device gets a processor of its own (``cores`` left at 0), on purpose: the labs
    set this prediction beside a measurement of simulated devices that share a few
    cores, and the difference between the two is what they discuss. (``sim`` can share
    cores: ``dataclasses.replace(cluster, cores=2)``.)"""
    from . import sim
    return sim.Cluster(name, devices, 8e9, flops=flops, layer_overhead_s=layer_overhead_s,
                       devices_per_node=devices, intra=link, inter=link)


def compute_rate(net, measured) -> float:
    """The sustained FLOP/s a ``sim.Measured`` implies: the network's forward and
    backward arithmetic (3 x the forward's) for its batch, over their seconds."""
    seconds = sum(measured.forward) + sum(measured.backward) - 2 * len(net) * measured.fixed_s
    return 3 * sum(layer.flops for layer in net.layers) * measured.batch / max(seconds, 1e-12)


def fit_compute(flops, seconds, layers: int) -> tuple[float, float]:
    """(FLOP/s, fixed seconds per layer pass) from steps of ``flops`` arithmetic that took
    ``seconds``: a straight line, slope 1/rate, intercept the fixed cost of 2 x layers
    passes (forward and backward of every layer)."""
    import numpy as np
    slope, intercept = np.polyfit(np.asarray(flops, float), np.asarray(seconds, float), 1)
    return 1 / max(slope, 1e-30), max(float(intercept), 0.0) / (2 * layers)


def network_of(model, sample_shape, *, name: str | None = None):
    """The cost model's view (``sim.Network``) of a PyTorch ``nn.Sequential``: one layer
    per Linear or Conv2d, with its parameters, forward FLOPs per sample (2 per
    multiply-add: 2 c_in k^2 c_out per output pixel of a convolution, 2 a b for a
    Linear a -> b) and the elements of its output, found by running one sample through.
    The element-wise layers between them (ReLU, pooling) only add their bytes.
    """
    import torch
    from torch import nn

    from . import sim
    layers, counts = [], {}
    x = torch.zeros(1, *sample_shape)
    with torch.no_grad():
        for module in model:
            y = module(x)
            kind = type(module).__name__
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                params = sum(p.numel() for p in module.parameters())
                if isinstance(module, nn.Linear):
                    flops = 2.0 * module.in_features * module.out_features
                else:
                    k = module.kernel_size[0] * module.kernel_size[1]
                    flops = 2.0 * module.in_channels // module.groups * k * y[0].numel()
                counts[kind] = counts.get(kind, 0) + 1
                layers.append(sim.Layer(f"{kind.lower()}{counts[kind] - 1}", params, flops,
                                        out_elems=y[0].numel(),
                                        saved_elems=x[0].numel() + y[0].numel()))
            elif layers:        # element-wise work after a layer: read and write it
                last = layers[-1]
                layers[-1] = sim.Layer(last.name, last.params, last.flops, y[0].numel(),
                                       last.saved_elems + y[0].numel(),
                                       last.elementwise_bytes + 4.0 * (x[0].numel() + y[0].numel()))
            x = y
    return sim.Network(name or type(model).__name__, tuple(layers),
                       float(torch.zeros(sample_shape).numel()))


def costs_from_phases(net, batch: int, forward_s: float, backward_s: float, update_s: float):
    """``sim.Measured`` costs from a step's measured phases (seconds for ``batch``
    samples), shared among the network's layers in proportion to their FLOPs."""
    from . import sim
    flops = [max(layer.flops, 1.0) for layer in net.layers]
    share = [f / sum(flops) for f in flops]
    return sim.Measured(tuple(forward_s * x for x in share), tuple(backward_s * x for x in share),
                        update_s, batch, net.params, source=f"measured at batch {batch}")


def median_phase(timeline, name: str, rank: int, skip: int = 1) -> float:
    """The median duration of the spans called ``name`` on ``rank`` (the first ``skip``
    left out: start-up)."""
    import statistics
    times = [s.duration for s in timeline.spans if s.rank == rank and s.name == name]
    if not times:
        raise ValueError(f"no span {name!r} on rank {rank}")
    return statistics.median(times[skip:] or times)


def costs_from_pipeline(net, timelines: dict, batch: int, stages: int):
    """``sim.Measured`` per-layer costs from measured pipeline runs (lab 04).

    timelines: {micro-batches m: Timeline} of runs of ``net`` over ``stages`` stages, two
    m or more. A micro-batch of batch / m samples takes F (and B) on a stage: the
    medians of the F<i> (B<i>) spans of every stage, shared equally by the stage's layers
    (the course's pipeline MLP has layers of equal width). A straight line through them
    against the micro-batch size gives each layer's fixed cost and its cost per sample.
    The update: the median "update" span, on each stage's share of the parameters.
    """
    import statistics

    import numpy as np

    from . import sim
    per_stage = len(net) / stages
    sizes, fwd, bwd = [], [], []
    for m, tl in sorted(timelines.items()):
        f = [s.duration for s in tl.spans if s.name[:1] == "F" and s.name[1:].isdigit()]
        b = [s.duration for s in tl.spans if s.name[:1] == "B" and s.name[1:].isdigit()]
        sizes.append(batch / m)
        fwd.append(statistics.median(f) / per_stage)
        bwd.append(statistics.median(b) / per_stage)
    (sf, af), (sb, ab) = np.polyfit(sizes, fwd, 1), np.polyfit(sizes, bwd, 1)
    fixed = max((af + ab) / 2, 0.0)
    ref = max(sizes)
    update = statistics.median(s.duration for tl in timelines.values() for s in tl.spans
                               if s.name == "update") * stages
    n = len(net)
    return sim.Measured(tuple([fixed + max(sf, 0) * ref] * n), tuple([fixed + max(sb, 0) * ref] * n),
                        update, int(ref), net.params, fixed,
                        source=f"measured with {', '.join(map(str, sorted(timelines)))} micro-batches")


# --------------------------------------------------------------------------- the cost model
def _calibration_ranks(rank: int, world_size: int, sizes, batches, steps: int,
                       messages) -> dict:
    """Rank function: lab 00's link sweep on two ranks, then lab 01's traced step on rank 0.

    The sweep (``bandwidth.sweep``: half a ping-pong, and two-rank all-reduces) comes
    first, then how late a receiver that blocked for 20 ms resumes. Then rank 0 trains
    the MLP for ``steps`` steps at each batch size ("forward", "backward", "update"
    spans), twice: back to back, as lab 01 runs, and with a small message to and from
    rank 1 before every phase, as a rank of a distributed step runs
    (``_calibration_steps``).
    """
    from .torch import bandwidth, comm
    links = bandwidth.sweep(rank, world_size, sizes=messages, ops=("send_recv", "all_reduce"))
    wake = _wake_times(rank, repeats=40)
    comm.barrier(name="calibration")
    _calibration_steps(rank, sizes, batches, steps, between_messages=False)
    comm.barrier(name="calibration")
    _calibration_steps(rank, sizes, batches, steps, between_messages=True)
    comm.barrier(name="calibration")
    return {"links": links, "wake": wake}


def _calibration_steps(rank: int, sizes, batches, steps: int, between_messages: bool) -> None:
    """Rank 0 trains the MLP (lr 0), each phase traced; rank 1 only answers messages.

    between_messages: before each phase rank 0 sends rank 1 a small message and blocks
    until it answers. A rank that has just blocked computes slower than one running
    back to back: measured here, 1.3-1.7x for this MLP at batch 64 (its caches went
    cold while it slept, and on a virtual machine its processor was halted); every rank
    of a distributed step blocks between its phases, so its compute is timed this way.
    """
    import torch
    from torch import nn

    from .torch import comm, training
    from .trace import span
    if rank != 0 and not between_messages:
        return                              # nothing to answer
    buf = torch.zeros(2)

    def message() -> None:
        if not between_messages:
            return
        if rank == 0:
            comm.send(buf, 1, name="calibration")
            comm.recv(buf, 1, name="calibration")
        else:
            comm.recv(buf, 0, name="calibration")
            comm.send(buf, 0, name="calibration")

    model = training.build_model("mlp", sizes=sizes, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    loss_fn = nn.CrossEntropyLoss()
    for b in batches:
        x, y = torch.randn(b, sizes[0]), torch.randint(0, sizes[-1], (b,))
        for _ in range(steps):
            message()
            if rank != 0:
                message()
                message()
                continue
            with span("forward"):
                opt.zero_grad()
                loss = loss_fn(model(x), y)
            message()
            with span("backward"):
                loss.backward()
            message()
            with span("update"):
                opt.step()


def _wake_times(rank: int, repeats: int, sleep_s: float = 0.02) -> list[float]:
    """Rank 0: when it sent a small message; rank 1: when its blocked receive returned.

    Rank 1 posts its receive at once and sleeps in it while rank 0 sleeps ``sleep_s``
    first: their difference, less the message's own time, is how late a rank that
    blocked resumes (one host: one monotonic clock, ``time.perf_counter``).
    """
    import time

    import torch

    from .torch import comm
    buf, out = torch.zeros(2), []
    for _ in range(repeats):
        comm.barrier(name="calibration")
        if rank == 0:
            time.sleep(sleep_s)
            out.append(time.perf_counter())
            comm.send(buf, 1)
        elif rank == 1:
            comm.recv(buf, 0)
            out.append(time.perf_counter())
    return out


CALIBRATION_MESSAGES = (4096, 65536, 1 << 18, 1 << 20, 4 << 20)


def measure_this_machine(sizes=(64, 256, 256, 128, 10), *, batches=(32, 128), fit_batches=None,
                         steps: int = 15, messages=CALIBRATION_MESSAGES, devices: int = 4,
                         timeout: float = 300.0) -> dict:
    """Calibrate the cost model here, in one launch of two ranks (PREDICTIONS follow from it).

    Measures lab 00's link (one message, and an all-reduce of two ranks, per size in
    ``messages``), how late a rank that blocked on a message resumes (the cluster's
    ``wake_latency_s``: on a busy CPU the scheduler must give it a core back) and lab
    01's step of the MLP ``sizes`` at each batch size, back to back and between
    messages. Returns {"cluster": a ``sim.Cluster`` of ``devices`` simulated
    devices sharing this machine's cores, with the measured link and collective overhead
    (``sim.measured_link``), "costs": ``sim.Measured`` per-layer costs of the step run
    back to back (lab 01), "costs_between_messages": the same timed as a rank of a
    distributed step computes, after a blocking message (use these for two ranks or
    more), both fitted on ``fit_batches`` (default: all ``batches``), "timelines":
    {batch: the measured single-device steps, back to back}, "timelines_between_messages"
    (the same, between messages), "links": the sweep's records}.
    """
    import os
    import statistics

    from . import sim
    from .trace import Timeline
    batches = tuple(batches)
    res = launch(_calibration_ranks, 2, args=(tuple(sizes), batches, steps, tuple(messages)),
                 timeout=timeout)
    phases = [s for s in res.timeline if s.rank == 0 and s.name in ("forward", "backward", "update")]
    per_run = 3 * steps * len(batches)
    timelines, woken = ({b: Timeline(run[3 * steps * k: 3 * steps * (k + 1)])
                         for k, b in enumerate(batches)}
                        for run in (phases[:per_run], phases[per_run:]))
    net = sim.Network.mlp(sizes)
    fit = tuple(fit_batches or batches)
    costs = sim.Measured.from_timeline({b: timelines[b] for b in fit}, net, skip=2)
    between = sim.Measured.from_timeline({b: woken[b] for b in fit}, net, skip=2)
    records = res.results[0]["links"]
    by_op = {op: {r["bytes"]: r["seconds"] for r in records if r["op"] == op}
             for op in ("send_recv", "all_reduce")}
    link, overhead = sim.measured_link(by_op["send_recv"], by_op["all_reduce"])
    late = [b - a for a, b in zip(res.results[0]["wake"], res.results[1]["wake"])]
    wake = max(statistics.median(late) - link.time(8), 0.0)
    per_pass = [costs.forward_s(i, max(fit)) + costs.backward_s(i, max(fit)) for i in range(len(net))]
    flops = 3 * max(fit) * sum(layer.flops for layer in net.layers) / sum(per_pass)
    cluster = sim.Cluster("this machine (measured)", devices, 8e9, flops, costs.fixed_s, devices,
                          link, link, overhead, wake_latency_s=wake, cores=os.cpu_count() or 1)
    return {"cluster": cluster, "costs": costs, "costs_between_messages": between,
            "timelines": timelines, "timelines_between_messages": woken, "links": records}
