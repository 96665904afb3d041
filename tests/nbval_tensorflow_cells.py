"""A pytest plugin for nbval: without TensorFlow, skip the labs' TensorFlow cells.

The GPU machine has a CUDA build of torch and no TensorFlow, yet every lab also has a
TensorFlow part. Skipped are the cells that use TensorFlow (by name) and, transitively,
every cell that reads a name whose latest definition came from such a cell; everything
else runs, each skip with its reason (``pytest -rs``). With TensorFlow installed the plugin
does nothing, unless ``PARLAB_SKIP_TF_CELLS=1`` asks for the same skips (to try the GPU
machine's run elsewhere). Use: ``PYTHONPATH=tests pytest -p nbval_tensorflow_cells
--nbval-lax labs``.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import re

import pytest

MARKERS = re.compile(r"\btensorflow\b|\bparlab\.tf\b|from parlab import tf\b|"
                     r"framework\s*=\s*[\"']tf[\"']|\btf\.|\bkeras\b|"
                     r"\brun_tf_\w+|\brun_multi_worker\b")   # experiments that start TF processes


def _parse(source: str):
    """The cell's code without IPython magics and shell escapes."""
    lines = [("pass" if line.lstrip().startswith(("%", "!")) else line)
             for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _names(tree) -> tuple[set[str], set[str]]:
    """(names the cell defines, names it reads before defining them itself)."""
    events = []                          # (line, column, defines?, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            events.append((node.lineno, node.col_offset, not isinstance(node.ctx, ast.Load), node.id))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            events.append((node.lineno, node.col_offset, True, node.name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            events.extend((node.lineno, node.col_offset, True, (a.asname or a.name).split(".")[0])
                          for a in node.names)
    defined, read = set(), set()
    for _, _, defines, name in sorted(events):
        if defines:
            defined.add(name)
        elif name not in defined:
            read.add(name)
    return defined, read


def tensorflow_cells(sources: list[str]) -> list[bool]:
    """For each code cell in order: does it need TensorFlow?"""
    from_tf: dict[str, bool] = {}        # name -> was its latest definition in a TF cell
    out = []
    for source in sources:
        tree = _parse(source)
        defined, read = _names(tree) if tree is not None else (set(), set())
        needs = bool(MARKERS.search(source)) or any(from_tf.get(n, False) for n in read)
        for n in defined:
            from_tf[n] = needs
        out.append(needs)
    return out


def pytest_collection_modifyitems(config, items):
    forced = os.environ.get("PARLAB_SKIP_TF_CELLS") == "1"
    if importlib.util.find_spec("tensorflow") is not None and not forced:
        return
    by_notebook: dict[object, list] = {}
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and cell.get("cell_type") == "code":
            by_notebook.setdefault(item.parent, []).append(item)
    why = "PARLAB_SKIP_TF_CELLS=1" if forced else "TensorFlow is not installed"
    skip = pytest.mark.skip(reason=f"{why}: this cell uses TensorFlow, or a name a "
                                   "TensorFlow cell defined")
    for cells in by_notebook.values():
        for item, needs in zip(cells, tensorflow_cells([c.cell.source for c in cells])):
            if needs:
                item.add_marker(skip)
