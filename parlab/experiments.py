"""Earlier home of what the labs run; each name now lives with its lab or its concern.

Kept so that notebooks and scripts written for earlier versions run unchanged: each lab's
runs are in ``parlab.course.labNN``, step reading in ``parlab.steps``, figures of steps in
``parlab.plot.steps``, calibration in ``parlab.sim.calibrate`` (fits),
``parlab.torch.calibrate`` (rank code) and ``parlab.course.calibrate`` (the launch).
"""
from __future__ import annotations

from .course.calibrate import measure_this_machine  # noqa: F401
from .course.lab00 import predicted_uneven_all_reduce  # noqa: F401
from .course.lab04 import run_pipeline  # noqa: F401
from .course.lab05 import run_multi_worker  # noqa: F401
from .course.lab06 import run_tf_cluster  # noqa: F401
from .course.lab07 import (HYBRID_SHAPES, check_hybrid, run_hybrid,  # noqa: F401
                           run_hybrid_library, survey_hybrid)
from .course.lab08 import run_zero, zero_explorer, zero_fit  # noqa: F401
from .course.lab08 import plot_zero_steps  # noqa: F401
from .plot.steps import (PART_LABELS, measured_vs_predicted, plot_checkpointing,  # noqa: F401
                         plot_step_parts)
from .sim.calibrate import (compute_rate, costs_from_phases, costs_from_pipeline,  # noqa: F401
                            fit_compute, link_from_records, link_from_transfers, this_machine)
from .steps import median_phase, quickest_step, step_seconds, typical_step  # noqa: F401
from .torch.calibrate import CALIBRATION_MESSAGES, network_of  # noqa: F401
