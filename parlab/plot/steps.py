"""Figures of whole steps: a step cut into its parts, measured beside predicted."""
from __future__ import annotations

from ..steps import quickest_step


# Parts of a PREDICTED step, in the colours of the timelines: compute blue, the
# pipeline's idle slots grey, each axis's transfers in its axis colour.
def _part_colors():
    from .. import plot
    from ..trace import COMPUTE, IDLE
    return {"compute": plot.COLORS[COMPUTE], "bubble": plot.COLORS[IDLE],
            "tp": plot.AXIS_COLORS["tp"], "pp": plot.AXIS_COLORS["pp"],
            "dp": plot.AXIS_COLORS["dp"], "update": plot.PHASES["update"]}


PART_LABELS = {"compute": "compute", "bubble": "pipeline bubble (idle)",
               "tp": "tp all-reduces", "pp": "pp sends", "dp": "dp all-reduce",
               "update": "optimizer update"}


def plot_step_parts(entries, *, title: str, ax=None, unit: str = "ms",
                    beside: str = "measured"):
    """Stacked bars of PREDICTED step times (dotted), a measured bar beside each if given.

    entries: (label, ``sim.Prediction``, measured seconds or None). ``beside``: what
    those seconds are, "measured" (dark bars) or "replayed" (outlined in black, as every
    replay). A plan that does not fit in memory gets an empty bar and says so.
    """
    if beside not in ("measured", "replayed"):
        raise ValueError(f"beside must be 'measured' or 'replayed', got {beside!r}")
    import matplotlib.pyplot as plt

    from .. import plot
    scale = {"s": 1.0, "ms": 1e3}[unit]
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(13, 5.2))
    else:
        fig = ax.figure
    colors = _part_colors()
    bar = ({"color": "#333333"} if beside == "measured" else
           {"facecolor": "#8c8c8c", "edgecolor": "black", "linewidth": 1.4})
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
            ax.bar(i + width / 2, measured * scale, width, **bar)
    ax.set_xticks(range(len(entries)))
    ax.set_xticklabels([label for label, _, _ in entries], fontsize=plot.FONT - 3)
    ax.set_ylabel(f"time per step ({unit})", fontsize=plot.FONT - 1)
    ax.set_title(title, fontsize=plot.FONT)
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=colors[p], hatch=plot.HATCHES[plot.PREDICTED],
                             edgecolor="white") for p in PART_LABELS if p in used]
    names = [f"PREDICTED: {PART_LABELS[p]}" for p in PART_LABELS if p in used]
    if measured_any:
        handles.append(plt.Rectangle((0, 0), 1, 1, **bar))
        names.append("measured here" if beside == "measured" else "replayed on dedicated devices")
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1),
              fontsize=plot.FONT - 3, frameon=False)
    ax.tick_params(labelsize=plot.FONT - 3)
    ax.grid(axis="y", alpha=0.3)
    if own:
        fig.tight_layout()
        plt.close(fig)
    return fig


def plot_checkpointing(rows, *, title: str = ""):
    """Left: activation bytes of a deep MLP, kept after the forward pass and recomputed
    for the largest segment, per number of checkpointed segments. Right: the step time.
    ``rows`` from ``parlab.torch.memory.checkpointing``."""
    from .. import plot
    plt = plot.pyplot()
    names = ["none" if r["segments"] is None else str(r["segments"]) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.4))
    kept = [r["kept"] / 1e6 for r in rows]
    again = [r["recomputed"] / 1e6 for r in rows]
    left.bar(names, kept, color=plot.MEMORY_COLORS["activations"], label="kept after forward")
    left.bar(names, again, bottom=kept, color=plot.OKABE_ITO["yellow"],
             label="+ largest segment, recomputed in backward")
    left.set_ylim(0, 1.5 * max(k + a for k, a in zip(kept, again)))
    left.set_xlabel("checkpointed segments", fontsize=plot.FONT)
    left.set_ylabel("activations held (MB)", fontsize=plot.FONT)
    left.set_title("memory for the backward pass (measured)", fontsize=plot.FONT)
    left.legend(fontsize=plot.FONT - 3, frameon=False, loc="upper center")
    right.bar(names, [r["step_s"] * 1e3 for r in rows], color=plot.COLORS["compute"])
    right.set_xlabel("checkpointed segments", fontsize=plot.FONT)
    right.set_ylabel("forward + backward (ms)", fontsize=plot.FONT)
    right.set_title("time of a step (measured, quickest run)", fontsize=plot.FONT)
    for ax in (left, right):
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(labelsize=plot.FONT - 2)
    if title:
        fig.suptitle(title, fontsize=plot.FONT + 1)
    fig.tight_layout()
    return plot.finish(fig)


MEASURED_TITLE, PREDICTED_TITLE = "measured here", "PREDICTED (cost model)"
REPLAYED_TITLE = "replayed on dedicated devices"


def measured_vs_predicted(measured, predicted, *, title: str | None = None, unit: str = "ms",
                          color_by: str = "kind", names: bool = True, share_time: bool = True):
    """Two timelines side by side: what this machine measured, or its replay on dedicated
    devices (left, titled so), what the cost model predicts for the same run (right,
    dotted), on one time scale when ``share_time``.

    The legend lists every colour of both, below them. Titles say which is which.
    """
    from .. import plot
    plt = plot.pyplot()
    lanes = max(len(measured.ranks), len(predicted.ranks))
    fig, (left, right) = plt.subplots(1, 2, figsize=(16, 0.75 * lanes + 2.6), sharex=share_time)
    plot.timeline(measured, ax=left, unit=unit, color_by=color_by, names=names,
                  title=REPLAYED_TITLE if getattr(measured, "replayed", False) else MEASURED_TITLE)
    plot.timeline(predicted, ax=right, unit=unit, color_by=color_by, names=names, predicted=True,
                  title=PREDICTED_TITLE)
    handles, labels = {}, []
    for ax in (left, right):
        legend = ax.get_legend()
        if legend is None:
            continue
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            if text.get_text() not in handles:
                handles[text.get_text()] = handle
                labels.append(text.get_text())
        legend.remove()
    if share_time:      # both drawn: the longer one sets the shared scale
        width = max(measured.duration, predicted.duration) * {"s": 1, "ms": 1e3, "us": 1e6}[unit]
        left.set_xlim(0, width)
    fig.legend([handles[label] for label in labels], labels, loc="lower center",
               ncol=min(len(labels), 7), fontsize=plot.FONT - 3, frameon=False)
    if title:
        fig.suptitle(title, fontsize=plot.FONT + 1)
    fig.tight_layout(rect=(0, 0.1 if lanes > 2 else 0.14, 1, 1))
    return plot.finish(fig)
