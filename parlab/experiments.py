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


def strategy_explorer(here=None, *, global_batches=None):
    """Choose a model, a cluster and a mesh shape: the PREDICTED step and memory at once.

    here: the cluster calibrated on this machine (``survey_hybrid(...)["cluster"]``); with
    it, "measure it here" runs the chosen dp × tp or dp × pp shape of the lab's MLP on
    this machine's 4 devices. Every other number is the cost model's (``parlab.sim``).
    """
    import ipywidgets as w
    from IPython.display import display

    from . import sim
    workloads = sim.presets()
    clusters = {}
    if here is not None:
        clusters[f"{here.name} ({here.devices} devices, calibrated)"] = here
    for nodes in (1, 2, 16):
        c = sim.h100_nodes(nodes)
        clusters[c.name] = c
    batches = global_batches or {"lab MLP 64-256-256-128-10": 64, "GPT-2 XL (1.5 B)": 512,
                                 "GPT-3 (175 B)": 1536}
    model = w.Dropdown(options=list(workloads), description="model")
    cluster = w.Dropdown(options=list(clusters), description="cluster")
    tp = w.SelectionSlider(options=[1], description="tp", continuous_update=False)
    pp = w.SelectionSlider(options=[1], description="pp", continuous_update=False)
    micro = w.Dropdown(options=[("whole batch", 0)] + [(f"{k} samples", k) for k in
                                                       (1, 2, 4, 8, 16, 32, 64)],
                       value=0, description="micro-batch")
    inner = w.ToggleButtons(options=["tp innermost", "dp innermost"], description="order")
    overlap = w.Checkbox(value=False, description="dp overlaps backward (DDP)")
    measure = w.Button(description="measure it here", tooltip="4 ranks on this machine")
    out, text = w.Output(), w.HTML()

    def divisors(n):
        return [d for d in range(1, n + 1) if n % d == 0]

    def plan_of(dp_, tp_, pp_, batch):
        b = batch // dp_
        m = max(b // micro.value, 1) if micro.value and b % micro.value == 0 else 1
        order = AXES_INNER[inner.value]
        return sim.Plan(dp=dp_, tp=tp_, pp=pp_, micro_batches=m, order=order)

    busy = []          # set while the choices are being rebuilt: draw once, at the end

    def refresh_pp(*_):
        n, layers = clusters[cluster.value].devices, workloads[model.value].layers
        keep = pp.value
        busy.append(1)
        pp.options = [d for d in divisors(n // tp.value) if d <= layers]
        pp.value = keep if keep in pp.options else 1
        busy.pop()
        draw()

    def refresh_choices(*_):
        n = clusters[cluster.value].devices
        busy.append(1)
        tp.options = divisors(n)
        tp.value = 2 if n % 2 == 0 else 1
        # language models: a few sequences per micro-batch, or the activations never fit
        micro.value = 0 if model.value.startswith("lab") else 4
        busy.pop()
        refresh_pp()

    def draw(*_):
        if busy or tp.value is None or pp.value is None:
            return
        wl, cl, batch = workloads[model.value], clusters[cluster.value], batches[model.value]
        n = cl.devices
        if n % (tp.value * pp.value):
            text.value = f"<b>tp × pp = {tp.value * pp.value} does not divide {n} devices</b>"
            return
        chosen = (n // (tp.value * pp.value), tp.value, pp.value)
        shapes = sorted({(n // t, t, 1) for t in divisors(n)} | {(n // p, 1, p) for p in divisors(n)
                        if p <= wl.layers} | {chosen}, key=lambda s: (s[2] > 1, -s[0], s[2]))
        entries, picked = [], None
        for dp_, tp_, pp_ in shapes:
            if batch % dp_:
                continue
            try:
                pred = sim.predict(wl, cl, plan_of(dp_, tp_, pp_, batch), batch,
                                   overlap_dp=overlap.value)
            except ValueError:
                continue
            label = pred.plan.label().replace(" × ", "\n× ")
            entries.append(("▶ " + label if (dp_, tp_, pp_) == chosen else label, pred, None))
            if (dp_, tp_, pp_) == chosen:
                picked = pred
        with out:
            out.clear_output(wait=True)
            unit = "s" if max(e[1].step_s for e in entries) >= 1 else "ms"
            display(plot_step_parts(entries, unit=unit, title=f"PREDICTED: {wl.name}, global "
                                                              f"batch {batch}, on {cl.name}"))
        if picked is None:
            text.value = "<b>the chosen shape does not split this batch</b>"
            return
        mem, gb = picked.memory, 1e9
        links = ", ".join(f"{a} over the {'fast (inside a node)' if k == 'intra' else 'slow (between nodes)'} link"
                          for a, k in picked.links.items()) or "no communication"
        step = (f"{picked.step_s:,.2f} s" if picked.step_s >= 1 else f"{picked.step_s * 1e3:,.2f} ms")
        text.value = (f"<b>PREDICTED for {picked.plan.label()}</b> (m = {picked.plan.micro_batches} "
                      f"micro-batches per replica): step {step}; memory per "
                      f"device {mem['total'] / gb:,.1f} GB of {cl.memory_bytes / gb:,.0f} GB "
                      f"(states {mem['states'] / gb:,.1f}, activations {mem['activations'] / gb:,.1f}): "
                      f"{'fits' if picked.fits else '<b>does not fit</b>'}; {links}.")

    def run_here(_):
        with out:
            if here is None or clusters[cluster.value] is not here or not model.value.startswith("lab"):
                print("measuring needs this machine's cluster and the lab MLP")
                return
            shape = ({"dp": here.devices // tp.value, "tp": tp.value} if pp.value == 1
                     else {"dp": here.devices // pp.value, "pp": pp.value})
            if tp.value > 1 and pp.value > 1:
                print("measured here: dp × tp or dp × pp (not both model axes at once)")
                return
            batch = batches[model.value]
            plan = plan_of(shape["dp"], tp.value, pp.value, batch)
            if pp.value == 1:       # dp × tp runs the replica's batch whole
                plan = sim.Plan(dp=plan.dp, tp=plan.tp, order=plan.order)
            print(f"measuring {shape} on {here.devices} ranks ...")
            res = run_hybrid(shape, global_batch=batch, steps=8,
                             micro_batches=plan.micro_batches)
            marker = "forward" if "tp" in shape else "F0"
            pred = sim.predict(workloads[model.value], here, plan, batch)
            print(f"{plan.label()}, m = {plan.micro_batches}: measured here "
                  f"{step_seconds(res.timeline, marker) * 1e3:.2f} ms per step, "
                  f"PREDICTED {pred.step_s * 1e3:.2f} ms")

    for widget in (model, cluster):
        widget.observe(refresh_choices, names="value")
    tp.observe(lambda change: None if busy else refresh_pp(), names="value")
    for widget in (pp, micro, inner, overlap):
        widget.observe(draw, names="value")
    measure.on_click(run_here)
    refresh_choices()
    return w.VBox([w.HBox([model, cluster]), w.HBox([tp, pp, micro]), w.HBox([inner, overlap]),
                   measure, text, out])


AXES_INNER = {"tp innermost": ("dp", "pp", "tp"), "dp innermost": ("tp", "pp", "dp")}


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



# --------------------------------------------------------------------------- the cost model
def _calibration_ranks(rank: int, world_size: int, sizes, batches, steps: int,
                       messages) -> dict:
    """Rank function: lab 00's link sweep on two ranks, then lab 01's traced step on rank 0.

    The sweep (``bandwidth.sweep``: half a ping-pong, and two-rank all-reduces) comes
    first; then rank 0 alone trains the MLP for ``steps`` steps at each batch size
    ("forward", "backward", "update" spans) while the other rank waits at a barrier.
    """
    import torch
    from torch import nn

    from .torch import bandwidth, comm, training
    from .trace import span
    links = bandwidth.sweep(rank, world_size, sizes=messages, ops=("send_recv", "all_reduce"))
    wake = _wake_times(rank, repeats=15)
    comm.barrier(name="calibration")
    if rank == 0:
        model = training.build_model("mlp", sizes=sizes, seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        loss_fn = nn.CrossEntropyLoss()
        for b in batches:
            x, y = torch.randn(b, sizes[0]), torch.randint(0, sizes[-1], (b,))
            for _ in range(steps):
                with span("forward"):
                    opt.zero_grad()
                    loss = loss_fn(model(x), y)
                with span("backward"):
                    loss.backward()
                with span("update"):
                    opt.step()
    comm.barrier(name="calibration")
    together = _compute_together(rank, sizes, rounds=3 * steps)
    comm.barrier(name="calibration")
    return {"links": links, "wake": wake, "together": together}


def _compute_together(rank: int, sizes, rounds: int, batch: int = 64) -> dict:
    """How the cores are shared: rank 0 computes alone, then both ranks at once.

    Each round: a forward and backward of the MLP at ``batch``, timed, then a barrier
    (so both compute at the same moments). Returns {"alone": rank 0's times alone
    (empty on rank 1), "together": this rank's times with its peer computing}.
    """
    import time

    import torch

    from .torch import comm, training
    model = training.build_model("mlp", sizes=sizes, seed=rank)
    x = torch.randn(batch, sizes[0])

    def work() -> float:
        t = time.perf_counter()
        model(x).square().mean().backward()
        return time.perf_counter() - t

    alone = [work() for _ in range(rounds)] if rank == 0 else []
    together = []
    for _ in range(rounds):
        comm.barrier(name="calibration")
        together.append(work())
    return {"alone": alone, "together": together}


def _shared_cores(results, cores: int) -> float:
    """The cores two computing ranks get here: 2 / (their slowdown against one alone),
    at most the machine's (other work on the machine takes the rest)."""
    import statistics
    alone = statistics.median(results[0]["together"]["alone"][2:])
    both = statistics.median(results[0]["together"]["together"][2:]
                             + results[1]["together"]["together"][2:])
    shared = 2.0 * alone / both if both > 0 else cores
    return shared if shared < cores else cores


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
    01's step of the MLP ``sizes`` at each batch size, and how many cores two computing
    ranks get ("shared_cores": fewer than the machine's when other work takes some;
    reported, not used by the model: a snapshot of a load that drifts). Returns
    {"cluster": a ``sim.Cluster`` of ``devices`` simulated devices sharing this machine's
    cores, with the measured link and collective overhead (``sim.measured_link``), "costs": ``sim.Measured`` per-layer
    costs fitted on ``fit_batches`` (default: all ``batches``), "timelines": {batch: the
    measured single-device steps}, "links": the sweep's records}.
    """
    import os

    from . import sim
    from .trace import Timeline
    batches = tuple(batches)
    res = launch(_calibration_ranks, 2, args=(tuple(sizes), batches, steps, tuple(messages)),
                 timeout=timeout)
    phases = [s for s in res.timeline if s.rank == 0 and s.name in ("forward", "backward", "update")]
    timelines = {b: Timeline(phases[3 * steps * k: 3 * steps * (k + 1)])
                 for k, b in enumerate(batches)}
    net = sim.Network.mlp(sizes)
    fit = tuple(fit_batches or batches)
    costs = sim.Measured.from_timeline({b: timelines[b] for b in fit}, net, skip=2)
    records = res.results[0]["links"]
    by_op = {op: {r["bytes"]: r["seconds"] for r in records if r["op"] == op}
             for op in ("send_recv", "all_reduce")}
    link, overhead = sim.measured_link(by_op["send_recv"], by_op["all_reduce"])
    late = sorted(b - a for a, b in zip(res.results[0]["wake"], res.results[1]["wake"]))
    wake = max(late[len(late) // 2] - link.time(8), 0.0)
    per_pass = [costs.forward_s(i, max(fit)) + costs.backward_s(i, max(fit)) for i in range(len(net))]
    flops = 3 * max(fit) * sum(layer.flops for layer in net.layers) / sum(per_pass)
    cluster = sim.Cluster("this machine (measured)", devices, 8e9, flops, costs.fixed_s, devices,
                          link, link, overhead, wake_latency_s=wake, cores=os.cpu_count() or 1)
    return {"cluster": cluster, "costs": costs, "timelines": timelines, "links": records,
            "shared_cores": _shared_cores(res.results, os.cpu_count() or 1)}
