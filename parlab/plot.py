"""Figures for timelines, utilization and bandwidth. Every function returns a Figure.

Sized and coloured to read on a projector: large labels, one lane per device, one colour
per kind of time. Figures are closed before they are returned, so a notebook shows each
exactly once (as the cell's value), and nothing piles up in pyplot's registry.

One palette for the whole course: every kind of time (compute, transfer, wait, idle,
predicted) and every common phase (forward, backward, update, data; F and B of a
pipeline) has the same colour in every figure of every lab. The colours are Okabe and
Ito's ("Color Universal Design", 2008), told apart with every common colour-vision
deficiency; waiting is also hatched, so it never reads as transfer, even in grey.
Legends sit beside the axes, never on the data; a bar's name is written only where it fits.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .trace import COMM, COMPUTE, IDLE, WAIT, Timeline

# Okabe-Ito (2008): eight colours distinguishable with protan, deutan and tritan vision.
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky blue": "#56B4E9",
             "bluish green": "#009E73", "yellow": "#F0E442", "blue": "#0072B2",
             "vermillion": "#D55E00", "reddish purple": "#CC79A7"}
PREDICTED = "predicted"     # a kind of its own in figures: drawn by the cost model, not measured
COLORS = {COMPUTE: OKABE_ITO["blue"], COMM: OKABE_ITO["orange"], WAIT: OKABE_ITO["vermillion"],
          IDLE: "#E4E4E4", PREDICTED: OKABE_ITO["black"]}
HATCHES = {WAIT: "///", PREDICTED: ".."}   # wait striped: never mistaken for transfer
LABELS = {COMPUTE: "compute", COMM: "transfer", WAIT: "wait", IDLE: "idle",
          PREDICTED: "predicted (cost model)"}
FONT = 15                   # read from the back of a classroom: titles FONT+1, ticks FONT-2

# Phases of a step keep one colour everywhere, chosen apart from the kinds' transfer
# orange, wait vermillion and idle grey. F and B are a pipeline's forward and backward.
PHASES = {"forward": OKABE_ITO["blue"], "backward": OKABE_ITO["bluish green"],
          "update": OKABE_ITO["reddish purple"], "data": OKABE_ITO["sky blue"],
          "emulated slowdown": OKABE_ITO["yellow"], "compute": OKABE_ITO["blue"]}
PHASE_ALIASES = {"F": "forward", "B": "backward", "apply update": "update",
                 "average + update": "update", "make data": "data", "t": "forward"}
PHASE_LABELS = {"F": "F (forward)", "B": "B (backward)", "t": "time step"}
# Memory parts in every figure: each with the colour of the phase that makes it (the
# forward pass uses the parameters, the backward pass makes gradients, the update keeps
# the optimizer's state); activations take the data's colour.
MEMORY_COLORS = {"parameters": PHASES["forward"], "variables": PHASES["forward"],
                 "gradients": PHASES["backward"], "optimizer state": PHASES["update"],
                 "activations": PHASES["data"]}
# Any other name takes the next of these (Paul Tol's colour-blind-safe "muted" scheme).
EXTRA_COLORS = ("#332288", "#999933", "#882255", "#44AA99", "#DDCC77", "#117733", "#88CCEE")


# The course's defaults for every figure, hand-made ones in a notebook included: lines in
# the palette's order, large text, legends without a frame.
STYLE = {
    "axes.prop_cycle": None,    # filled in below, from PHASE_COLORS
    "font.size": FONT - 2, "axes.titlesize": FONT + 1, "axes.labelsize": FONT,
    "xtick.labelsize": FONT - 2, "ytick.labelsize": FONT - 2, "legend.fontsize": FONT - 2,
    "figure.titlesize": FONT + 1, "legend.frameon": False, "lines.linewidth": 2.0,
    "lines.markersize": 7.0, "axes.grid": False, "hatch.linewidth": 1.0,
}


def use_style() -> None:
    """Apply the course's matplotlib defaults (done once, when ``parlab.plot`` is imported)."""
    import matplotlib
    from cycler import cycler
    matplotlib.rcParams.update({**STYLE, "axes.prop_cycle": cycler(color=list(PHASE_COLORS))})


def _pyplot():
    import matplotlib.pyplot as plt
    return plt


def _finish(fig):
    _pyplot().close(fig)
    return fig


