"""Checks on the numbers that enter the cost model, where they enter.

A NaN or a negative figure does not fail loudly further in: a NaN duration never lets the
event engine's clock pass a deadline (a cell that never returns), a negative bandwidth
predicts a faster step, a zero one divides by zero. So every input class (``Link``,
``Cluster``, ``Workload``, ``Plan``, ``Layer``, ``Network``) and every preset checks its
fields when it is built, and the message names the field and the value it got.
"""
from __future__ import annotations

import math
import numbers

from ..errors import counted


def amount(owner: str, name: str, value, *, unit: str = "", positive: bool = False,
           infinite: bool = False) -> float:
    """``value`` as a float: a real number >= 0 (> 0 if ``positive``), finite unless
    ``infinite`` (an unlimited bandwidth, say). Raises ValueError naming ``owner.name``."""
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and not math.isnan(value) and (value > 0 if positive else value >= 0)
          and (infinite or math.isfinite(value)))
    if not ok:
        bound = "above 0" if positive else "0 or more"
        kind = "a number" + ("" if infinite else " (finite)")
        what = f" {unit}" if unit else ""
        raise ValueError(f"{owner}: {name} must be {kind} {bound}{what}, got {value!r}")
    return float(value)


def count(owner: str, name: str, value, minimum: int = 1) -> int:
    """``value`` as an int: a whole number >= ``minimum``. Raises ValueError naming it."""
    return counted(value, f"{owner}: {name}", minimum)


def expert_ranks(owner: str, dp: int, cp: int, ep: int) -> None:
    """ep must divide the dp × cp ranks the experts spread over (a mixture's experts are
    split among ep of the ranks that split the data). Raises ValueError naming it."""
    if (dp * cp) % ep:
        raise ValueError(f"{owner}: ep={ep} must divide dp × cp = {dp * cp} (the ranks that "
                         "hold the experts between them): choose an ep that divides it")


def whole_experts(owner: str, experts: int, ep: int) -> int:
    """experts / ep, each rank holding whole experts; raises ValueError where ep does not
    divide them."""
    if experts % ep:
        raise ValueError(f"{owner}: ep={ep} must divide the {experts} experts (each rank "
                         f"holds experts / ep of them): pick an ep that divides {experts}")
    return experts // ep
