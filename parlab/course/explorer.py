"""The explorer pattern: sliders that predict at once, and a button that measures.

Each lab's explorer shows the cost model's prediction for the chosen setting at once (on
this machine or a GPU cluster), and measures the chosen setting here only when the
button is clicked, drawing it next to the prediction for the same setting. ``explorer``
is that pattern; the labs' modules only say what to predict and how to measure.
"""
from __future__ import annotations

from .. import missing

STYLE = {"description_width": "initial"}


def slider(description: str, options, value=None, width: str = "340px"):
    """A slider over ``options`` (a range of ints: IntSlider; any list: SelectionSlider).

    Labels are as wide as they need (the default 80 px cuts them short); only the
    released position redraws.
    """
    w = missing.widgets()
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
    w = missing.widgets()
    opts = list(options.items()) if isinstance(options, dict) else list(options)
    first = opts[0][1] if isinstance(options, dict) else opts[0]
    return w.Dropdown(options=opts, value=first if value is None else value,
                      description=description, style=STYLE, layout=w.Layout(width=width))


def time_unit(seconds: float) -> str:
    """The unit a timeline of this length reads best in."""
    return "s" if seconds >= 2 else "ms" if seconds >= 2e-3 else "us"


def show_in(out, *items) -> None:
    """Make ``items`` (text, figures, anything IPython displays) the contents of the
    Output widget ``out``, by setting its outputs rather than capturing ``with out:``.

    Why: captured output travels as output of the running cell, and under nbclient
    (``nbconvert --execute``, nbval) the client's stand-in for an Output widget answers
    every such output with a message on the kernel's shell socket, the socket the same
    client is polling for the cell's reply. Now and then that reply, already sent, is
    read only when the cell's whole timeout has run out (lab 06's explorer cell waited
    599 s of 600; notebooks of such cells with nothing of parlab in them do it too, a few
    cells in a hundred). Set outputs reach the front-end as one update of the widget's
    state, to which no client answers.
    """
    from IPython import get_ipython
    from IPython.core.interactiveshell import InteractiveShell
    shell = get_ipython() or InteractiveShell.instance()
    outputs = []
    for item in items:
        if isinstance(item, str):
            outputs.append({"output_type": "stream", "name": "stdout", "text": item + "\n"})
        else:
            data, metadata = shell.display_formatter.format(item)
            outputs.append({"output_type": "display_data", "data": data, "metadata": metadata})
    out.outputs = tuple(outputs)


def failure_text() -> str:
    """The traceback of the exception being handled, as an Output widget would show it."""
    import traceback
    return "".join(traceback.format_exc())


_BOX = None


def explorer_box(children, about: str):
    """The explorer's widgets in a column that, where no live kernel draws them (an
    executed notebook opened as a file, a static viewer), reads as ``about`` instead of
    ``VBox(children=(...`` (their text/plain). Without ipywidgets (inert stand-ins, see
    ``parlab.missing``): what the default setting drew, static, and one line saying so."""
    global _BOX
    w = missing.widgets()
    if missing.is_inert(w):
        return missing.StaticExplorer(children, about)
    if _BOX is None:
        class Explorer(w.VBox):
            about = ""

            def _repr_mimebundle_(self, **kwargs):
                data = super()._repr_mimebundle_(**kwargs)
                if data:
                    data["text/plain"] = self.about
                return data
        _BOX = Explorer
    box = _BOX(children)
    box.about = about
    return box


