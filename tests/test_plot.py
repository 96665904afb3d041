import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from parlab import plot  # noqa: E402
from parlab.trace import COMM, COMPUTE, WAIT, Span, Timeline  # noqa: E402


def _timeline():
    return Timeline([Span(0, COMPUTE, "forward", 0.0, 0.004),
                     Span(0, COMM, "all_reduce", 0.004, 0.006, bytes=1024),
                     Span(1, WAIT, "wait", 0.0, 0.003),
                     Span(1, COMPUTE, "forward", 0.003, 0.006)],
                    {0: "rank 0 · cpu (simulated)", 1: "rank 1 · cpu (simulated)"})


def test_timeline_has_a_lane_per_device_and_leaves_no_open_figure():
    fig = plot.timeline(_timeline(), title="demo")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 1 · cpu (simulated)",
                                                            "rank 0 · cpu (simulated)"]
    assert ax.get_title() == "demo"
    fig.canvas.draw()
    assert plt.get_fignums() == []
    assert "predicted" in plot.timeline(_timeline(), predicted=True).axes[0].get_title()


def test_utilization_bandwidth_and_scaling_draw():
    util = plot.utilization(_timeline())
    util.canvas.draw()
    records = [{"op": op, "world_size": 2, "bytes": b, "seconds": 1e-5 + b / 1e9}
               for op in ("send_recv", "all_reduce") for b in (4, 4096, 4 * 2**20)]
    bw = plot.bandwidth(records, title="loopback")
    bw.canvas.draw()
    assert len(bw.axes) == 2
    labels = [t.get_text() for t in bw.axes[1].texts]
    assert any("PCIe 4.0" in t for t in labels)
    plot.scaling([1, 2, 4], [1.0, 0.6, 0.4]).canvas.draw()
    assert plt.get_fignums() == []


def test_name_colours_follow_the_given_order():
    def legend(fig):
        return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    tl = Timeline([Span(0, COMPUTE, "backward", 0.0, 0.002), Span(0, COMPUTE, "forward", 0.002, 0.004),
                   Span(0, COMPUTE, "zeta", 0.004, 0.005), Span(0, COMPUTE, "alpha", 0.005, 0.006)])
    # known phases in the order of a step, others as first seen, whatever the order of the spans
    assert legend(plot.timeline(tl, color_by="name"))[:4] == ["forward", "backward", "zeta", "alpha"]
    assert legend(plot.timeline(tl, color_by="name", order=("alpha", "backward")))[:4] == [
        "alpha", "backward", "forward", "zeta"]


def test_curves_and_staleness_draw():
    fig = plot.curves({"sync": ([0, 1, 2, 3], [2.0, 1.5, 1.2, 1.0]), "async": ([0, 1, 2], [2.0, 1.0, 0.5])},
                      xlabel="s", ylabel="loss", title="t", smooth=2, points=True, logy=True)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["sync", "async"]
    smoothed = [line for line in fig.axes[0].lines if line.get_linestyle() == "-"]
    assert [len(line.get_xdata()) for line in smoothed] == [3, 2]   # running mean of 2
    records = [{"time": t * 0.1, "worker": 1 + t % 2, "staleness": t % 3} for t in range(12)]
    fig = plot.staleness(records, labels={1: "fast", 2: "slow"})
    fig.canvas.draw()
    assert len(fig.axes) == 2 and plt.get_fignums() == []


