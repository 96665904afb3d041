"""The timeline figure: one lane per device, one colour per kind of time."""
from __future__ import annotations

from typing import Sequence

from ..trace import COMM, COMPUTE, CORE_WAIT, IDLE, WAIT, Timeline
from .style import (COLORS, FONT, HATCHES, LABELS, OKABE_ITO, PHASE_LABELS, PREDICTED,
                    REPLAYED, bar_label, finish, index_of, phase_color, phase_of, phase_rank, pyplot)


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
        the same colour in every figure (``PHASES``). "axis": transfers told apart by the
        mesh axis of their group, each in a shade and a pattern of the transfer orange
        (``AXIS_COLORS``, ``AXIS_HATCHES``: tp, pp, dp), the legend naming each;
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
    replayed = getattr(tl, "replayed", False) and not predicted
    plt = pyplot()
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
    seen.sort(key=phase_rank)      # data, forward, backward, update, then the others as seen
    phases = list(dict.fromkeys([*(phase_of(n) for n in order), *seen]))
    for name in phases:             # fix the colours of unknown names in legend order
        phase_color(name, extra)

    seg_axis = _segment_axes(tl, lanes) if color_by == "axis" else {}
    axes = list(dict.fromkeys(seg_axis.values()))
    indices = sorted({index_of(seg.name) for segs in lanes.values() for seg in segs
                      if seg.kind == COMPUTE and index_of(seg.name) is not None})

    def index_color(i):
        from matplotlib import colormaps
        return colormaps["viridis"](0.9 * (i - indices[0]) / max(indices[-1] - indices[0], 1))

    def color(seg):
        if color_by == "name" and seg.kind == COMPUTE:
            return phase_color(seg.name, extra)
        if color_by == "index" and seg.kind == COMPUTE and index_of(seg.name) is not None:
            return index_color(index_of(seg.name))
        if color_by == "axis" and seg.kind == COMM:
            return axis_color(seg_axis[(seg.rank, seg.start)], axes)
        return COLORS[seg.kind]

    def hatch(seg):
        own = (axis_hatch(seg_axis[(seg.rank, seg.start)], axes)
               if color_by == "axis" and seg.kind == COMM else HATCHES.get(seg.kind))
        if predicted and seg.kind != IDLE:      # dotted, and a wait keeps its stripes
            return (own or "") + HATCHES[PREDICTED]
        return own

    for lane, rank in enumerate(tl.ranks):
        y = len(tl.ranks) - 1 - lane
        for seg in lanes[rank]:
            left, w = (seg.start - t0) * scale, (seg.end - seg.start) * scale
            c, h = color(seg), hatch(seg)
            edge = "none" if seg.kind == IDLE else "black" if replayed else "white"
            ax.barh(y, w, left=left, height=0.72, color=c, hatch=h, edgecolor=edge,
                    linewidth=0.8 if replayed else 0.6)
            if names and seg.kind != IDLE and seg.name:
                bar_label(ax, left, left + w, y, seg.name, c, boxed=bool(h))
    ax.set_yticks(range(len(tl.ranks)))
    ax.set_yticklabels([tl.labels[r] for r in reversed(tl.ranks)], fontsize=FONT - 1)
    ax.set_xlabel(f"time ({'µs' if unit == 'us' else unit})", fontsize=FONT)
    # timelines stacked with sharex=True share one time axis: the longest sets it
    right = max([width * scale, *(a.get_xlim()[1] for a in ax.get_shared_x_axes().get_siblings(ax)
                                  if a is not ax and getattr(a, "_parlab_timeline", False))])
    ax._parlab_timeline = True
    ax.set_xlim(0, right)
    ax.set_ylim(-0.6, len(tl.ranks) - 0.4)
    kind = ("predicted (cost model)" if predicted else "replayed on dedicated devices"
            if replayed else "measured")
    ax.set_title(title or f"{kind} timeline", fontsize=FONT + 1)
    if color_by == "name":
        # names that share a colour (lab 06's "sum gradients" is compute, like "forward")
        # share one legend entry, not two swatches that look the same
        by_color: dict[str, list[str]] = {}
        for n in phases:
            by_color.setdefault(phase_color(n, extra), []).append(PHASE_LABELS.get(n, n))
        entries = [(", ".join(names), c, None) for c, names in by_color.items()]
        kinds = [k for k in (COMM, WAIT, CORE_WAIT, IDLE) if k in present]
    elif color_by == "index":
        shown = indices if len(indices) <= 6 else [indices[round(k * (len(indices) - 1) / 5)]
                                                   for k in range(6)]
        stem = next((phase_of(seg.name) for segs in lanes.values() for seg in segs
                     if seg.kind == COMPUTE and index_of(seg.name) is not None), "")
        entries = [(f"{stem}{i}", index_color(i), None) for i in shown]
        kinds = [k for k in (COMM, WAIT, CORE_WAIT, IDLE) if k in present]
    elif color_by == "axis":
        entries = [(LABELS[COMPUTE], COLORS[COMPUTE], None)] if COMPUTE in present else []
        entries += [(f"transfer: {a}" if a else "transfer: no axis", axis_color(a, axes),
                     axis_hatch(a, axes)) for a in sorted(axes, key=_axis_order)]
        kinds = [k for k in (WAIT, CORE_WAIT, IDLE) if k in present]
    else:
        entries = []
        kinds = [k for k in (COMPUTE, COMM, WAIT, CORE_WAIT, IDLE) if k in present]
    # a replay prices the time between traced spans as work: its gaps are not all idle
    entries += [("untraced work or idle" if k == IDLE and replayed else LABELS[k], COLORS[k],
                 HATCHES.get(k)) for k in kinds]
    if predicted:
        entries.append((LABELS[PREDICTED], "white", HATCHES[PREDICTED]))
    if replayed:
        entries.append((LABELS[REPLAYED], "white", None))
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, hatch=h,
                             edgecolor="black" if c == "white" else "white", linewidth=0.6)
               for _, c, h in entries]
    if legend:
        ax.legend(handles, [label for label, _, _ in entries], loc="upper left",
                  bbox_to_anchor=(1.01, 1), fontsize=FONT - 2, frameon=False)
    ax.tick_params(labelsize=FONT - 2)
    if own:
        fig.tight_layout()
    return finish(fig) if own else fig


