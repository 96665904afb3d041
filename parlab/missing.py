"""Labs that run top to bottom without the optional packages: TensorFlow and ipywidgets.

A PyTorch-only notebook (a cloud GPU image, say) often has no TensorFlow, and installing it
there can fight the image's CUDA stack; a fresh Jupyter may lack ipywidgets. Neither
should stop Run All:

* TensorFlow: ``tensorflow_cells`` finds the cells that use TensorFlow (by name) and,
  transitively, every cell that reads a name whose latest definition came from such a
  cell. The test harness skips them (``tests/nbval_tensorflow_cells.py``); in a notebook,
  ``import parlab`` registers an IPython input transformer (``skip_tensorflow_cells``)
  that replaces each such cell, as it runs, by one printed line. One implementation
  serves both, so the labs skip under Jupyter exactly what the tests skip.
* ipywidgets: ``widgets()`` is ipywidgets, or inert stand-ins that keep each control's
  default value; the explorers then draw their default view as a static figure, with one
  line saying how to make it interactive (``parlab.course.explorer.explorer_box``).

``PARLAB_SKIP_TF_CELLS=1`` asks for the TensorFlow skips with TensorFlow installed (to try
a GPU machine's run elsewhere).
"""
from __future__ import annotations

import os
import re
import sys

TF_HINT = "pip install tensorflow-cpu, then restart the kernel"
WIDGETS_HINT = ("ipywidgets is not installed: this explorer shows its default setting as a "
                "static figure (pip install ipywidgets, then restart the kernel, makes it "
                "interactive).")

MARKERS = re.compile(r"\btensorflow\b|\bparlab\.tf\b|from parlab import tf\b|"
                     r"framework\s*=\s*[\"']tf[\"']|\btf\.|\bkeras\b|"
                     r"\brun_tf_\w+|\brun_multi_worker\b")   # experiments that start TF processes

# Lines that install or run a shell command never make a cell need TensorFlow: the learner
# who types "%pip install tensorflow-cpu" must not see that cell skipped.
_INSTALL_LINE = re.compile(r"^\s*(!|%pip\b|%conda\b|%mamba\b)")


