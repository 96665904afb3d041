"""The labs' explorers: built, predicted at once, redrawn when a control moves.

No front-end and no ranks: ``explorer`` keeps a ``predict`` hook that returns what the
figure would show, so every explorer can be checked in a plain process. Nothing here
clicks "measure it here" (that starts ranks; the labs' browser test moves a slider).
"""
import time

import pytest

pytest.importorskip("ipywidgets")

from parlab import plot, sim  # noqa: E402
from parlab.course import lab00, lab03, lab04, lab05, lab06  # noqa: E402
from parlab.sim import calibrate  # noqa: E402
from parlab.split import SplitConfig  # noqa: E402

MLP = (64, 256, 256, 128, 10)
PIPE = SplitConfig(sizes=(64, *[256] * 32, 10), batch_size=840)


@pytest.fixture(scope="module")
def here():
    return calibrate.this_machine(sim.Link(200e-6, 1e9), flops=5e9, layer_overhead_s=20e-6)


def _controls(box):
    return [c for row in box.children for c in getattr(row, "children", ())
            if hasattr(c, "value")]


def _explorers(here):
    net = sim.Network.mlp(MLP)
    costs = calibrate.costs_from_phases(net, 64, 0.7e-3, 0.8e-3, 0.3e-3)
    cnn = sim.Network("CNN", net.layers[:2], 64)
    pipe = sim.Network.mlp(PIPE.sizes)
    costs_pipe = calibrate.costs_from_phases(pipe, 210, 40e-3, 60e-3, 5e-3)
    return {
        "all-reduce": lab00.all_reduce_explorer(None, sim.Link(200e-6, 1e9), 0.04,
                                                  unit_flops=1e9),
        "tensor parallel": lab03.tensor_parallel_explorer(here),
        "pipeline": lab04.pipeline_explorer(PIPE, here, costs_pipe),
        "data parallel": lab05.data_parallel_explorer(here, costs),
        "parameter server": lab06.parameter_server_explorer(
            here, calibrate.costs_from_phases(cnn, 32, 1e-3, 2e-3, 0.2e-3), cnn),
    }


def test_every_explorer_predicts_at_once_and_redraws_when_its_first_slider_moves(here):
    """The browser test moves the first slider one step: every position must draw."""
    for name, box in _explorers(here).items():
        start = time.perf_counter()
        tl, text, title = box.predict()
        assert time.perf_counter() - start < 1.0, f"{name}: a prediction must be instant"
        assert tl.predicted and tl.spans and "PREDICTED" in text, name
        first = _controls(box)[0]
        options = getattr(first, "options", None) or range(first.min, first.max + 1)
        titles = {title}
        for value in [o[1] if isinstance(o, tuple) else o for o in options]:
            first.value = value
            tl, text, title = box.predict()      # raises where a position cannot be drawn
            titles.add(title)
        assert len(titles) == len(options), f"{name}: moving {first.description} changed nothing"


def test_every_cluster_of_every_explorer_predicts(here):
    for name, box in _explorers(here).items():
        cluster = next(c for c in _controls(box) if c.description == "cluster")
        for label in cluster.options:
            cluster.value = label
            tl, text, title = box.predict()
            assert tl.spans and "PREDICTED" in text, (name, label)


def test_measuring_refuses_what_this_machine_cannot_measure(here):
    dp = lab05.data_parallel_explorer(here)
    cluster = next(c for c in _controls(dp) if c.description == "cluster")
    cluster.value = cluster.options[-1]
    with pytest.raises(ValueError, match="this machine"):
        dp.measure()


def test_measured_vs_predicted_shares_one_time_scale(here):
    net = sim.Network.mlp(MLP)
    a = sim.tensor_parallel(net, here, 64, devices=2, scheme="naive")
    b = sim.tensor_parallel(net, here, 64, devices=2, scheme="column_row")
    fig = plot.measured_vs_predicted(a, b)
    left, right = fig.axes[:2]
    assert left.get_xlim() == right.get_xlim()
    assert left.get_title() == "measured here" and right.get_title() == "PREDICTED (cost model)"


def _outputs(box):
    """The Output widgets inside an explorer."""
    import ipywidgets as w
    found, todo = [], [box]
    while todo:
        x = todo.pop()
        if isinstance(x, w.Output):
            found.append(x)
        todo += list(getattr(x, "children", ()))
    return found


def _all_explorers(here):
    from parlab.course import lab07, lab08
    return {**_explorers(here), "strategy": lab07.strategy_explorer(here),
            "zero": lab08.zero_explorer(), "memory": lab08.memory_explorer()}


def test_explorers_set_their_figure_as_outputs_never_capturing_the_running_cell(here):
    """Captured output (``with out:``) under nbclient sometimes left the next cell waiting
    for the whole cell timeout (lab 06: 599 s). Without a kernel, capturing leaves an Output
    widget empty; setting its outputs fills it, so the figure being there shows the way."""
    for name, box in _all_explorers(here).items():
        (out,) = _outputs(box)
        kinds = [o["output_type"] for o in out.outputs]
        assert "display_data" in kinds, (name, kinds)
        assert out.msg_id == "", name                 # no capture is open
        first = _controls(box)[0] if name not in ("zero", "strategy") else None
        if first is not None and hasattr(first, "options"):
            first.value = first.options[-1][1] if isinstance(first.options[-1], tuple) \
                else first.options[-1]
            assert [o["output_type"] for o in out.outputs] == kinds, name   # redrawn in place


def test_an_explorer_reads_as_a_sentence_without_a_live_kernel(here):
    for name, box in _all_explorers(here).items():
        text = box._repr_mimebundle_()["text/plain"]
        assert text.startswith("Explorer (computed from the ZeRO formulas): " if name == "zero"
                               else "Explorer (PREDICTED by the cost model): "), name
        assert "need a running kernel" in text and "VBox" not in text, name
        assert "application/vnd.jupyter.widget-view+json" in box._repr_mimebundle_()
    dp = _all_explorers(here)["data parallel"]._repr_mimebundle_()["text/plain"]
    assert "'measure it here' button" in dp and "First prediction: PREDICTED" in dp


def test_an_explorer_shows_a_failing_prediction_in_its_widget():
    from parlab.course.explorer import explorer, slider

    def predict(n):
        raise RuntimeError(f"no model for {n}")
    box = explorer(predict, {"n": slider("n", range(1, 3), 1)})
    (out,) = _outputs(box)
    assert "RuntimeError: no model for 1" in out.outputs[0]["text"]
