"""Interactive explorers for the labs (ipywidgets).

One pattern for every lab: controls (sliders, drop-downs) whose every move redraws a
PREDICTED figure at once (the cost model, ``parlab.sim``: no process is started), and a
button that measures the chosen setting on this machine, only when clicked, and draws it
next to the prediction for the same setting. ``explorer`` is that pattern; the lab
explorers below only say what to predict and how to measure.
"""
from __future__ import annotations

STYLE = {"description_width": "initial"}


def slider(description: str, options, value=None, width: str = "340px"):
    """A slider over ``options`` (a range of ints: IntSlider; any list: SelectionSlider).

    Labels are as wide as they need (the default 80 px cuts them short); only the
    released position redraws.
    """
    import ipywidgets as w
    layout = w.Layout(width=width)
    if isinstance(options, range) and options.step == 1:
        return w.IntSlider(value=options.start if value is None else value, min=options.start,
                           max=options.stop - 1, description=description, style=STYLE,
                           layout=layout, continuous_update=False)
    options = list(options)
    return w.SelectionSlider(options=options, value=options[0] if value is None else value,
                             description=description, style=STYLE, layout=layout,
                             continuous_update=False)


def choice(description: str, options, value=None, width: str = "340px"):
    """A drop-down over ``options`` (a list, or a dict label -> value)."""
    import ipywidgets as w
    opts = list(options.items()) if isinstance(options, dict) else list(options)
    first = opts[0][1] if isinstance(options, dict) else opts[0]
    return w.Dropdown(options=opts, value=first if value is None else value,
                      description=description, style=STYLE, layout=w.Layout(width=width))


def time_unit(seconds: float) -> str:
    """The unit a timeline of this length reads best in."""
    return "s" if seconds >= 2 else "ms" if seconds >= 2e-3 else "us"


def explorer(predict, controls: dict, *, measure=None, measure_label: str = "measure it here",
             tooltip: str = "starts real ranks on this machine (a few seconds)", per_row: int = 3):
    """Controls that redraw a PREDICTED figure at once; a button that measures, on click.

    predict(**values) -> a PREDICTED ``Timeline`` (drawn dotted, titled as a prediction),
        a Figure, or (either, a line of text shown above it[, what the title adds]). It
        must be quick: it runs on every move.
    controls: name -> widget (``slider``, ``choice`` or any ipywidget with a value); the
        names are predict's and measure's keyword arguments.
    measure(**values) -> (measured Timeline, PREDICTED Timeline) drawn side by side, a
        Figure, or text; may raise ValueError to refuse a setting (its message is shown).
        Nothing is measured unless the button is clicked.
    """
    import ipywidgets as w
    from IPython.display import display

    from . import plot
    out, text = w.Output(), w.HTML()

    def values():
        return {name: c.value for name, c in controls.items()}

    def show(result):
        title = "PREDICTED (cost model)"
        if isinstance(result, tuple):
            result, text.value, *rest = result
            title = f"{title}: {rest[0]}" if rest else title
        if hasattr(result, "spans"):      # a Timeline
            result = plot.timeline(result, predicted=True, color_by="name", title=title,
                                   unit=time_unit(result.duration))
        display(result)

    def draw(*_):
        with out:
            out.clear_output(wait=True)
            try:
                show(predict(**values()))
            except ValueError as err:
                text.value = f"<b>not possible:</b> {err}"

    def run(_):
        with out:
            out.clear_output(wait=True)
            print("measuring on this machine ...")
            try:
                result = measure(**values())
            except ValueError as err:
                out.clear_output(wait=True)
                print(f"refused: {err}")
                return
            out.clear_output(wait=True)
            if isinstance(result, tuple) and len(result) == 2 and hasattr(result[0], "spans"):
                from .experiments import measured_vs_predicted
                result = measured_vs_predicted(*result, color_by="name",
                                               unit=time_unit(result[0].duration))
            if isinstance(result, str):
                print(result)
            else:
                display(result)

    for c in controls.values():
        c.observe(draw, names="value")
    widgets = list(controls.values())
    rows = [w.HBox(widgets[i:i + per_row]) for i in range(0, len(widgets), per_row)]
    if measure is not None:
        button = w.Button(description=measure_label, tooltip=tooltip,
                          layout=w.Layout(width="180px"))
        button.on_click(run)
        rows.append(button)
    draw()
    box = w.VBox([*rows, text, out])
    # for tests and scripts, without a widget front-end
    box.predict = lambda: predict(**values())
    box.measure = lambda: measure(**values())
    return box