def installed(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it. A finder that raises (a
    broken install, a test's blocker) counts as not installed: this must never fail."""
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:  # noqa: BLE001 - any failure to find it means it is not usable
        return False


def tensorflow_skipped() -> str | None:
    """Why TensorFlow cells are skipped here, or None when they run."""
    if os.environ.get("PARLAB_SKIP_TF_CELLS") == "1":
        return "PARLAB_SKIP_TF_CELLS=1"
    return None if installed("tensorflow") else "TensorFlow is not installed"


# ------------------------------------------------------------------ which cells need TensorFlow
def _parse(source: str):
    """The cell's code without IPython magics and shell escapes."""
    import ast
    lines = [("pass" if line.lstrip().startswith(("%", "!")) else line)
             for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _names(tree) -> tuple[set[str], set[str]]:
    """(names the cell defines, names it reads before defining them itself)."""
    import ast
    events = []                          # (line, column, defines?, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            events.append((node.lineno, node.col_offset, not isinstance(node.ctx, ast.Load), node.id))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            events.append((node.lineno, node.col_offset, True, node.name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            events.extend((node.lineno, node.col_offset, True, (a.asname or a.name).split(".")[0])
                          for a in node.names)
    # a comprehension's variables and a function's arguments are its own: reading them is
    # no read of the cell's earlier names
    local = {n.id for c in ast.walk(tree) if isinstance(c, ast.comprehension)
             for n in ast.walk(c.target) if isinstance(n, ast.Name)}
    local |= {a.arg for f in ast.walk(tree) if isinstance(f, ast.arguments)
              for a in (*f.posonlyargs, *f.args, *f.kwonlyargs, f.vararg, f.kwarg) if a}
    defined, read = set(), set()
    for _, _, defines, name in sorted(events):
        if defines:
            defined.add(name)
        elif name not in defined and name not in local:
            read.add(name)
    return defined, read


class CellTracker:
    """Cells in execution order -> does each need TensorFlow? It remembers, per name,
    whether its latest definition came from a cell that needs TensorFlow.

    Seeing the same cell twice in a row gives the same answer (IPython may transform a
    cell twice before running it).
    """

    def __init__(self):
        self.from_tf: dict[str, bool] = {}

    def needs(self, source: str) -> str | None:
        """None, "uses" (names TensorFlow) or "reads" (a name a TensorFlow cell defined)."""
        tree = _parse(source)
        defined, read = _names(tree) if tree is not None else (set(), set())
        code = "\n".join(line for line in source.splitlines() if not _INSTALL_LINE.match(line))
        why = ("uses" if MARKERS.search(code)
               else "reads" if any(self.from_tf.get(n, False) for n in read) else None)
        for n in defined:
            self.from_tf[n] = why is not None
        return why


def tensorflow_cells(sources: list[str]) -> list[bool]:
    """For each code cell in order: does it need TensorFlow?"""
    tracker = CellTracker()
    return [tracker.needs(source) is not None for source in sources]


def skip_line(why: str, reason: str = "TensorFlow is not installed") -> str:
    """The one line a skipped cell prints."""
    what = ("needs TensorFlow" if why == "uses"
            else "uses what a TensorFlow cell made")
    hint = f" ({TF_HINT})" if reason == "TensorFlow is not installed" else ""
    return f"skipped: this cell {what}; {reason}{hint}. The lab goes on without it."


# ------------------------------------------------------------------ in a notebook
class _SkipTensorFlowCells:
    """An IPython cleanup transformer (raw lines in, lines out): a cell that needs
    TensorFlow becomes one print. It sees the cell as typed, magics included, as the test
    harness does, and never raises: an exception here would stop Run All."""

    has_side_effects = True          # stateful: IPython's completeness check must skip it
    parlab = True                    # marks ours, so that it is registered once

    def __init__(self, reason: str):
        self.reason = reason
        self.tracker = CellTracker()

    def __call__(self, lines: list[str]) -> list[str]:
        try:
            why = self.tracker.needs("".join(lines))
        except Exception:  # noqa: BLE001 - run the cell as typed rather than fail it
            return lines
        if why is None:
            return lines
        return [f"print({skip_line(why, self.reason)!r})\n"]


def skip_tensorflow_cells(shell=None) -> bool:
    """In IPython without TensorFlow: from now on, run each cell that needs TensorFlow as
    one line saying so (``import parlab`` calls this). True when the cells are skipped."""
    if shell is None:
        # never import IPython for a plain script; IPython half imported has no get_ipython
        get = getattr(sys.modules.get("IPython"), "get_ipython", None)
        shell = get() if get is not None else None
    transforms = getattr(shell, "input_transformers_cleanup", None)
    if transforms is None:                        # not IPython, or one too old (< 7)
        return False
    reason = tensorflow_skipped()
    if reason is None:
        return False
    if not any(getattr(t, "parlab", False) for t in transforms):
        transforms.append(_SkipTensorFlowCells(reason))
    return True


# ------------------------------------------------------------------ ipywidgets, or stand-ins
class _Inert:
    """A stand-in for any ipywidget: it keeps what it was given (``value``, ``options``,
    ``description``, ``children``) and ignores observers and clicks."""

    def __init__(self, *args, **kwargs):
        if args:
            kwargs.setdefault("children", args[0])
        self.__dict__.update(kwargs)
        if "value" not in kwargs and kwargs.get("options"):
            first = list(kwargs["options"])[0]            # ipywidgets' default: the first option
            self.value = first[1] if isinstance(first, tuple) else first
        self.outputs = kwargs.get("outputs", ())

    def __getattr__(self, name):          # any other attribute: absent, like a default
        if name.startswith("_"):          # IPython's display hooks among them
            raise AttributeError(name)
        return None

    def observe(self, *args, **kwargs):
        pass

    def on_click(self, *args, **kwargs):
        pass

    def clear_output(self, *args, **kwargs):
        self.outputs = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _InertWidgets:
    """``ipywidgets`` as the explorers use it: each class a ``_Inert`` of the same name
    (the name tells an ``HTML`` text and an ``Output`` apart when drawn static)."""

    def __init__(self):
        self._classes: dict[str, type] = {}

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._classes.setdefault(name, type(name, (_Inert,), {}))


def widgets():
    """ipywidgets, or (not installed) inert stand-ins with the same constructors."""
    try:
        import ipywidgets
    except ImportError:
        return _InertWidgets()
    return ipywidgets


def is_inert(w) -> bool:
    return isinstance(w, _InertWidgets)


class StaticExplorer:
    """An explorer built of inert stand-ins, shown as what its default setting drew: one
    line saying why it is static, its text line, then its figures (as IPython formatted
    them when the explorer drew into its ``Output``)."""

    def __init__(self, children, about: str):
        self.children, self.about = list(children), about

    def _items(self, children):
        for c in children:
            yield c
            yield from self._items(getattr(c, "children", None) or ())

    def _ipython_display_(self):
        import html

        from IPython.display import publish_display_data
        print(WIDGETS_HINT)
        for c in self._items(self.children):
            kind = type(c).__name__
            if kind == "HTML" and c.value:
                print(html.unescape(re.sub(r"<[^>]+>", "", c.value)))
            elif kind == "Output":
                for o in c.outputs:
                    if o.get("output_type") == "stream":
                        print(o.get("text", ""), end="")
                    else:
                        publish_display_data(o.get("data", {}), o.get("metadata") or {})

    def __repr__(self):
        return self.about