# Transfers by mesh axis (lab 07) or by collective (lab 08): every transfer keeps the
# course's transfer orange, in a shade and a pattern of its axis, so that no transfer
# takes the colour of a phase (backward's green, update's purple) or of another kind.
# Tensor parallel, the axis that talks most, keeps the plain orange.
# The light shades stay well away from idle's grey.
AXIS_COLORS = {"tp": OKABE_ITO["orange"], "pp": "#A86F00", "dp": "#F2BA48"}
AXIS_HATCHES = {"tp": None, "pp": "||", "dp": "--"}
# Other axes (lab 08's collectives: all_gather, all_reduce, reduce_scatter, in that order)
# take these: orange shades, none as dark or as red as wait's vermillion, and patterns of
# rings, crosses and upright stripes, never the diagonal stripes that mark a wait.
# Five of them differ by shade and pattern together (lab 10 shows all_gather, all_reduce,
# reduce_scatter and its ring passes in one figure); "no axis" sorts after every named one,
# so that a figure with and one without it give each named axis the same look.
MORE_AXIS_COLORS = ("#C98A00", "#EDB23A", "#E69F00", "#A86F00", "#F2BA48")
MORE_AXIS_HATCHES = ("oo", "++", "||", "--", "OO")


def _axis_order(axis):
    known = list(AXIS_COLORS)
    if axis is None:
        return (2, 0, "")
    return (0, known.index(axis), "") if axis in known else (1, 0, str(axis))


def axis_color(axis: str | None, axes: Sequence = ()) -> str:
    """The colour of transfers on mesh axis ``axis`` (None: no axis, e.g. the world)."""
    if axis in AXIS_COLORS:
        return AXIS_COLORS[axis]
    return MORE_AXIS_COLORS[_other_axis(axis, axes) % len(MORE_AXIS_COLORS)]


def axis_hatch(axis: str | None, axes: Sequence = ()) -> str | None:
    """The pattern of transfers on mesh axis ``axis``: with the shade, what tells it apart."""
    if axis in AXIS_HATCHES:
        return AXIS_HATCHES[axis]
    return MORE_AXIS_HATCHES[_other_axis(axis, axes) % len(MORE_AXIS_HATCHES)]


def _other_axis(axis, axes) -> int:
    others = sorted((a for a in axes if a not in AXIS_COLORS), key=_axis_order)
    return others.index(axis) if axis in others else len(others)


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
                # back-to-back spans of one name make one segment: their common axis
                joined = {s.axis for s in spans if s.name == seg.name
                          and s.start < seg.end and s.end > seg.start}
                out[(rank, seg.start)] = (top.axis if top is not None else
                                          joined.pop() if len(joined) == 1 else None)
    return out


def utilization(tl: Timeline, *, title: str | None = None, ax=None):
    """Stacked bars per device: share of time computing, transferring, waiting, waiting
    for a core (where measured and present), idle."""
    plt = pyplot()
    summary = tl.summary()
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(10, 0.7 * len(tl.ranks) + 2))
    else:
        fig = ax.figure
    labels = [row["device"] for row in summary.rows]
    left = [0.0] * len(labels)
    kinds = [k for k in (COMPUTE, COMM, WAIT, CORE_WAIT, IDLE)
             if k != CORE_WAIT or any(row[f"{k}_share"] > 0 for row in summary.rows)]
    for kind in kinds:
        shares = [row[f"{kind}_share"] * 100 for row in summary.rows]
        ax.barh(labels, shares, left=left, color=COLORS[kind], label=LABELS[kind],
                hatch=HATCHES.get(kind), edgecolor="white", linewidth=0.6)
        for i, (x, s) in enumerate(zip(left, shares)):
            if s > 0:
                bar_label(ax, x, x + s, i, f"{s:.0f}%", COLORS[kind], boxed=kind in HATCHES)
        left = [a + b for a, b in zip(left, shares)]
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the timeline (%)", fontsize=FONT)
    ax.set_title(title or "utilization per device (measured)", fontsize=FONT + 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=FONT - 2, frameon=False)
    ax.tick_params(labelsize=FONT - 2)
    if own:
        fig.tight_layout()
    return finish(fig) if own else fig


# Peak unidirectional bandwidth of common GPU links, from vendors' specifications (not
# measured here): NVIDIA H100 SXM datasheet, NVLink 4: 900 GB/s bidirectional per GPU,
# so 450 GB/s each way; PCI-SIG PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 ~ 31.5 GB/s;
# PCIe 3.0 x16 (e.g. the T4 GPUs of free cloud notebooks): ~15.8 GB/s.