# Lines of a chart (one per series): the same colours, in an order that starts strong and
# keeps transfer orange and wait vermillion for later, so that they rarely meet a timeline.
PHASE_COLORS = (OKABE_ITO["blue"], OKABE_ITO["bluish green"], OKABE_ITO["reddish purple"],
                OKABE_ITO["sky blue"], OKABE_ITO["black"], OKABE_ITO["orange"],
                OKABE_ITO["vermillion"], OKABE_ITO["yellow"])


def phase_of(name: str) -> str:
    """The phase a span name belongs to: trailing digits dropped (F3 -> F, t12 -> t)."""
    return name.rstrip("0123456789") or name


CANONICAL = ("data", "forward", "backward", "update")     # the order of a step, for legends


def _phase_rank(phase: str) -> int:
    key = PHASE_ALIASES.get(phase, phase)
    return CANONICAL.index(key) if key in CANONICAL else len(CANONICAL)


def _index_of(name: str):
    """The number a span name ends with (t12 -> 12, F3 -> 3), or None."""
    digits = name[len(name.rstrip("0123456789")):]
    return int(digits) if digits else None


def phase_color(name: str, extra: dict | None = None) -> str:
    """The course's colour for a phase name; unknown names take colours from ``extra``."""
    phase = phase_of(name)
    key = PHASE_ALIASES.get(phase, phase)
    if key in PHASES:
        return PHASES[key]
    if extra is None:
        extra = {}
    if phase not in extra:
        extra[phase] = EXTRA_COLORS[len(extra) % len(EXTRA_COLORS)]
    return extra[phase]


def text_color(background: str) -> str:
    """Black or white, whichever contrasts more with ``background`` (WCAG 2 luminance)."""
    from matplotlib.colors import to_rgb
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(background)]
    lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return "black" if (lum + 0.05) / 0.05 > 1.05 / (lum + 0.05) else "white"


_FIT_TEXT = None


def _fit_text_class():
    """A Text that draws itself only if it fits inside its bar, decided at draw time.

    The check happens when the figure is drawn, after the layout is final, so a label is
    never written across its neighbours, whatever the figure's size.
    """
    global _FIT_TEXT
    if _FIT_TEXT is None:
        from matplotlib.text import Text

        class FitText(Text):
            def __init__(self, *args, bar=(0.0, 0.0), **kwargs):
                super().__init__(*args, **kwargs)
                self.bar = bar          # (left, right) of the bar in data coordinates
                self.fits = None        # set at each draw: was the label drawn?
                self.set_in_layout(False)   # a label inside a bar never needs layout room

            def draw(self, renderer):
                if not self.get_visible():
                    return
                ax = self.axes
                x0 = ax.transData.transform((self.bar[0], 0))[0]
                x1 = ax.transData.transform((self.bar[1], 0))[0]
                lo, hi = ax.transAxes.transform((0, 0))[0], ax.transAxes.transform((1, 0))[0]
                room = min(x1, hi) - max(x0, lo)
                box = self.get_window_extent(renderer)
                self.fits = box.width + 6 <= room and lo <= box.x0 and box.x1 <= hi
                if self.fits:
                    super().draw(renderer)

        _FIT_TEXT = FitText
    return _FIT_TEXT


def _bar_label(ax, x0: float, x1: float, y: float, text: str, background: str,
               boxed: bool = False):
    """Write ``text`` centred on the bar [x0, x1] at height y, only if it fits.

    boxed: on a plain patch of the bar's colour, for hatched bars (wait, predicted).
    """
    box = dict(boxstyle="square,pad=0.15", facecolor=background, edgecolor="none") if boxed else None
    label = _fit_text_class()((x0 + x1) / 2, y, text, bar=(x0, x1), ha="center", va="center",
                              color=text_color(background), fontsize=FONT - 3, clip_on=True,
                              bbox=box)
    getattr(ax, "_add_text", ax.add_artist)(label)   # _add_text also clips it to the axes
    return label


