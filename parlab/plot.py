"""Figures for timelines, utilization and bandwidth. Every function returns a Figure.

Sized and coloured to read on a projector: large labels, one lane per device, one colour
per kind of time. Figures are closed before they are returned, so a notebook shows each
exactly once (as the cell's value), and nothing piles up in pyplot's registry.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .trace import COMM, COMPUTE, IDLE, WAIT, Timeline

COLORS = {COMPUTE: "#1f77b4", COMM: "#ff7f0e", WAIT: "#d62728", IDLE: "#e6e6e6"}
LABELS = {COMPUTE: "compute", COMM: "communication", WAIT: "wait", IDLE: "idle"}
FONT = 12


def _pyplot():
    import matplotlib.pyplot as plt
    return plt


def _finish(fig):
    _pyplot().close(fig)
    return fig


PHASE_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def timeline(tl: Timeline, *, title: str | None = None, ax=None, names: bool = True,
             unit: str = "ms", predicted: bool = False, color_by: str = "kind",
             order: Sequence[str] = ()):
    """Draw one lane per device; bars coloured by kind, idle time in light grey.

    names: write span names on bars wide enough to hold them.
    predicted: label the figure as a prediction (cost model), not a measurement.
    color_by: "kind" (compute / communication / wait) or "name" (one colour per span
        name: forward, backward, ...; trailing digits are ignored, so F0, F1, ... share
        a colour; communication stays orange).
    order: with color_by="name", compute names to colour first, in this order, so that
        several figures give each name the same colour.
    """
    if color_by not in ("kind", "name"):
        raise ValueError(f"color_by must be 'kind' or 'name', got {color_by!r}")
    plt = _pyplot()
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(12, 0.7 * len(tl.ranks) + 1.5))
    else:
        fig = ax.figure
    t0, width = tl.start, max(tl.duration, 1e-12)
    colors = dict(COLORS)
    def phase(name: str) -> str:
        return name.rstrip("0123456789") or name

    if color_by == "name":
        compute_names = list(dict.fromkeys([*order, *(phase(s.name) for s in tl.spans
                                                      if s.kind == COMPUTE)]))
        colors = {n: PHASE_COLORS[i % len(PHASE_COLORS)] for i, n in enumerate(compute_names)}
        colors.update({COMM: COLORS[COMM], WAIT: COLORS[WAIT], IDLE: COLORS[IDLE]})

    def color(seg):
        return colors[phase(seg.name)] if color_by == "name" and seg.kind == COMPUTE else colors[seg.kind]

    for lane, rank in enumerate(tl.ranks):
        y = len(tl.ranks) - 1 - lane
        for seg in tl.segments(rank):
            left, w = (seg.start - t0) * scale, (seg.end - seg.start) * scale
            ax.barh(y, w, left=left, height=0.7, color=color(seg),
                    edgecolor="white" if seg.kind != IDLE else "none", linewidth=0.5)
            if names and seg.kind != IDLE and (seg.end - seg.start) / width > 0.045:
                ax.text(left + w / 2, y, seg.name, ha="center", va="center",
                        color="white", fontsize=FONT - 2, clip_on=True)
    ax.set_yticks(range(len(tl.ranks)))
    ax.set_yticklabels([tl.labels[r] for r in reversed(tl.ranks)], fontsize=FONT)
    ax.set_xlabel(f"time ({unit})", fontsize=FONT)
    ax.set_xlim(0, width * scale)
    kind = "predicted (cost model)" if predicted else "measured"
    ax.set_title(title or f"{kind} timeline", fontsize=FONT + 2)
    keys = list(colors)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in keys]
    ax.legend(handles, [LABELS.get(k, k) for k in keys], loc="upper left",
              bbox_to_anchor=(1.01, 1), fontsize=FONT - 1, frameon=False)
    ax.tick_params(labelsize=FONT - 1)
    if own:
        fig.tight_layout()
    return _finish(fig) if own else fig


def utilization(tl: Timeline, *, title: str | None = None, ax=None):
    """Stacked bars per device: share of time computing, communicating, waiting, idle."""
    plt = _pyplot()
    summary = tl.summary()
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(8, 0.6 * len(tl.ranks) + 1.8))
    else:
        fig = ax.figure
    labels = [row["device"] for row in summary.rows]
    left = [0.0] * len(labels)
    for kind in (COMPUTE, COMM, WAIT, IDLE):
        shares = [row[f"{kind}_share"] * 100 for row in summary.rows]
        ax.barh(labels, shares, left=left, color=COLORS[kind], label=LABELS[kind])
        for i, (x, s) in enumerate(zip(left, shares)):
            if s >= 8:
                ax.text(x + s / 2, i, f"{s:.0f}%", ha="center", va="center",
                        color="black" if kind == IDLE else "white", fontsize=FONT - 2)
        left = [a + b for a, b in zip(left, shares)]
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the timeline (%)", fontsize=FONT)
    ax.set_title(title or "utilization per device (measured)", fontsize=FONT + 2)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=FONT - 1, frameon=False)
    ax.tick_params(labelsize=FONT - 1)
    if own:
        fig.tight_layout()
    return _finish(fig) if own else fig


# Peak unidirectional bandwidth of common GPU links, from vendors' specifications (not
# measured here): NVIDIA H100 SXM datasheet, NVLink 4: 900 GB/s bidirectional per GPU,
# so 450 GB/s each way; PCI-SIG PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 ~ 31.5 GB/s;
# PCIe 3.0 x16 (e.g. the T4 GPUs of free cloud notebooks): ~15.8 GB/s.
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
    from .metrics import bus_factor
    plt = _pyplot()
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(13, 4.8))
    groups: dict[tuple, list[dict]] = {}
    for rec in records:  # "impl" tells two implementations of one operation apart
        groups.setdefault((rec["op"], rec["world_size"], rec.get("impl", "")), []).append(rec)
    for (op, n, impl), recs in sorted(groups.items()):
        recs = sorted(recs, key=lambda r: r["bytes"])
        size = [r["bytes"] for r in recs]
        secs = [r["seconds"] for r in recs]
        label = f"{op}{f' ({impl})' if impl else ''}, {n} ranks"
        (line,) = ax_t.loglog(size, [s * 1e6 for s in secs], "o-", label=label)
        algbw = [b / s / 1e9 for b, s in zip(size, secs)]
        ax_b.loglog(size, algbw, "o-", color=line.get_color(), label=f"{label} (algorithm)")
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
                      fontsize=FONT - 3, color="grey", va="top" if below else "bottom")
    ax_t.set_xlabel("message size (bytes)", fontsize=FONT)
    ax_t.set_ylabel("time per operation (us)", fontsize=FONT)
    ax_t.set_title("latency dominates small messages", fontsize=FONT + 1)
    ax_b.set_xlabel("message size (bytes)", fontsize=FONT)
    ax_b.set_ylabel("bandwidth (GB/s)", fontsize=FONT)
    ax_b.set_title("bandwidth dominates large messages", fontsize=FONT + 1)
    for ax in (ax_t, ax_b):
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=FONT - 3)
    if title:
        fig.suptitle(title, fontsize=FONT + 2)
    fig.tight_layout()
    return _finish(fig)


def scaling(n_devices: Iterable[int], seconds: Iterable[float], *, title: str | None = None):
    """Measured speed-up against the number of devices, with the ideal line."""
    plt = _pyplot()
    n = list(n_devices)
    t = list(seconds)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.plot(n, [t[0] / x for x in t], "o-", label="measured speed-up")
    ax.plot(n, [x / n[0] for x in n], "k--", alpha=0.5, label="ideal")
    ax.set_xlabel("devices", fontsize=FONT)
    ax.set_ylabel("speed-up", fontsize=FONT)
    ax.set_title(title or "scaling (measured)", fontsize=FONT + 2)
    ax.legend(fontsize=FONT - 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _finish(fig)


def training(history: dict, *, title: str | None = None):
    """Loss per step and, if present, test accuracy per epoch."""
    plt = _pyplot()
    has_acc = bool(history.get("test_accuracy"))
    fig, axes = plt.subplots(1, 2 if has_acc else 1, figsize=(11 if has_acc else 6, 3.8))
    axes = list(np.atleast_1d(axes))
    axes[0].plot(history["loss"], lw=1)
    axes[0].set_xlabel("step", fontsize=FONT)
    axes[0].set_ylabel("training loss", fontsize=FONT)
    if has_acc:
        acc = history["test_accuracy"]
        axes[1].plot(range(1, len(acc) + 1), [a * 100 for a in acc], "o-")
        axes[1].set_xlabel("epoch", fontsize=FONT)
        axes[1].set_ylabel("test accuracy (%)", fontsize=FONT)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title or "training (measured)", fontsize=FONT + 1)
    fig.tight_layout()
    return _finish(fig)


def throughput(records: Sequence[dict], *, title: str | None = None):
    """Samples per second and step time against batch size (records from ``throughput``)."""
    plt = _pyplot()
    bs = [r["batch_size"] for r in records]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    a.semilogx(bs, [r["samples_per_s"] for r in records], "o-", base=2)
    a.set_ylabel("samples / s", fontsize=FONT)
    b.loglog(bs, [r["step_s"] * 1e3 for r in records], "o-", base=2)
    b.set_ylabel("time per step (ms)", fontsize=FONT)
    for ax in (a, b):
        ax.set_xlabel("batch size", fontsize=FONT)
        ax.grid(alpha=0.3)
    fig.suptitle(title or "throughput (measured)", fontsize=FONT + 1)
    fig.tight_layout()
    return _finish(fig)


def memory(breakdowns: dict, *, title: str | None = None, unit: str = "MB"):
    """Stacked bars, one per label: bytes of parameters, gradients, optimizer state, ...

    breakdowns: {label: {part: bytes}}, e.g. {"computed": ..., "measured": ...} or one
    entry per device.
    """
    plt = _pyplot()
    scale = {"KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
    labels = list(breakdowns)
    parts: list[str] = []
    for d in breakdowns.values():
        parts += [p for p in d if p not in parts]
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(labels) + 3), 4))
    bottom = [0.0] * len(labels)
    for part in parts:
        vals = [breakdowns[lab].get(part, 0) / scale for lab in labels]
        ax.bar(labels, vals, bottom=bottom, label=part)
        bottom = [a + v for a, v in zip(bottom, vals)]
    ax.set_ylabel(f"memory ({unit})", fontsize=FONT)
    ax.set_title(title or "memory", fontsize=FONT + 1)
    ax.legend(fontsize=FONT - 2, bbox_to_anchor=(1.02, 1), loc="upper left")
    ax.tick_params(labelsize=FONT - 2)
    fig.tight_layout()
    return _finish(fig)


def bars(values: dict, *, ylabel: str, title: str, highlight=None):
    """A simple bar chart of named values (e.g. measured time per layer)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(values) + 2), 3.8))
    names = list(values)
    colors = ["#ff7f0e" if highlight and n in highlight else "#1f77b4" for n in names]
    ax.bar(range(len(names)), list(values.values()), color=colors)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=FONT - 2)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.set_title(title, fontsize=FONT + 1)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _finish(fig)


