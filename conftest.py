"""One execution of each lab serves both nbval and the browser test.

nbval executes every lab top to bottom in a kernel of its own (``make test``). As it
finishes a lab, this plugin keeps what that execution produced, in ``build/executed/``:

* ``NN_name.ipynb``: the lab with nbval's outputs (figures included) and execution counts,
  its metadata as stored;
* for a lab with an explorer (a ``labNN.*_explorer(...)`` call, its lab module's), the
  explorer's inputs as the lab computed them (cloudpickle, from nbval's kernel) and
  ``NN_name-explorer.ipynb``: two cells that load them and call the explorer, as the
  lab's own cell does.

The browser test (tests/test_browser.py) then opens the executed lab in JupyterLab, where
it checks that it opens unmodified, that its figures display and that no cell failed, and
runs the small explorer notebook in a live kernel to move a slider: no lab runs twice.
When nbval did not run in this session (``pytest tests/test_browser.py`` alone), the
browser test falls back to Run All on the stored lab. Browser tests run after the labs.
"""
from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
EXECUTED = ROOT / "build" / "executed"
EXPLORER_CALL = ("_explorer(",)
EXECUTED_KEY = "parlab_executed_labs"   # config attribute: lab file name -> executed copy


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell"


def pytest_collection_modifyitems(session, config, items):
    """The browser tests last, so that they find the labs nbval executed."""
    browser = [i for i in items if i.get_closest_marker("browser")]
    if browser:
        items[:] = [i for i in items if not i.get_closest_marker("browser")] + browser


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    """After each lab cell, keep its outputs; after a lab's last cell (its kernel is still
    up), write the executed lab and its explorer's inputs."""
    if not _is_nbval_cell(item):
        return
    cell = item.cell
    cell.outputs = item.test_outputs or []
    item.parent._parlab_count = getattr(item.parent, "_parlab_count", 0) + 1
    cell.execution_count = item.parent._parlab_count
    if nextitem is not None and nextitem.parent is item.parent:
        return
    nb, path = item.parent.nb, Path(str(item.parent.fspath))
    ran = [c for c in nb.cells if c.cell_type == "code"]
    EXECUTED.mkdir(parents=True, exist_ok=True)
    import nbformat
    out = EXECUTED / path.name
    nbformat.write(nb, str(out))
    explorer = _explorer_cell(ran)
    kernel = item.parent.kernel
    if (explorer is not None and kernel.is_alive()
            and not getattr(item.parent, "timed_out", False)):
        try:
            _write_explorer(kernel, path, nb, explorer)
        except Exception as exc:  # noqa: BLE001 - the browser test then says what is missing
            warnings.warn(f"{path.name}: could not keep the explorer's inputs ({exc!r})")
    executed = getattr(item.config, EXECUTED_KEY, {})
    executed[path.name] = out
    setattr(item.config, EXECUTED_KEY, executed)


def _explorer_cell(cells):
    for cell in cells:
        if any(call in cell.source for call in EXPLORER_CALL):
            return cell
    return None


def _input_names(source: str) -> list[str]:
    """Names the explorer call reads (its arguments), in order."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "").endswith("explorer"):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                for sub in ast.walk(arg):
                    if isinstance(sub, ast.Name) and sub.id not in names:
                        names.append(sub.id)
    return names


def _write_explorer(kernel, path: Path, nb, cell) -> None:
    """Pickle the explorer's inputs in nbval's kernel; write a notebook that calls it."""
    names = _input_names(cell.source)
    blob = EXECUTED / f"{path.stem}-explorer.pkl"
    code = ("import cloudpickle as _cp\n"
            f"with open({str(blob)!r}, 'wb') as _fh:\n"
            f"    _cp.dump({{_n: globals()[_n] for _n in {names!r}}}, _fh)\n")
    blob.unlink(missing_ok=True)
    kernel.await_reply(kernel.execute_cell_input(code, allow_stdin=False), timeout=120)
    if not blob.exists():
        warnings.warn(f"{path.name}: the explorer's inputs {names} could not be pickled in "
                      "nbval's kernel; the browser test will say so")
        return
    import nbformat
    load = nbformat.v4.new_code_cell(
        "# The explorer of " + path.name + ", with the inputs that lab computed when it ran.\n"
        f"import cloudpickle\nimport parlab\nfrom parlab.course import lab{path.stem[:2]}\n"
        f"with open({blob.name!r}, 'rb') as fh:\n"
        "    globals().update(cloudpickle.load(fh))")
    small = nbformat.v4.new_notebook(cells=[load, nbformat.v4.new_code_cell(cell.source)],
                                     metadata=json.loads(json.dumps(nb.metadata)))
    nbformat.write(small, str(EXECUTED / f"{path.stem}-explorer.ipynb"))