def timeline(tl: Timeline, *, title: str | None = None, ax=None, names: bool = True,
             unit: str = "ms", predicted: bool | None = None, color_by: str = "kind",
             order: Sequence[str] = (), legend: bool = True):
    """Draw one lane per device; bars coloured by kind, idle time in light grey.

    names: write span names on the bars they fit in (the others stay unlabelled).
    predicted: label the figure as a prediction (cost model), not a measurement; its
        bars are dotted. Default: the timeline's own ``predicted`` flag (``parlab.sim``'s
        timelines carry it), so a prediction is never drawn as a measurement.
    color_by: "kind" (compute / transfer / wait) or "name" (one colour per phase:
        forward, backward, update, ...; trailing digits are ignored, so F0, F1, ... share
        a colour; transfer, wait and idle keep their kind's colour). Known phases have
        the same colour in every figure (``PHASES``). "axis": transfers coloured by the
        mesh axis of their group (``AXIS_COLORS``: tp, pp, dp), the legend naming each;
        compute, wait and idle keep their kind's colour. "index": compute bars coloured
        by the number at the end of their name (t0 .. t15, F0 .. F7) on a sequential
        scale (viridis, colour-blind safe), so the same time step or micro-batch has one
        colour on every lane: a wavefront shows as a colour drifting diagonally.
    order: with color_by="name", phase names to list first in the legend, in this order
        (names not in ``PHASES`` also take their colours in this order).
    legend: False leaves the legend out (e.g. on all but one of stacked timelines, which
        share the colours).
    """
    if color_by not in ("kind", "name", "axis", "index"):
        raise ValueError(f"color_by must be 'kind', 'name', 'axis' or 'index', got {color_by!r}")
    if predicted is None:
        predicted = getattr(tl, "predicted", False)
    plt = _pyplot()
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(13, 0.8 * len(tl.ranks) + 1.8))
    else:
        fig = ax.figure
    t0, width = tl.start, max(tl.duration, 1e-12)
    lanes = {rank: tl.segments(rank) for rank in tl.ranks}
    present = {seg.kind for segs in lanes.values() for seg in segs}
    extra: dict[str, str] = {}
    seen = list(dict.fromkeys(phase_of(seg.name) for segs in lanes.values() for seg in segs
                              if seg.kind == COMPUTE))
    seen.sort(key=_phase_rank)      # data, forward, backward, update, then the others as seen
    phases = list(dict.fromkeys([*(phase_of(n) for n in order), *seen]))
    for name in phases:             # fix the colours of unknown names in legend order
        phase_color(name, extra)

    seg_axis = _segment_axes(tl, lanes) if color_by == "axis" else {}
    axes = list(dict.fromkeys(seg_axis.values()))
    indices = sorted({_index_of(seg.name) for segs in lanes.values() for seg in segs
                      if seg.kind == COMPUTE and _index_of(seg.name) is not None})

    def index_color(i):
        from matplotlib import colormaps
        return colormaps["viridis"](0.9 * (i - indices[0]) / max(indices[-1] - indices[0], 1))

    def color(seg):
        if color_by == "name" and seg.kind == COMPUTE:
            return phase_color(seg.name, extra)
        if color_by == "index" and seg.kind == COMPUTE and _index_of(seg.name) is not None:
            return index_color(_index_of(seg.name))
        if color_by == "axis" and seg.kind == COMM:
            return axis_color(seg_axis[(seg.rank, seg.start)], axes)
        return COLORS[seg.kind]

    def hatch(seg):
        return HATCHES[PREDICTED] if predicted and seg.kind != IDLE else HATCHES.get(seg.kind)

    for lane, rank in enumerate(tl.ranks):
        y = len(tl.ranks) - 1 - lane
        for seg in lanes[rank]:
            left, w = (seg.start - t0) * scale, (seg.end - seg.start) * scale
            c, h = color(seg), hatch(seg)
            ax.barh(y, w, left=left, height=0.72, color=c, hatch=h,
                    edgecolor="white" if seg.kind != IDLE else "none", linewidth=0.6)
            if names and seg.kind != IDLE and seg.name:
                _bar_label(ax, left, left + w, y, seg.name, c, boxed=bool(h))
    ax.set_yticks(range(len(tl.ranks)))
    ax.set_yticklabels([tl.labels[r] for r in reversed(tl.ranks)], fontsize=FONT - 1)
    ax.set_xlabel(f"time ({unit})", fontsize=FONT)
    # timelines stacked with sharex=True share one time axis: the longest sets it
    right = max([width * scale, *(a.get_xlim()[1] for a in ax.get_shared_x_axes().get_siblings(ax)
                                  if a is not ax and getattr(a, "_parlab_timeline", False))])
    ax._parlab_timeline = True
    ax.set_xlim(0, right)
    ax.set_ylim(-0.6, len(tl.ranks) - 0.4)
    kind = "predicted (cost model)" if predicted else "measured"
    ax.set_title(title or f"{kind} timeline", fontsize=FONT + 1)
    if color_by == "name":
        entries = [(PHASE_LABELS.get(n, n), phase_color(n, extra), None) for n in phases]
        kinds = [k for k in (COMM, WAIT, IDLE) if k in present]
    elif color_by == "index":
        shown = indices if len(indices) <= 6 else [indices[round(k * (len(indices) - 1) / 5)]
                                                   for k in range(6)]
        stem = next((phase_of(seg.name) for segs in lanes.values() for seg in segs
                     if seg.kind == COMPUTE and _index_of(seg.name) is not None), "")
        entries = [(f"{stem}{i}", index_color(i), None) for i in shown]
        kinds = [k for k in (COMM, WAIT, IDLE) if k in present]
    elif color_by == "axis":
        entries = [(LABELS[COMPUTE], COLORS[COMPUTE], None)] if COMPUTE in present else []
        entries += [(f"transfer: {a}" if a else "transfer: no axis", axis_color(a, axes), None)
                    for a in sorted(axes, key=_axis_order)]
        kinds = [k for k in (WAIT, IDLE) if k in present]
    else:
        entries = []
        kinds = [k for k in (COMPUTE, COMM, WAIT, IDLE) if k in present]
    entries += [(LABELS[k], COLORS[k], HATCHES.get(k)) for k in kinds]
    if predicted:
        entries.append((LABELS[PREDICTED], "white", HATCHES[PREDICTED]))
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, hatch=h,
                             edgecolor="black" if c == "white" else "white", linewidth=0.6)
               for _, c, h in entries]
    if legend:
        ax.legend(handles, [label for label, _, _ in entries], loc="upper left",
                  bbox_to_anchor=(1.01, 1), fontsize=FONT - 2, frameon=False)
    ax.tick_params(labelsize=FONT - 2)
    if own:
        fig.tight_layout()
    return _finish(fig) if own else fig


