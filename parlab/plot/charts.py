"""Charts of measured quantities: bandwidth, scaling, training, throughput, memory, bars,
curves, staleness."""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from ..trace import COMPUTE
from .style import (COLORS, FONT, OKABE_ITO, PHASE_COLORS, PREDICTED, finish, memory_color,
                    pyplot)


REFERENCE_LINKS = {
    "NVLink 4 (H100 SXM), per direction": 450e9,
    "PCIe 4.0 x16": 31.5e9,
    "PCIe 3.0 x16": 15.8e9,
}


def bandwidth(records: Sequence[dict], *, title: str | None = None, references: bool = True,
              bus: bool = True):
    """Bandwidth and latency against message size, one line per (op, world size).

    records: dicts with keys op, world_size, bytes, seconds (as returned by
    ``parlab.torch.bandwidth.sweep``) and optionally impl (which implementation). Left: time per operation. Right: algorithm
    bandwidth (bytes / time), and bus bandwidth (x ``metrics.bus_factor``) dashed.
    references: draw vendors' peak figures for GPU links as horizontal lines.
    """
    from ..metrics import bus_factor
    plt = pyplot()
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(16, 5.4))
    groups: dict[tuple, list[dict]] = {}
    for rec in records:  # "impl" tells two implementations of one operation apart
        groups.setdefault((rec["op"], rec["world_size"], rec.get("impl", "")), []).append(rec)
    for i, ((op, n, impl), recs) in enumerate(sorted(groups.items())):
        recs = sorted(recs, key=lambda r: r["bytes"])
        size = [r["bytes"] for r in recs]
        secs = [r["seconds"] for r in recs]
        label = f"{op}{f' ({impl})' if impl else ''}, {n} ranks"
        (line,) = ax_t.loglog(size, [s * 1e6 for s in secs], "o-", label=label, lw=2,
                              color=PHASE_COLORS[i % len(PHASE_COLORS)])
        algbw = [b / s / 1e9 for b, s in zip(size, secs)]
        ax_b.loglog(size, algbw, "o-", color=line.get_color(), lw=2, label=f"{label} (algorithm)")
        if bus and bus_factor(op, n) != 1.0:
            ax_b.loglog(size, [a * bus_factor(op, n) for a in algbw], "s--",
                        color=line.get_color(), alpha=0.7, label=f"{label} (bus)")
    if references:
        smallest = min((r["bytes"] for r in records), default=1)
        lowest = min(REFERENCE_LINKS.values())
        for name, bw in REFERENCE_LINKS.items():
            ax_b.axhline(bw / 1e9, color="grey", ls=":", lw=1)
            # labels above their line, the lowest below it: PCIe 3 and 4 are only 2x apart
            below = bw == lowest
            ax_b.text(smallest, bw / 1e9 * (0.87 if below else 1.15), f"{name} (spec sheet)",
                      fontsize=FONT - 4, color="dimgrey", va="top" if below else "bottom")
        # room above the highest line for its label, clear of the frame
        low, high = ax_b.get_ylim()
        ax_b.set_ylim(low, max(high, 4 * max(REFERENCE_LINKS.values()) / 1e9))
    ax_t.set_xlabel("message size (bytes)", fontsize=FONT)
    ax_t.set_ylabel("time per operation (us)", fontsize=FONT)
    ax_t.set_title("time against message size", fontsize=FONT + 1)
    ax_b.set_xlabel("message size (bytes)", fontsize=FONT)
    ax_b.set_ylabel("bandwidth (GB/s)", fontsize=FONT)
    ax_b.set_title("bandwidth against message size", fontsize=FONT + 1)
    for ax in (ax_t, ax_b):
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(labelsize=FONT - 2)
    # one legend, beside the right-hand plot: both plots use the same colour per line
    ax_b.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=FONT - 3, frameon=False)
    if title:
        fig.suptitle(title, fontsize=FONT + 2)
    fig.tight_layout()
    return finish(fig)