def pipeline_explorer(cfg, here=None, costs=None):
    """Lab 04: choose p, m, a schedule and a cluster: the PREDICTED step at once; one
    click measures it.

    cfg: the lab's pipeline (``SplitConfig``: an MLP and its batch). here, costs: this
    machine and the MLP's per-layer costs as the lab calibrated them (``sim.Measured``);
    without them only the GPU clusters are offered. The prediction is
    ``sim.pipeline``: GPipe and 1F1B cut where this lab's executor cuts
    (``pipeline.stage_bounds``), interleaved balanced by cost; "measure it here" runs
    ``experiments.run_pipeline(cfg, p, m, schedule)`` on p ranks and draws its last step
    next to the prediction for the same stages.
    """
    from . import sim
    from .metrics import pipeline_bubble
    net = sim.Network.mlp(cfg.sizes)

    def predicted(p, m, schedule, cluster, bounds=None):
        return sim.pipeline(net, cluster_for(cluster, p, here), cfg.batch_size, stages=p,
                            micro_batches=m, schedule=schedule, bounds=bounds,
                            costs=costs if cluster == HERE else None)

    cuts = {}

    def executor_cut(p):
        """The stages this lab's executor runs (``pipeline.stage_bounds``), as Linear indices."""
        if p not in cuts:
            from .torch import pipeline
            # module index -> Linear layer index (the MLP alternates Linear and ReLU)
            cuts[p] = [b // 2 for b in pipeline.stage_bounds(cfg, p)]
        return cuts[p]

    def predict(p, m, schedule, cluster):
        # gpipe and 1f1b: the executor's own cut, as lab 04 predicts it and "measure it here"
        # runs it; interleaved (not run here): two chunks per device, balanced by cost
        tl = predicted(p, m, schedule, cluster,
                       executor_cut(p) if schedule in ("gpipe", "1f1b") else None)
        lost = sum(tl.seconds_by_kind(r)["idle"] + tl.seconds_by_kind(r)["wait"]
                   for r in tl.ranks) / (len(tl.ranks) * tl.duration)
        return tl, (f"PREDICTED: one step {_t(tl.step_s)}; the stages idle or wait {lost:.0%} "
                    f"of it (GPipe's and 1F1B's bubble (p-1)/(m+p-1) = {pipeline_bubble(p, m):.0%})"), \
            f"{schedule}, p = {p}, m = {m}, {cluster_for(cluster, p, here).name}"

    def measure(p, m, schedule, cluster):
        from .experiments import run_pipeline
        from .torch import pipeline
        _only_here(cluster, p)
        if schedule not in ("gpipe", "1f1b"):
            raise ValueError("this lab's executor runs gpipe and 1f1b: choose one of them")
        res = run_pipeline(cfg, p, m, schedule)
        window = pipeline.step_windows(res.timeline, p, m)[-1]
        # module index -> Linear layer index (the MLP alternates Linear and ReLU)
        bounds = [b // 2 for b in pipeline.prepare(cfg, p, m, schedule)[0].bounds]
        return res.timeline.window(*window), predicted(p, m, schedule, cluster, bounds)

    clusters = cluster_choices(here if costs is not None else None)
    controls = {"p": slider("stages p", range(1, 5), 2),
                "m": slider("micro-batches m", range(1, 9), 4),
                "schedule": choice("schedule", ["1f1b", "gpipe", "interleaved"]),
                "cluster": choice("cluster", clusters)}
    return explorer(predict, controls, measure=measure)


# ------------------------------------------------------------------ lab 00
def message_sizes(extra=()) -> list:
    """(label, bytes) from 4 B to 1 GB in powers of 2, and ``extra`` sizes, in order."""
    return [(_bytes(b), b) for b in sorted({*(2 ** k for k in range(2, 31)), *extra})]


def all_reduce_explorer(worker, here_link, unit_s: float, *, unit_flops: float,
                        message_bytes: int = 10_000):
    """Lab 00's first collective, PREDICTED for n devices, a message size and a cluster.

    worker: the lab's ``first_allreduce(rank, world_size, steps, numel)``: rank r does
    r + 1 units of work, then all-reduces ``numel`` floats. here_link: the link fitted
    in the lab (``sim.Link``); unit_s: one unit of work as measured here; unit_flops:
    the arithmetic of one unit, which sets its time on the other clusters (their
    sustained FLOP/s). "measure it here" launches ``worker`` on n ranks (at most 4).
    """
    from . import sim
    from .experiments import predicted_uneven_all_reduce

    def costs(cluster, n):
        if cluster == HERE:
            return here_link, unit_s
        c = cluster_for(cluster, n)
        return c.link(n), unit_flops / c.flops

    def predict(n, nbytes, cluster):
        link, unit = costs(cluster, n)
        tl = predicted_uneven_all_reduce([unit * (r + 1) for r in range(n)], nbytes, link)
        step = tl.duration
        ring = sim.all_reduce_s(nbytes, n, link)
        return tl, (f"PREDICTED: one step {_t(step)}; the slowest rank computes {_t(unit * n)}, "
                    f"the all-reduce moves {_bytes(2 * (n - 1) / n * nbytes)} per rank in "
                    f"{_t(ring)} ({ring / step:.0%} of the step); link {link}"), \
            f"{n} devices, {_bytes(nbytes)}, {cluster}"

    def measure(n, nbytes, cluster):
        from .experiments import measured_vs_predicted
        from .launcher import launch
        _only_here(cluster, n)
        run = launch(worker, n, kwargs=dict(numel=max(nbytes // 4, 1)))
        measured = run.timeline.filter(names={"compute", "all_reduce"})
        steps = len(measured.step_windows("compute", rank=0)) or 1
        predicted = predicted_uneven_all_reduce([unit_s * (r + 1) for r in range(n)], nbytes,
                                                here_link, steps=steps)
        return measured_vs_predicted(
            measured, predicted, color_by="name",
            unit=time_unit(max(measured.duration, predicted.duration)),
            title=f"{n} devices, {_bytes(nbytes)}, {cluster}: rank r does r + 1 units, {steps} steps")

    controls = {"n": slider("devices n", range(2, 9), 4),
                "nbytes": slider("message", message_sizes([message_bytes]), message_bytes),
                "cluster": choice("cluster", [HERE, *_gpu_clusters()])}
    return explorer(predict, controls, measure=measure)


def _t(seconds: float) -> str:
    return (f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3
            else f"{seconds * 1e6:.3g} µs")


def _bytes(n: float) -> str:
    """Powers of two in KB of 1024 (16 KB), other sizes in KB of 1000 (10 KB)."""
    base = 1024 if n >= 1 and int(n) == n and int(n) & (int(n) - 1) == 0 else 1000
    for unit, size in (("GB", base ** 3), ("MB", base ** 2), ("KB", base)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


# ------------------------------------------------------------------ clusters
def _gpu_clusters() -> dict:
    """Hardware the learner may not own, label -> (n devices -> ``sim.Cluster``).

    The figures are ``parlab.sim.clusters``' (vendors' datasheets, derated to sustained
    rates, sources cited there). "one per node" puts every GPU in a node of its own, so
    that every group talks over InfiniBand even with a few devices.
    """
    import math
    from dataclasses import replace

    from . import sim

    def one_per_node(n):
        c = sim.h100_infiniband(max(2, math.ceil(n / 8)))
        return replace(c, name=f"{n} × H100, one per node (InfiniBand NDR)", devices_per_node=1)
    return {"T4 GPUs on PCIe (Kaggle's free pair)": sim.t4_pcie,
            "A100 GPUs on NVLink (DGX A100)": sim.a100_nvlink,
            "H100 GPUs on NVLink (DGX H100)": sim.h100_nvlink,
            "H100 nodes of 8 on InfiniBand": lambda n: sim.h100_infiniband(max(2, math.ceil(n / 8))),
            "H100 GPUs, one per node, on InfiniBand": one_per_node}


HERE = "this machine (calibrated in this lab)"


def cluster_choices(here=None) -> list[str]:
    """The labels of a cluster drop-down: this machine first (when calibrated), then GPUs."""
    return ([HERE] if here is not None else []) + list(_gpu_clusters())


def cluster_for(label: str, devices: int, here=None):
    """The cluster called ``label`` with at least ``devices`` devices (PREDICTED hardware;
    this machine keeps its calibrated rates and link, whatever the count)."""
    from dataclasses import replace
    if label == HERE:
        n = max(devices, here.devices)
        return replace(here, devices=n, devices_per_node=n)
    return _gpu_clusters()[label](max(devices, 1))


WIDTHS = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]


def _mlp(width: int):
    """The course's MLP with its hidden widths scaled: 64 -> w -> w -> w/2 -> 10."""
    return (64, width, width, max(width // 2, 1), 10)


def _here_costs(cluster: str, net, measured, lab_net):
    """This machine's measured per-layer costs for the lab's own network, else the
    roofline at the cluster's rates (``None``: ``sim``'s default)."""
    return measured if cluster == HERE and measured is not None and net == lab_net else None


# ------------------------------------------------------------------ lab 03
def tensor_parallel_explorer(here, *, batch: int = 64):
    """Lab 03: slice the MLP's layers over n devices, naive or column-then-row (PREDICTED).

    here: this machine as the lab calibrated it (``experiments.this_machine``). The
    hidden width scales the MLP (64 -> w -> w -> w/2 -> 10). "measure it here" trains
    the sliced MLP on n ranks of this machine (``tensor_parallel.train_sliced``).
    """
    from . import sim

    def predict(width, n, scheme, cluster):
        net, c = sim.Network.mlp(_mlp(width)), cluster_for(cluster, n, here)
        tl = sim.tensor_parallel(net, c, batch, devices=n, scheme=scheme)
        one = sim.single_device(net, c, batch)
        comm = tl.seconds_by_kind(0)["comm"] + tl.seconds_by_kind(0)["wait"]
        return tl, (f"PREDICTED: one step {_t(tl.step_s)} on {n} devices, {_t(one.step_s)} on "
                    f"one: speed-up {one.step_s / tl.step_s:.2f}x; in collectives "
                    f"{comm / tl.duration:.0%} of the step (rank 0)"), \
            f"{scheme}, width {width}, {n} devices, {c.name}"

    def measure(width, n, scheme, cluster):
        from .launcher import launch
        from .torch import tensor_parallel as tp
        _only_here(cluster, n)
        steps = 6
        run = launch(tp.train_sliced, n, kwargs=dict(sizes=_mlp(width), scheme=scheme,
                                                     steps=steps, batch_size=batch))
        durations = [run.timeline.step(k).duration for k in range(2, steps)]
        k = 2 + sorted(range(len(durations)), key=durations.__getitem__)[len(durations) // 2]
        net = sim.Network.mlp(_mlp(width))
        return run.timeline.step(k), sim.tensor_parallel(net, cluster_for(HERE, n, here), batch,
                                                         devices=n, scheme=scheme)

    controls = {"width": slider("hidden width w", WIDTHS, 256),
                "n": slider("devices n", [2, 4, 8], 2),
                "scheme": choice("scheme", ["column_row", "naive"]),
                "cluster": choice("cluster", cluster_choices(here))}
    return explorer(predict, controls, measure=measure)


# ------------------------------------------------------------------ lab 05
# bucket count (sim) -> DDP's bucket cap measuring it here (lab 05: 25 MB gives one
# bucket for the MLP, 0.2 MB two, a tiny cap one per layer)
BUCKETS = {"one bucket": 1, "2 buckets": 2, "one bucket per layer": 4}
BUCKET_CAP_MB = {1: 25.0, 2: 0.2, 4: 0.004}


def data_parallel_explorer(here, measured=None, *, sizes=(64, 256, 256, 128, 10),
                           global_batch: int = 128):
    """Lab 05: n replicas, gradients averaged by ring all-reduce in buckets (PREDICTED).

    here: this machine as the lab calibrated it; measured: its per-layer costs of the
    lab's MLP (``sim.Measured``), used for this machine at the lab's width (else the
    roofline at the calibrated rate). "measure it here" runs DDP with the bucket cap
    that gives the chosen buckets (overlap), or lab 05's averaging by hand (no overlap:
    one all-reduce per tensor after the backward, whatever the buckets say).
    """
    from . import sim
    lab_net = sim.Network.mlp(sizes)
    lab_width = sizes[1]

    def predicted(width, n, buckets, overlap, cluster, steps=1):
        net = sim.Network.mlp(_mlp(width)) if width != lab_width else lab_net
        c = cluster_for(cluster, n, here)
        costs = _here_costs(cluster, net, measured, lab_net)
        tl = sim.data_parallel(net, c, global_batch, devices=n, buckets=buckets,
                               overlap=overlap, steps=steps, costs=costs)
        return net, c, costs, tl

    def predict(n, width, buckets, overlap, cluster):
        net, c, costs, tl = predicted(width, n, buckets, overlap, cluster)
        one = sim.single_device(net, c, global_batch, costs=costs)
        shown = tl if n <= 2 else tl.filter(ranks=[r for r in tl.ranks if r % n < 2])
        note = " (replicas 0 and 1 drawn: the others do the same)" if n > 2 else ""
        return shown, (f"PREDICTED{note}: one step {_t(tl.step_s)} on {n} replicas of "
                    f"{global_batch // n} samples, {_t(one.step_s)} on one device with all "
                    f"{global_batch}: speed-up {one.step_s / tl.step_s:.2f}x; gradients "
                    f"{_bytes(net.params * net.grad_wire_bytes)} per all-reduce round"), \
            f"data parallel, {n} replicas, width {width}, {c.name}"

    def measure(n, width, buckets, overlap, cluster):
        from .launcher import launch
        from .torch import data_parallel as dp
        from .trace import Timeline
        _only_here(cluster, n)
        if width != lab_width:
            raise ValueError(f"measuring here runs the lab's MLP: choose width {lab_width}")
        mode = "ddp" if overlap else "by_hand"
        run = launch(dp.train_data_parallel, n, kwargs=dict(
            mode=mode, global_batch=global_batch, steps=10, bucket_mb=BUCKET_CAP_MB[buckets]))
        labels = {r: f"rank {r}" for r in range(n)}
        labels.update({n + r: f"rank {r} buckets" for r in range(n)})
        tl = Timeline(run.timeline.spans, labels)
        done = run.results[0]["buckets_each_step"][-1] if overlap else "per_tensor"
        *_, pred = predicted(width, n, done, overlap, cluster, steps=2)
        return tl.step(-3, count=2), pred

    controls = {"n": slider("replicas n", [2, 4, 8], 2),
                "width": slider("hidden width w", WIDTHS, lab_width),
                "buckets": choice("gradients in", BUCKETS),
                "overlap": _checkbox("overlap with the backward (DDP)", True),
                "cluster": choice("cluster", cluster_choices(here))}
    return explorer(predict, controls, measure=measure)


def _only_here(cluster: str, ranks: int, most: int = 4) -> None:
    """Refuse, in words, what "measure it here" cannot measure."""
    if cluster != HERE:
        raise ValueError("this machine can only measure itself: choose it as the cluster")
    if ranks > most:
        raise ValueError(f"{ranks} processes on this machine's few cores would measure the "
                         f"operating system's scheduler: choose at most {most}")


def _checkbox(description: str, value: bool):
    import ipywidgets as w
    return w.Checkbox(value=value, description=description, style=STYLE,
                      layout=w.Layout(width="340px"))


# ------------------------------------------------------------------ lab 06
def parameter_server_explorer(here, measured=None, net=None, *, per_worker: int = 32):
    """Lab 06: a parameter server and n workers, one of them slower (PREDICTED).

    here: this machine as the lab calibrated it; measured: the per-layer costs of the
    lab's model measured here (``sim.Measured``); net: that model (``sim.Network``, e.g.
    ``experiments.network_of(models.cnn(), (1, 8, 8))``). Every worker takes
    ``per_worker`` samples a step (lab 06: 2 workers, global batch 64), whatever their
    number. Throughput counts the gradients the server applies per second. "measure it here" runs
    ``parameter_server.train_parameter_server`` with the lab's CNN (at most 3 workers).
    """
    from . import sim

    def predicted(workers, slow, mode, cluster, steps):
        c = cluster_for(cluster, workers + 1, here)
        costs = measured if cluster == HERE else None
        return sim.parameter_server(net, c, per_worker * workers, workers=workers, mode=mode,
                                    slow={workers: slow} if slow > 1 else None, steps=steps,
                                    costs=costs)

    def rate(tl):
        pushes = [s for s in tl.spans if s.rank == 0 and s.kind == "comm"
                  and s.name == "receive gradients"]
        return len(pushes) / (max(s.end for s in pushes) - tl.start)

    def predict(workers, slow, mode, cluster):
        tl = predicted(workers, slow, mode, cluster, 12)
        other = predicted(workers, slow, "async" if mode == "sync" else "sync", cluster, 12)
        sync, async_ = (tl, other) if mode == "sync" else (other, tl)
        return tl, (f"PREDICTED: {rate(tl):,.0f} gradients per second {mode}hronously; "
                    f"asynchronous / synchronous throughput {rate(async_) / rate(sync):.2f}x"), \
            f"{mode}, {workers} workers, the last {slow}x slower, {cluster_for(cluster, workers + 1, here).name}"

    def measure(workers, slow, mode, cluster):
        from .launcher import launch
        from .torch import parameter_server as ps
        _only_here(cluster, workers + 1)
        run = launch(ps.train_parameter_server, workers + 1, kwargs=dict(
            mode=mode, model="cnn", global_batch=per_worker * workers, steps=30, lr=0.2,
            slow={workers: slow} if slow > 1 else None))
        tl = run.timeline
        mid = tl.start + tl.duration / 2
        pred = predicted(workers, slow, mode, cluster, 20)
        width = min(0.05, pred.duration / 2)
        pmid = pred.start + pred.duration / 2
        return tl.window(mid, mid + width), pred.window(pmid, pmid + width)

    controls = {"workers": slider("workers", range(2, 9), 2),
                "slow": slider("last worker slower by", [1, 1.5, 2, 3, 4, 6], 3),
                "mode": choice("server", ["sync", "async"]),
                "cluster": choice("cluster", cluster_choices(here))}
    return explorer(predict, controls, measure=measure)


# ------------------------------------------------------------------ lab 07
def strategy_explorer(here=None, *, global_batches=None):
    """Choose a model, a cluster and a mesh shape: the PREDICTED step and memory at once.

    here: the cluster calibrated on this machine (``survey_hybrid(...)["cluster"]``); with
    it, "measure it here" runs the chosen dp × tp or dp × pp shape of the lab's MLP on
    this machine's 4 devices. Every other number is the cost model's (``parlab.sim``).
    """
    import ipywidgets as w
    from IPython.display import display

    from . import sim
    from .experiments import plot_step_parts, run_hybrid, step_seconds
    workloads = sim.presets()
    clusters = {}
    if here is not None:
        clusters[f"{here.name} ({here.devices} devices, calibrated)"] = here
    # hardware the learner does not own: the cost model's presets (sim.clusters, datasheets)
    for c in (sim.t4_pcie(2), sim.a100_nvlink(8), sim.h100_nodes(1), sim.h100_nodes(2),
              sim.h100_nodes(16)):
        clusters[c.name] = c
    batches = global_batches or {"lab MLP 64-256-256-128-10": 64, "GPT-2 XL (1.5 B)": 512,
                                 "GPT-3 (175 B)": 1536}
    model = w.Dropdown(options=list(workloads), description="model")
    cluster = w.Dropdown(options=list(clusters), description="cluster")
    tp = w.SelectionSlider(options=[1], description="tp", continuous_update=False)
    pp = w.SelectionSlider(options=[1], description="pp", continuous_update=False)
    # -4: the lab's setting, 4 micro-batches per replica in a pipeline, the whole batch otherwise
    micro = w.Dropdown(options=[("whole batch", 0), ("m = 4 in a pipeline", -4)]
                       + [(f"{k} samples", k) for k in (1, 2, 4, 8, 16, 32, 64)],
                       value=0, description="micro-batch")
    inner = w.ToggleButtons(options=["tp innermost", "dp innermost"], description="order")
    overlap = w.Checkbox(value=False, description="dp overlaps backward (DDP)")
    measure = w.Button(description="measure it here", tooltip="4 ranks on this machine")
    out, text = w.Output(), w.HTML()

    def divisors(n):
        return [d for d in range(1, n + 1) if n % d == 0]

    def plan_of(dp_, tp_, pp_, batch):
        b = batch // dp_
        if micro.value < 0:
            m = -micro.value if pp_ > 1 and b % -micro.value == 0 else 1
        else:
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
        # (the lab MLP: m = 4 in a pipeline, as measured in the lab)
        micro.value = -4 if model.value.startswith("lab") else 4
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
        scale, unit = next((f, u) for f, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B"))
                           if mem["total"] >= f or f == 1)
        links = ", ".join(f"{a} over the {'fast (inside a node)' if k == 'intra' else 'slow (between nodes)'} link"
                          for a, k in picked.links.items()) or "no communication"
        step = (f"{picked.step_s:,.2f} s" if picked.step_s >= 1 else f"{picked.step_s * 1e3:,.2f} ms")
        text.value = (f"<b>PREDICTED for {picked.plan.label()}</b> (m = {picked.plan.micro_batches} "
                      f"micro-batches per replica): step {step}; memory per "
                      f"device {mem['total'] / scale:,.1f} {unit} of {cl.memory_bytes / gb:,.0f} GB "
                      f"(states {mem['states'] / scale:,.1f} {unit}, activations "
                      f"{mem['activations'] / scale:,.1f} {unit}): "
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