# Transfers by mesh axis (lab 07), from the same Okabe-Ito colours, none of them the
# colour of compute (blue), wait (vermillion) or idle (grey): tensor parallel keeps the
# course's transfer orange, the axis that talks most.
AXIS_COLORS = {"tp": OKABE_ITO["orange"], "pp": OKABE_ITO["bluish green"],
               "dp": OKABE_ITO["reddish purple"]}
MORE_AXIS_COLORS = (OKABE_ITO["sky blue"], OKABE_ITO["yellow"], OKABE_ITO["black"])


def _axis_order(axis):
    known = list(AXIS_COLORS)
    return (0, known.index(axis), "") if axis in known else (1, 0, str(axis))


def axis_color(axis: str | None, axes: Sequence = ()) -> str:
    """The colour of transfers on mesh axis ``axis`` (None: no axis, e.g. the world)."""
    if axis in AXIS_COLORS:
        return AXIS_COLORS[axis]
    others = sorted((a for a in axes if a not in AXIS_COLORS), key=_axis_order)
    i = others.index(axis) if axis in others else len(others)
    return MORE_AXIS_COLORS[i % len(MORE_AXIS_COLORS)]


def _segment_axes(tl: Timeline, lanes: dict) -> dict:
    """(rank, start) of each transfer segment -> the mesh axis of the span it came from.

    Segments keep a span's kind and name but not its axis: take it from the innermost
    transfer span of that name covering the segment.
    """
    out = {}
    for rank, segs in lanes.items():
        spans = [s for s in tl.spans if s.rank == rank and s.kind == COMM]
        for seg in segs:
            if seg.kind == COMM:
                owners = [s for s in spans if s.name == seg.name and s.start <= seg.start
                          and s.end >= seg.end]
                top = max(owners, key=lambda s: (s.start, -s.end)) if owners else None
                out[(rank, seg.start)] = top.axis if top is not None else None
    return out


def utilization(tl: Timeline, *, title: str | None = None, ax=None):
    """Stacked bars per device: share of time computing, transferring, waiting, idle."""
    plt = _pyplot()
    summary = tl.summary()
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(10, 0.7 * len(tl.ranks) + 2))
    else:
        fig = ax.figure
    labels = [row["device"] for row in summary.rows]
    left = [0.0] * len(labels)
    for kind in (COMPUTE, COMM, WAIT, IDLE):
        shares = [row[f"{kind}_share"] * 100 for row in summary.rows]
        ax.barh(labels, shares, left=left, color=COLORS[kind], label=LABELS[kind],
                hatch=HATCHES.get(kind), edgecolor="white", linewidth=0.6)
        for i, (x, s) in enumerate(zip(left, shares)):
            if s > 0:
                _bar_label(ax, x, x + s, i, f"{s:.0f}%", COLORS[kind], boxed=kind in HATCHES)
        left = [a + b for a, b in zip(left, shares)]
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the timeline (%)", fontsize=FONT)
    ax.set_title(title or "utilization per device (measured)", fontsize=FONT + 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=FONT - 2, frameon=False)
    ax.tick_params(labelsize=FONT - 2)
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
    ax_t.set_xlabel("message size (bytes)", fontsize=FONT)
    ax_t.set_ylabel("time per operation (us)", fontsize=FONT)
    ax_t.set_title("latency dominates small messages", fontsize=FONT + 1)
    ax_b.set_xlabel("message size (bytes)", fontsize=FONT)
    ax_b.set_ylabel("bandwidth (GB/s)", fontsize=FONT)
    ax_b.set_title("bandwidth dominates large messages", fontsize=FONT + 1)
    for ax in (ax_t, ax_b):
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(labelsize=FONT - 2)
    # one legend, beside the right-hand plot: both plots use the same colour per line
    ax_b.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=FONT - 3, frameon=False)
    if title:
        fig.suptitle(title, fontsize=FONT + 2)
    fig.tight_layout()
    return _finish(fig)


