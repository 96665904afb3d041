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
    tl = Timeline([Span(0, COMPUTE, "backward", 0.0, 0.002), Span(0, COMPUTE, "forward", 0.002, 0.004)])
    assert legend(plot.timeline(tl, color_by="name"))[:2] == ["backward", "forward"]
    assert legend(plot.timeline(tl, color_by="name", order=("forward",)))[:2] == ["forward", "backward"]


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
