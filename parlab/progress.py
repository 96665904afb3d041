"""Progress bars that read as finished in a saved notebook too.

A text bar on standard output: in a notebook it redraws in place (carriage returns), and
the saved notebook keeps its last state, "176/176". The widget bar of ``tqdm.auto`` would
be saved as it was drawn when created, "0/176" beside finished training (a saved notebook
keeps no widget state), and a notebook without ipywidgets draws the text bar anyway.
"""
from __future__ import annotations

import sys


def bar(total: int, desc: str, enabled: bool = True):
    from tqdm.std import tqdm
    return tqdm(total=total, desc=desc, disable=not enabled, leave=True, file=sys.stdout,
                ncols=90, mininterval=0.5)


def finish(progress, loss: float | None = None) -> None:
    """Close ``progress``, its last loss shown on its final line."""
    if loss is not None and not progress.disable:
        progress.set_postfix(loss=f"{loss:.3f}", refresh=False)
    progress.close()
