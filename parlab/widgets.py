"""Interactive explorers for the labs (ipywidgets)."""
from __future__ import annotations


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