def curves(series: dict, *, xlabel: str, ylabel: str, title: str, smooth: int = 1,
           logy: bool = False, points: bool = False):
    """One line per entry of ``series`` ({label: (x values, y values)}).

    smooth: a running mean over that many points, for noisy per-batch losses (the raw
    points are drawn faintly behind when ``points``).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, (x, y)) in enumerate(series.items()):
        x, y = np.asarray(x, float), np.asarray(y, float)
        color = PHASE_COLORS[i % len(PHASE_COLORS)]
        if points:
            ax.plot(x, y, ".", color=color, alpha=0.25, ms=4)
        if smooth > 1 and len(y) >= smooth:
            y = np.convolve(y, np.ones(smooth) / smooth, mode="valid")
            x = x[smooth - 1:]
        ax.plot(x, y, "-", color=color, lw=2, label=label)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel, fontsize=FONT)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.set_title(title, fontsize=FONT + 1)
    ax.legend(fontsize=FONT - 2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _finish(fig)


def staleness(records: Sequence[dict], *, title: str | None = None, labels: dict | None = None):
    """Staleness of every applied gradient: over time per worker, and its histogram.

    records: dicts with "time", "worker" and "staleness" (a parameter server's log).
    """
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2, 1]})
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
        ax.legend(fontsize=FONT - 3)
    fig.suptitle(title or "staleness of each applied gradient (measured)", fontsize=FONT + 1)
    fig.tight_layout()
    return _finish(fig)
