"""Figures for timelines, utilization and bandwidth. Every function returns a Figure.

Sized and coloured to read on a projector: large labels, one lane per device, one colour
per kind of time. Figures are closed before they are returned, so a notebook shows each
exactly once (as the cell's value), and nothing piles up in pyplot's registry.

One palette for the whole course: every kind of time (compute, transfer, wait, waiting
for a core, idle, predicted) and every common phase (forward, backward, update, data; F and B of a
pipeline) has the same colour in every figure of every lab. The colours are Okabe and
Ito's ("Color Universal Design", 2008), told apart with every common colour-vision
deficiency; waiting is also hatched, so it never reads as transfer, even in grey, and
waiting for a core is a darker grey than idle, cross-hatched: the rank was ready, the
machine was not. Three sources, told apart at a glance: measured bars have white edges,
replayed bars black outlines, predicted bars are dotted.
Legends sit beside the axes, never on the data; a bar's name is written only where it fits.
"""
from __future__ import annotations

from ..trace import COMM, COMPUTE, CORE_WAIT, IDLE, WAIT

# Okabe-Ito (2008): eight colours distinguishable with protan, deutan and tritan vision.
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky blue": "#56B4E9",
             "bluish green": "#009E73", "yellow": "#F0E442", "blue": "#0072B2",
             "vermillion": "#D55E00", "reddish purple": "#CC79A7"}
PREDICTED = "predicted"     # a kind of its own in figures: drawn by the cost model, not measured
REPLAYED = "replayed"       # and this: the run's measured work laid out on dedicated devices
COLORS = {COMPUTE: OKABE_ITO["blue"], COMM: OKABE_ITO["orange"], WAIT: OKABE_ITO["vermillion"],
          CORE_WAIT: "#8C8C8C", IDLE: "#E4E4E4", PREDICTED: OKABE_ITO["black"]}
# wait striped: never mistaken for transfer; a core wait crossed: never mistaken for idle
HATCHES = {WAIT: "///", CORE_WAIT: "xx", PREDICTED: ".."}
LABELS = {COMPUTE: "compute", COMM: "transfer", WAIT: "wait", CORE_WAIT: "waiting for a core",
          IDLE: "idle", PREDICTED: "predicted (cost model)",
          REPLAYED: "replayed (dedicated devices)"}
FONT = 15                   # read from the back of a classroom: titles FONT+1, ticks FONT-2

# Phases of a step keep one colour everywhere, chosen apart from the kinds' transfer
# orange, wait vermillion and idle grey. F and B are a pipeline's forward and backward.
PHASES = {"forward": OKABE_ITO["blue"], "backward": OKABE_ITO["bluish green"],
          "update": OKABE_ITO["reddish purple"], "data": OKABE_ITO["sky blue"],
          "emulated slowdown": OKABE_ITO["yellow"], "compute": OKABE_ITO["blue"]}
PHASE_ALIASES = {"F": "forward", "B": "backward", "apply update": "update",
                 "average + update": "update", "make data": "data", "t": "forward",
                 # computation that is none of the four phases: the compute blue
                 "forward + backward": "compute", "sum gradients": "compute"}
PHASE_LABELS = {"F": "F (forward)", "B": "B (backward)", "t": "time step"}
# Memory parts in every figure: colours of their own, never a phase's (a memory figure
# beside a timeline must not say "gradients" in the backward pass's green). Paul Tol's
# "muted" scheme (colour-blind safe, as Okabe-Ito), the members furthest from the
# phases' colours: indigo, olive, sand, wine, teal.
MEMORY_COLORS = {"parameters": "#332288", "variables": "#332288", "gradients": "#999933",
                 "optimizer state": "#DDCC77", "activations": "#882255",
                 "gathered parameters": "#44AA99"}
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


def pyplot():
    import matplotlib.pyplot as plt
    return plt


def finish(fig):
    pyplot().close(fig)
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


def phase_rank(phase: str) -> int:
    key = PHASE_ALIASES.get(phase, phase)
    return CANONICAL.index(key) if key in CANONICAL else len(CANONICAL)


def index_of(name: str):
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


def memory_color(part: str, extra: dict | None = None) -> str:
    """The course's colour for a memory part; other parts take colours that neither a
    known part nor a phase uses, in the order they come (``extra`` remembers them)."""
    if part in MEMORY_COLORS:
        return MEMORY_COLORS[part]
    extra = {} if extra is None else extra
    if part not in extra:
        free = [c for c in EXTRA_COLORS if c not in MEMORY_COLORS.values()]
        extra[part] = free[len(extra) % len(free)]
    return extra[part]


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


def bar_label(ax, x0: float, x1: float, y: float, text: str, background: str,
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
