"""Figures for timelines, steps, utilization and bandwidth. Every function returns a Figure.

Sized and coloured to read on a projector: large labels, one lane per device, one colour
per kind of time. Figures are closed before they are returned, so a notebook shows each
exactly once (as the cell's value), and nothing piles up in pyplot's registry.

Where things live: ``style`` (the one palette, fonts, phases' colours), ``timelines``
(the timeline and utilization figures), ``charts`` (bandwidth, scaling, training,
throughput, memory, bars, curves, staleness), ``steps`` (a step cut into its parts,
measured beside predicted).
"""
from __future__ import annotations

from .charts import (REFERENCE_LINKS, bandwidth, bars, curves, memory,  # noqa: F401
                     scaling, staleness, throughput, training)
from .steps import (PART_LABELS, measured_vs_predicted, plot_checkpointing,  # noqa: F401
                    plot_step_parts)
from .style import (CANONICAL, COLORS, EXTRA_COLORS, FONT, HATCHES, LABELS,  # noqa: F401
                    MEMORY_COLORS, OKABE_ITO, PHASE_ALIASES, PHASE_COLORS, PHASE_LABELS,
                    PHASES, PREDICTED, STYLE, finish, memory_color, phase_color, phase_of,
                    pyplot, text_color, use_style)
from .timelines import (AXIS_COLORS, AXIS_HATCHES, MORE_AXIS_COLORS,  # noqa: F401
                        axis_color, axis_hatch, timeline, utilization)

use_style()