def scaling(n_devices: Iterable[int], seconds: Iterable[float], *, title: str | None = None):
    """Measured speed-up against the number of devices, with the ideal line."""
    plt = pyplot()
    n = list(n_devices)
    t = list(seconds)
    fig, ax = plt.subplots(figsize=(9, 4.6))
    ax.plot(n, [t[0] / x for x in t], "o-", color=COLORS[COMPUTE], lw=2, ms=8,
            label="measured speed-up")
    ax.plot(n, [x / n[0] for x in n], "--", color=COLORS[PREDICTED], alpha=0.6, lw=2,
            label="ideal (n devices, n x)")
    ax.set_xticks(n)
    ax.set_xlabel("devices", fontsize=FONT)
    ax.set_ylabel("speed-up", fontsize=FONT)
    ax.set_title(title or "scaling (measured)", fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT - 2)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=FONT - 2, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return finish(fig)


def training(history: dict, *, title: str | None = None):
    """Loss per step and, if present, test accuracy per epoch."""
    plt = pyplot()
    has_acc = bool(history.get("test_accuracy"))
    fig, axes = plt.subplots(1, 2 if has_acc else 1, figsize=(12 if has_acc else 7, 4.2))
    axes = list(np.atleast_1d(axes))
    axes[0].plot(history["loss"], lw=1.5, color=PHASE_COLORS[0])
    axes[0].set_xlabel("step", fontsize=FONT)
    axes[0].set_ylabel("training loss", fontsize=FONT)
    if has_acc:
        acc = history["test_accuracy"]
        axes[1].plot(range(1, len(acc) + 1), [a * 100 for a in acc], "o-", color=PHASE_COLORS[2],
                     lw=2, ms=7)
        axes[1].set_xlabel("epoch", fontsize=FONT)
        axes[1].set_ylabel("test accuracy (%)", fontsize=FONT)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=FONT - 2)
    fig.suptitle(title or "training (measured)", fontsize=FONT + 1)
    fig.tight_layout()
    return finish(fig)


def throughput(records: Sequence[dict], *, title: str | None = None):
    """Samples per second and step time against batch size (records from ``throughput``)."""
    plt = pyplot()
    bs = [r["batch_size"] for r in records]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    a.semilogx(bs, [r["samples_per_s"] for r in records], "o-", base=2, color=PHASE_COLORS[0],
               lw=2, ms=7)
    a.set_ylabel("samples / s", fontsize=FONT)
    b.plot(bs, [r["step_s"] * 1e3 for r in records], "o-", color=PHASE_COLORS[1], lw=2, ms=7)
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    # a log axis that reads as one: ticks at 1, 2, 5 of each decade (unevenly spaced) and
    # a faint line at every other integer between them, and "log scale" in the label
    b.set_ylabel("time per step (ms, log scale)", fontsize=FONT)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    b.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    b.yaxis.set_minor_locator(LogLocator(base=10, subs=tuple(float(k) for k in range(1, 10))))
    b.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    b.yaxis.set_minor_formatter(NullFormatter())
    b.grid(which="minor", axis="y", alpha=0.12)
    for ax in (a, b):
        ax.set_xlabel("batch size (log scale)", fontsize=FONT)
        ax.set_xticks(bs, [str(x) for x in bs])         # the batch sizes, not powers of 2
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=FONT - 2)
    fig.suptitle(title or "throughput (measured)", fontsize=FONT + 1)
    fig.tight_layout()
    return finish(fig)


