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
    box.predict = lambda: predict(**values())     # for tests and scripts: no widget front-end
    return box


def pipeline_explorer(cfg, forward_s: float = 1.0, backward_s: float = 2.0, transfer_s: float = 0.05):
    """Choose p, m and a schedule: see the predicted timeline; one click measures it.

    The prediction uses ``parlab.schedules.simulate`` with the given relative costs and is
    labelled as predicted. "measure" runs ``parlab.experiments.run_pipeline(cfg, p, m, schedule)`` on p
    ranks and draws the second step as measured.
    """
    import ipywidgets as w
    from IPython.display import display

    from . import plot, schedules
    from .metrics import pipeline_bubble

    # labels as wide as they need (the default 80 px cuts "micro-batches m" short)
    style, wide = {"description_width": "initial"}, w.Layout(width="360px")
    p = w.IntSlider(value=2, min=1, max=4, description="stages p", style=style, layout=wide)
    m = w.IntSlider(value=4, min=1, max=8, description="micro-batches m", style=style, layout=wide)
    name = w.Dropdown(options=["gpipe", "1f1b"], value="1f1b", description="schedule", style=style,
                      layout=w.Layout(width="220px"))
    measure = w.Button(description="measure it", tooltip="runs p ranks (a few seconds)",
                       layout=w.Layout(width="140px"))
    out = w.Output()

    def draw_prediction(*_):
        ops = schedules.make(name.value, p.value, m.value)
        tl = schedules.simulate(ops, p.value, m.value, forward_s, backward_s, transfer_s)
        title = (f"{name.value}, p={p.value}, m={m.value}: bubble {schedules.bubble_share(tl):.2f} "
                 f"(formula (p-1)/(m+p-1) = {pipeline_bubble(p.value, m.value):.2f})")
        with out:
            out.clear_output(wait=True)
            display(plot.timeline(tl, predicted=True, unit="s", title=f"predicted: {title}",
                                  color_by="name"))

    def run_measurement(_):
        from .experiments import run_pipeline
        from .torch import pipeline
        with out:
            out.clear_output(wait=True)
            print(f"running {p.value} ranks ...")
            try:
                res = run_pipeline(cfg, p.value, m.value, name.value)
            except ValueError as err:
                print(f"refused: {err}")
                return
            window = pipeline.step_windows(res.timeline, p.value, m.value)[-1]
            bubble = pipeline.measured_bubble(res.timeline, p.value, m.value)
            out.clear_output(wait=True)
            display(plot.timeline(res.timeline.window(*window), color_by="name",
                                  title=f"measured: {name.value}, p={p.value}, m={m.value}: "
                                        f"bubble {bubble:.2f}"))

    for widget in (p, m, name):
        widget.observe(draw_prediction, names="value")
    measure.on_click(run_measurement)
    draw_prediction()
    return w.VBox([w.HBox([p, m]), w.HBox([name, measure]), out])


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
    here = "this machine (fitted in this lab)"
    clusters = {here: None, **cluster_presets()}

    def costs(cluster):
        c = clusters[cluster]
        if c is None:
            return here_link, unit_s
        return c.intra, unit_flops / c.flops

    def predict(n, nbytes, cluster):
        link, unit = costs(cluster)
        tl = predicted_uneven_all_reduce([unit * (r + 1) for r in range(n)], nbytes, link)
        step = tl.duration
        ring = sim.all_reduce_s(nbytes, n, link)
        return tl, (f"PREDICTED: one step {_t(step)}; the slowest rank computes {_t(unit * n)}, "
                    f"the all-reduce moves {_bytes(2 * (n - 1) / n * nbytes)} per rank in "
                    f"{_t(ring)} ({ring / step:.0%} of the step); link {link}"), \
            f"{n} devices, {_bytes(nbytes)}, {cluster}"

    def measure(n, nbytes, cluster):
        from .launcher import launch
        if n > 4:
            raise ValueError(f"{n} ranks on this machine's few cores would measure the "
                             "operating system's scheduler: choose at most 4")
        run = launch(worker, n, kwargs=dict(numel=max(nbytes // 4, 1)))
        measured = run.timeline.filter(names={"compute", "all_reduce"})
        steps = len(measured.step_windows("compute", rank=0)) or 1
        predicted = predicted_uneven_all_reduce([unit_s * (r + 1) for r in range(n)], nbytes,
                                                here_link, steps=steps)
        return measured, predicted

    controls = {"n": slider("devices n", range(2, 9), 4),
                "nbytes": slider("message", message_sizes([message_bytes]), message_bytes),
                "cluster": choice("cluster", list(clusters))}
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


def cluster_presets() -> dict:
    """Clusters we do not own, by name (``parlab.sim``'s presets, from datasheets)."""
    from . import sim
    return {c.name: c for c in (sim.h100_nodes(1), sim.h100_nodes(2))}