def _drawn(fig):
    """Draw a (closed) figure on an Agg canvas, as the notebook's inline backend does."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


def _bar_colors(fig):
    """{label text on the legend: (facecolor, hatch)}."""
    leg = fig.axes[0].get_legend()
    return {t.get_text(): (h.get_facecolor(), h.get_hatch())
            for t, h in zip(leg.get_texts(), leg.legend_handles)}


def test_legend_says_transfer_and_wait_is_told_apart_from_it():
    legend = _bar_colors(plot.timeline(_timeline()))
    assert "transfer" in legend and "communication" not in legend
    assert legend["transfer"][0] != legend["wait"][0]
    assert legend["wait"][1] and not legend["transfer"][1]      # wait is also hatched


def test_a_phase_keeps_its_colour_in_every_figure():
    a = Timeline([Span(0, COMPUTE, "forward", 0.0, 0.002), Span(0, COMPUTE, "backward", 0.002, 0.006)])
    b = Timeline([Span(0, COMPUTE, "update", 0.0, 0.001), Span(0, COMPUTE, "B3", 0.001, 0.003),
                  Span(0, COMPUTE, "F0", 0.003, 0.004), Span(0, COMPUTE, "backward", 0.004, 0.005)])
    ca, cb = _bar_colors(plot.timeline(a, color_by="name")), _bar_colors(plot.timeline(b, color_by="name"))
    # names of one colour share one legend entry: two swatches alike would say nothing
    assert ca["backward"][0] == cb["B (backward), backward"][0]
    assert ca["forward"][0] == cb["F (forward)"][0]
    assert len({ca["forward"][0], ca["backward"][0], cb["update"][0]}) == 3
    c = Timeline([Span(0, COMPUTE, "forward", 0.0, 0.002), Span(1, COMPUTE, "sum gradients", 0.0, 0.001)])
    assert list(_bar_colors(plot.timeline(c, color_by="name")))[0] == "forward, sum gradients"
    # and the kinds' colours are never used for a phase
    kinds = {plot.COLORS[k] for k in (COMM, WAIT)}
    assert all(plot.phase_color(n) not in kinds for n in ("forward", "backward", "update", "data"))


def test_labels_that_do_not_fit_their_bar_are_left_out():
    tl = Timeline([Span(0, COMPUTE, "forward", 0.0, 0.050),
                   Span(0, COMPUTE, "a rather long name for a short bar", 0.050, 0.051)])
    fig = plot.timeline(tl)
    _drawn(fig)
    shown = {t.get_text(): t.fits for t in fig.axes[0].texts}
    assert shown == {"forward": True, "a rather long name for a short bar": False}


def test_legends_sit_beside_the_data_and_fonts_are_large():
    for fig in (plot.timeline(_timeline()), plot.utilization(_timeline()),
                plot.curves({"a": ([0, 1], [1, 2])}, xlabel="x", ylabel="y", title="t"),
                plot.scaling([1, 2], [1.0, 0.6])):
        renderer = _drawn(fig)
        ax = fig.axes[0]
        legend_box = ax.get_legend().get_window_extent(renderer)
        assert legend_box.x0 >= ax.get_window_extent(renderer).x1   # right of the axes
        assert min(t.get_fontsize() for t in ax.get_yticklabels()) >= 12
    assert plot.text_color(plot.COLORS[COMPUTE]) == "white"
    assert plot.text_color(plot.COLORS[COMM]) == "black"


def test_index_colours_follow_the_number_in_the_name():
    tl = Timeline([Span(r, COMPUTE, f"t{t}", 0.001 * (t + r), 0.001 * (t + r + 1))
                   for r in range(2) for t in range(4)])
    fig = plot.timeline(tl, color_by="index")
    bars = {}
    for patch, seg in zip(fig.axes[0].patches,
                          [s for r in tl.ranks for s in tl.segments(r)]):
        if seg.kind == COMPUTE:
            bars.setdefault(seg.name, set()).add(patch.get_facecolor())
    assert all(len(c) == 1 for c in bars.values())       # t2 has one colour on every lane
    assert len({next(iter(c)) for c in bars.values()}) == 4
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()][:2] == ["t0", "t1"]


def test_stacked_timelines_share_the_longest_time_axis_and_keep_their_width():
    short = Timeline([Span(0, COMPUTE, "F0", 0.0, 0.010)])
    long = Timeline([Span(0, COMPUTE, "F0", 0.0, 0.010), Span(0, COMPUTE, "B0", 0.010, 0.050)])
    fig, axes = plt.subplots(2, 1, figsize=(12, 5), sharex=True)
    plot.timeline(long, ax=axes[0], color_by="name")
    plot.timeline(short, ax=axes[1], color_by="name", legend=False)
    fig.tight_layout()
    assert axes[0].get_xlim() == axes[1].get_xlim() == (0.0, 50.0)
    assert axes[1].get_legend() is None
    assert axes[0].get_position().width > 0.6     # labels outside the axes take no layout room
    plt.close(fig)


def test_memory_parts_never_take_a_phase_or_a_kind_colour():
    phases = {plot.phase_color(n) for n in ("forward", "backward", "update", "data")}
    kinds = set(plot.COLORS.values())
    memory = {plot.memory_color(p) for p in ("parameters", "gradients", "optimizer state",
                                             "activations", "gathered parameters")}
    assert len(memory) == 5 and not memory & (phases | kinds)
    extra: dict = {}
    assert plot.memory_color("offloaded", extra) not in memory | phases
    fig = plot.memory({"computed": {"parameters": 4e5, "gradients": 4e5, "optimizer state": 8e5,
                                    "activations": 3e5}}, unit="MB")
    faces = {matplotlib.colors.to_hex(p.get_facecolor()) for p in fig.axes[0].patches}
    assert faces == {plot.memory_color(p).lower() for p in ("parameters", "gradients",
                                                            "optimizer state", "activations")}


def test_compute_that_is_no_phase_takes_the_compute_blue():
    for name in ("forward + backward", "sum gradients"):
        assert plot.phase_color(name) == plot.COLORS[COMPUTE]
    assert plot.phase_color("backward") != plot.COLORS[COMPUTE]


def test_collectives_told_apart_by_shade_and_pattern_and_never_like_a_wait():
    ops = ["all_gather", "all_reduce", "reduce_scatter"]
    looks = {(plot.axis_color(op, ops), plot.axis_hatch(op, ops)) for op in ops}
    assert len(looks) == 3
    for color, hatch in looks:
        assert color != plot.COLORS[WAIT] and not set(hatch or "") & set("/\\x")


def test_throughput_step_axis_reads_as_a_log_axis():
    recs = [{"batch_size": b, "samples_per_s": b / t, "step_s": t}
            for b, t in ((4, 9e-4), (16, 8.8e-4), (64, 1.5e-3), (256, 3.4e-3), (1024, 9.4e-3))]
    fig = plot.throughput(recs)
    _drawn(fig)
    ax = fig.axes[1]
    assert ax.get_yscale() == "log" and "log scale" in ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert {"1", "2", "5"} <= set(labels)                 # unevenly spaced: read as log


def test_a_dashed_curve_on_top_of_another_leaves_both_visible():
    fig = plot.curves({"float32": ([0, 1, 2], [2.0, 1.0, 0.5]),
                       "bfloat16": ([0, 1, 2], [2.0, 1.0, 0.5])},
                      xlabel="step", ylabel="loss", title="t", dashed=("bfloat16",))
    under, over = fig.axes[0].lines
    assert under.get_linewidth() >= 3 * over.get_linewidth() and under.get_alpha() < 1
    assert over.get_linestyle() == "--" and over.get_zorder() > under.get_zorder()
