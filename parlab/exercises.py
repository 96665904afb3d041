"""Earlier home of the exercises; each lab's now lives in ``parlab.course.labNN``.

Kept so that notebooks written for earlier versions run unchanged: ``check`` finds every
lab's exercises (importing this module registers them all).
"""
from __future__ import annotations

from pathlib import Path

from .course import (lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07,  # noqa: F401
                     lab08)
from .course.exercise import EXERCISES, Exercise, check, register, run_on_ranks  # noqa: F401
from .course.lab02 import check_split  # noqa: F401
from .course.lab03 import check_row_parallel  # noqa: F401
from .course.lab04 import check_schedule  # noqa: F401
from .course.lab05 import check_average_gradients  # noqa: F401
from .course.lab06 import check_update_rule  # noqa: F401
from .course.lab07 import MESH_CASES, check_mesh_groups, mesh_groups_reference  # noqa: F401
from .course.lab08 import check_zero2_step  # noqa: F401
from .course.student import strip_solutions  # noqa: F401


def student_copy(src: str | Path = "labs", dst: str | Path = "student", *,
                 force: bool = False) -> list[Path]:
    """The notebooks written by ``parlab.course.student.student_copy``."""
    from .course.student import student_copy as copy
    return copy(src, dst, force=force)[0]
