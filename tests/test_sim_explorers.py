"""The explorers that show what the cost model gained: lab 08's memory and recomputation,
lab 04's interleaving with tensor parallelism, lab 07's paths across nodes."""
import pytest

pytest.importorskip("ipywidgets")

from parlab import sim  # noqa: E402
from parlab.course import lab04, lab07, lab08  # noqa: E402
from parlab.course import lab08_explorer as mem  # noqa: E402


def _controls(box):
    return {c.description: c for row in box.children for c in getattr(row, "children", ())
            if hasattr(c, "value")}


def test_lab08s_figure_says_what_the_model_predicts():
    fig, line = mem.memory_figure("Llama 2 7B, 4096 tokens", "H100 80 GB, 8 a node", 8, 1, 3,
                                  "selective")
    net = mem.models()["Llama 2 7B, 4096 tokens"]()
    cluster = mem.gpus()["H100 80 GB, 8 a node"](8)
    m, tl = mem.predicted(net, cluster, 8, 1, 3, "selective")
    assert m.total == pytest.approx(sim.memory(net, 8, dp=8, zero=3, recompute="selective",
                                               cluster=cluster).total)
    assert f"{m.total / 1e9:,.1f} GB per device" in line and ("fits" in line) == m.fits
    parts = mem.step_parts(tl)
    assert sum(parts.values()) == pytest.approx(tl.step_s, rel=1e-6)
    assert f"a step {tl.step_s:,.2f} s" in line
    assert len(fig.axes) == 2


def test_lab08s_explorer_draws_every_recomputation():
    box = lab08.memory_explorer()
    c = _controls(box)
    c["devices N"].value = 2
    for how in ("none", "selective", "full"):
        c["recomputation"].value = how
        fig, line = box.predict()
        assert "PREDICTED" in line and f"with {how} recomputation" in line


def test_lab04s_explorer_interleaves_with_tensor_parallelism():
    box = lab04.pipeline_explorer(lab04.PIPE)
    c = _controls(box)
    c["cluster"].value = "H100 GPUs on NVLink (DGX H100)"
    c["stages p"].value, c["micro-batches m"].value = 4, 8
    c["tensor parallel tp (GPUs)"].value = 2
    plain = box.predict()[0]
    c["schedule"].value = "interleaved"
    inter = box.predict()[0]
    assert len(inter.ranks) == 8 and inter.step_s < plain.step_s
    c["chunks per device v (interleaved)"].value = 4
    assert "v = 4" in box.predict()[2]


def test_lab07s_chooser_says_how_each_axis_travels():
    box = lab07.strategy_explorer()
    model, cluster = box.children[0].children
    model.value = "GPT-2 XL (1.5 B)"
    cluster.value = "2 nodes × 8 H100 (InfiniBand NDR)"
    text = box.children[4].value
    assert "network cards per node" in text and "NVLink SHARP" in text
    sharp = next(c for c in box.children[2].children if "SHARP" in c.description)
    sharp.value = False
    assert "NVLink SHARP" not in box.children[4].value
