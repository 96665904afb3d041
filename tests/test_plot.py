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
