"""Earlier home of the explorers; the pattern now lives in ``parlab.course.explorer`` and
each lab's explorer in ``parlab.course.labNN``. Kept so that older notebooks run."""
from __future__ import annotations

from .course.explorer import (HERE, STYLE, choice, cluster_choices, cluster_for,  # noqa: F401
                              explorer, slider, time_unit)
from .course.lab00 import all_reduce_explorer, message_sizes  # noqa: F401
from .course.lab03 import tensor_parallel_explorer  # noqa: F401
from .course.lab04 import pipeline_explorer  # noqa: F401
from .course.lab05 import data_parallel_explorer  # noqa: F401
from .course.lab06 import parameter_server_explorer  # noqa: F401
from .course.lab07 import AXES_INNER, strategy_explorer  # noqa: F401
