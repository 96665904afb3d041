"""A pytest plugin for nbval: without TensorFlow, skip the labs' TensorFlow cells.

The GPU machine has a CUDA build of torch and no TensorFlow, yet every lab also has a
TensorFlow part. Skipped are the cells that use TensorFlow (by name) and, transitively,
every cell that reads a name whose latest definition came from such a cell; everything
else runs, each skip with its reason (``pytest -rs``). With TensorFlow installed the plugin
does nothing, unless ``PARLAB_SKIP_TF_CELLS=1`` asks for the same skips (to try the GPU
machine's run elsewhere). Use: ``PYTHONPATH=tests pytest -p nbval_tensorflow_cells
--nbval-lax labs``.

Which cells: ``parlab.missing.tensorflow_cells``, the rule a notebook kernel without
TensorFlow follows too (``import parlab`` skips the same cells there, each with a line):
one implementation, so that the tests skip what a learner's Run All skips.
"""
from __future__ import annotations

import pytest

from parlab.missing import tensorflow_cells, tensorflow_skipped

__all__ = ["tensorflow_cells", "pytest_collection_modifyitems"]


def pytest_collection_modifyitems(config, items):
    why = tensorflow_skipped()
    if why is None:
        return
    by_notebook: dict[object, list] = {}
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and cell.get("cell_type") == "code":
            by_notebook.setdefault(item.parent, []).append(item)
    skip = pytest.mark.skip(reason=f"{why}: this cell uses TensorFlow, or a name a "
                                   "TensorFlow cell defined")
    for cells in by_notebook.values():
        for item, needs in zip(cells, tensorflow_cells([c.cell.source for c in cells])):
            if needs:
                item.add_marker(skip)