def about_text(controls, measure: bool, first_line: str,
               what: str = "PREDICTED by the cost model") -> str:
    """What an explorer is, for a reader without a live kernel: what it draws, its
    controls, how to use it, and its first prediction's line."""
    import re
    names = ", ".join(getattr(c, "description", "") or "?" for c in controls)
    line = re.sub(r"<[^>]+>", "", first_line or "").strip()
    return (f"Explorer ({what}): {names}"
            + ("; a 'measure it here' button" if measure else "")
            + ". Its controls redraw the prediction at once; they need a running kernel: "
              "open the notebook in Jupyter and run this cell."
            + (f" First prediction: {line}" if line else ""))


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

    Without ipywidgets the controls keep their default values and the explorer shows
    that one prediction as a static figure (``explorer_box``).
    """
    from IPython.display import display
    w = missing.widgets()

    from .. import plot
    out, text = w.Output(), w.HTML()

    def values():
        return {name: c.value for name, c in controls.items()}

    def figure(result):
        title = "PREDICTED (cost model)"
        if isinstance(result, tuple):
            result, text.value, *rest = result
            title = f"{title}: {rest[0]}" if rest else title
        if hasattr(result, "spans"):      # a Timeline
            result = plot.timeline(result, predicted=True, color_by="name", title=title,
                                   unit=time_unit(result.duration))
        return result

    def draw(*_):
        # on every move, and once now, while the cell runs: never ``with out:`` (show_in)
        try:
            show_in(out, figure(predict(**values())))
        except ValueError as err:
            text.value = f"<b>not possible:</b> {err}"
        except Exception:  # noqa: BLE001 - shown in the widget, as a captured error would be
            show_in(out, failure_text())

    def run(_):
        # only ever on a click in a live front-end: captured, so that what the ranks
        # print while they run shows in the widget
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
                from ..plot.steps import measured_vs_predicted
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
    box = explorer_box([*rows, text, out], about_text(widgets, measure is not None, text.value))
    # for tests and scripts, without a widget front-end
    box.predict = lambda: predict(**values())
    box.measure = lambda: measure(**values())
    return box


def seconds_text(seconds: float) -> str:
    return (f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3
            else f"{seconds * 1e6:.3g} µs")


def bytes_text(n: float) -> str:
    """Powers of two in KB of 1024 (16 KB), other sizes in KB of 1000 (10 KB)."""
    base = 1024 if n >= 1 and int(n) == n and int(n) & (int(n) - 1) == 0 else 1000
    for unit, size in (("GB", base ** 3), ("MB", base ** 2), ("KB", base)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def gpu_clusters() -> dict:
    """Hardware the learner may not own, label -> (n devices -> ``sim.Cluster``).

    The figures are ``parlab.sim.clusters``' (vendors' datasheets, derated to sustained
    rates, sources cited there). "one per node" puts every GPU in a node of its own, so
    that every group talks over InfiniBand even with a few devices.
    """
    import math
    from dataclasses import replace

    from .. import sim

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
    return ([HERE] if here is not None else []) + list(gpu_clusters())


def cluster_for(label: str, devices: int, here=None):
    """The cluster called ``label`` with at least ``devices`` devices (PREDICTED hardware;
    this machine keeps its calibrated rates and link, whatever the count)."""
    from dataclasses import replace
    if label == HERE:
        n = max(devices, here.devices)
        return replace(here, devices=n, devices_per_node=n)
    return gpu_clusters()[label](max(devices, 1))


WIDTHS = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]


def scaled_mlp(width: int):
    """The course's MLP with its hidden widths scaled: 64 -> w -> w -> w/2 -> 10."""
    return (64, width, width, max(width // 2, 1), 10)


def here_costs(cluster: str, net, measured, lab_net):
    """This machine's measured per-layer costs for the lab's own network, else the
    roofline at the cluster's rates (``None``: ``sim``'s default)."""
    return measured if cluster == HERE and measured is not None and net == lab_net else None


def refuse_unless_here(cluster: str, ranks: int, most: int = 4) -> None:
    """Refuse, in words, what "measure it here" cannot measure."""
    if cluster != HERE:
        raise ValueError("this machine can only measure itself: choose it as the cluster")
    if ranks > most:
        raise ValueError(f"{ranks} processes on this machine's few cores would measure the "
                         f"operating system's scheduler: choose at most {most}")


def checkbox(description: str, value: bool):
    w = missing.widgets()
    return w.Checkbox(value=value, description=description, style=STYLE,
                      layout=w.Layout(width="340px"))