def scaling(n_devices: Iterable[int], seconds: Iterable[float], *, title: str | None = None):
    """Measured speed-up against the number of devices, with the ideal line."""
    plt = _pyplot()
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
    return _finish(fig)


def training(history: dict, *, title: str | None = None):
    """Loss per step and, if present, test accuracy per epoch."""
    plt = _pyplot()
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
    return _finish(fig)


def throughput(records: Sequence[dict], *, title: str | None = None):
    """Samples per second and step time against batch size (records from ``throughput``)."""
    plt = _pyplot()
    bs = [r["batch_size"] for r in records]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    a.semilogx(bs, [r["samples_per_s"] for r in records], "o-", base=2, color=PHASE_COLORS[0],
               lw=2, ms=7)
    a.set_ylabel("samples / s", fontsize=FONT)
    b.loglog(bs, [r["step_s"] * 1e3 for r in records], "o-", base=2, color=PHASE_COLORS[1],
             lw=2, ms=7)
    b.set_ylabel("time per step (ms)", fontsize=FONT)
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    for ax in (a, b):
        ax.set_xlabel("batch size", fontsize=FONT)
        ax.set_xticks(bs, [str(x) for x in bs])         # the batch sizes, not powers of 2
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=FONT - 2)
    b.yaxis.set_major_formatter(ScalarFormatter())      # milliseconds as plain numbers
    b.yaxis.set_minor_formatter(NullFormatter())
    fig.suptitle(title or "throughput (measured)", fontsize=FONT + 1)
    fig.tight_layout()
    return _finish(fig)


def memory(breakdowns: dict, *, title: str | None = None, unit: str = "MB"):
    """Stacked bars, one per label: bytes of parameters, gradients, optimizer state, ...

    breakdowns: {label: {part: bytes}}, e.g. {"computed": ..., "measured": ...} or one
    entry per device.
    """
    plt = _pyplot()
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
        color = MEMORY_COLORS.get(part) or phase_color(part, extra)
        ax.bar(labels, vals, bottom=bottom, label=part, color=color, edgecolor="white", linewidth=0.6)
        bottom = [a + v for a, v in zip(bottom, vals)]
    ax.set_ylabel(f"memory ({unit})", fontsize=FONT)
    ax.set_title(title or "memory", fontsize=FONT + 1)
    ax.legend(fontsize=FONT - 2, bbox_to_anchor=(1.02, 1), loc="upper left", frameon=False)
    ax.tick_params(labelsize=FONT - 2)
    if len(labels) > 3:
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    return _finish(fig)


def bars(values: dict, *, ylabel: str, title: str, highlight=None):
    """A simple bar chart of named values (e.g. measured time per layer)."""
    plt = _pyplot()
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
    return _finish(fig)


def curves(series: dict, *, xlabel: str, ylabel: str, title: str, smooth: int = 1,
           logy: bool = False, points: bool = False, dashed=()):
    """One line per entry of ``series`` ({label: (x values, y values)}).

    smooth: a running mean over that many points, for noisy per-batch losses (the raw
    points are drawn faintly behind when ``points``).
    dashed: labels drawn dashed and thinner, on top, so a curve that lies exactly on
    another one stays visible.
    """
    plt = _pyplot()
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
            ax.plot(x, y, "--", color=color, lw=1.8, label=label, zorder=3)
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
    return _finish(fig)


def staleness(records: Sequence[dict], *, title: str | None = None, labels: dict | None = None):
    """Staleness of every applied gradient: over time per worker, and its histogram.

    records: dicts with "time", "worker" and "staleness" (a parameter server's log).
    """
    plt = _pyplot()
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
    return _finish(fig)


use_style()
