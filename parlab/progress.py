"""Progress bars that read as finished in a saved notebook too.

In Jupyter, ``tqdm.auto`` draws an ipywidgets bar. A saved notebook keeps no widget
state, so it shows the text the bar had when it was created ("0/176") beside finished
training. ``finish`` closes the bar and prints one line that stays true once saved.
"""
from __future__ import annotations


def bar(total: int, desc: str, enabled: bool = True):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=not enabled, leave=True)


def finish(progress, loss: float | None = None) -> None:
    """Close ``progress`` and, if it was shown, print what it counted to the end."""
    shown = not progress.disable        # close() disables the bar
    progress.close()
    if shown:
        tail = "" if loss is None else f", last loss {loss:.3f}"
        print(f"{progress.desc}: {progress.n}/{progress.total} steps done{tail}")