def memory(breakdowns: dict, *, title: str | None = None, unit: str = "MB"):
    """Stacked bars, one per label: bytes of parameters, gradients, optimizer state, ...

    breakdowns: {label: {part: bytes}}, e.g. {"computed": ..., "measured": ...} or one
    entry per device.
    """
    plt = pyplot()
    scale = {"kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]     # "KB" kept for old calls
    labels = list(breakdowns)
    parts: list[str] = []
    for d in breakdowns.values():
        parts += [p for p in d if p not in parts]
    fig, ax = plt.subplots(figsize=(max(7, 1.5 * len(labels) + 4), 4.4))
    bottom = [0.0] * len(labels)
    extra: dict[str, str] = {}
    for part in parts:
        vals = [breakdowns[lab].get(part, 0) / scale for lab in labels]
        color = memory_color(part, extra)
        ax.bar(labels, vals, bottom=bottom, label=part, color=color, edgecolor="white", linewidth=0.6)
        bottom = [a + v for a, v in zip(bottom, vals)]
    ax.set_ylabel(f"memory ({unit})", fontsize=FONT)
    ax.set_title(title or "memory", fontsize=FONT + 1)
    ax.legend(fontsize=FONT - 2, bbox_to_anchor=(1.02, 1), loc="upper left", frameon=False)
    ax.tick_params(labelsize=FONT - 2)
    if len(labels) > 3:
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    return finish(fig)


def bars(values: dict, *, ylabel: str, title: str, highlight=None):
    """A simple bar chart of named values (e.g. measured time per layer)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(8, 0.8 * len(values) + 3), 4.4))
    names = list(values)
    colors = [OKABE_ITO["orange"] if highlight and n in highlight else COLORS[COMPUTE] for n in names]
    ax.bar(range(len(names)), list(values.values()), color=colors)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=FONT - 2)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.set_title(title, fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT - 2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return finish(fig)


def curves(series: dict, *, xlabel: str, ylabel: str, title: str, smooth: int = 1,
           logy: bool = False, points: bool = False, dashed=()):
    """One line per entry of ``series`` ({label: (x values, y values)}).

    smooth: a running mean over that many points, for noisy per-batch losses (the raw
    points are drawn faintly behind when ``points``).
    dashed: labels drawn dashed and thin, on top, and the other curves then drawn as wide
    translucent bands: a curve that lies exactly on another one shows as a dashed line
    inside a band, both visible.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.6))
    for i, (label, (x, y)) in enumerate(series.items()):
        x, y = np.asarray(x, float), np.asarray(y, float)
        color = PHASE_COLORS[i % len(PHASE_COLORS)]
        if points:
            ax.plot(x, y, ".", color=color, alpha=0.25, ms=4)
        if smooth > 1 and len(y) >= smooth:
            y = np.convolve(y, np.ones(smooth) / smooth, mode="valid")
            x = x[smooth - 1:]
        if label in dashed:
            ax.plot(x, y, "--", color=color, lw=2.0, label=label, zorder=3, dashes=(4, 2.5))
        elif dashed:
            ax.plot(x, y, "-", color=color, lw=9, alpha=0.35, label=label,
                    solid_capstyle="round")
        else:
            ax.plot(x, y, "-", color=color, lw=2.5, label=label)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel, fontsize=FONT)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.set_title(title, fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT - 2)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=FONT - 2, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return finish(fig)


def staleness(records: Sequence[dict], *, title: str | None = None, labels: dict | None = None):
    """Staleness of every applied gradient: over time per worker, and its histogram.

    records: dicts with "time", "worker" and "staleness" (a parameter server's log).
    """
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 4.4), gridspec_kw={"width_ratios": [2, 1]})
    workers = sorted({r["worker"] for r in records})
    top = max((r["staleness"] for r in records), default=0)
    for i, w in enumerate(workers):
        mine = [r for r in records if r["worker"] == w]
        name = (labels or {}).get(w, f"worker rank {w}")
        color = PHASE_COLORS[i % len(PHASE_COLORS)]
        a.plot([r["time"] for r in mine], [r["staleness"] for r in mine], "o", ms=4,
               color=color, alpha=0.7, label=name)
        b.hist([r["staleness"] for r in mine], bins=np.arange(top + 2) - 0.5, alpha=0.6,
               color=color, label=name)
    a.set_xlabel("time (s)", fontsize=FONT)
    a.set_ylabel("staleness (updates)", fontsize=FONT)
    b.set_xlabel("staleness (updates)", fontsize=FONT)
    b.set_ylabel("gradients applied", fontsize=FONT)
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=FONT - 2)
    b.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=FONT - 3, frameon=False)
    fig.suptitle(title or "staleness of each applied gradient (measured)", fontsize=FONT + 1)
    fig.tight_layout()
    return finish(fig)
