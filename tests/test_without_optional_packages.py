"""The labs run top to bottom without TensorFlow and without ipywidgets (parlab.missing).

A cloud notebook with torch and Jupyter, after ``pip install -e .``, has neither: a cell
that needs TensorFlow prints one line naming it and how to install it, and the lab goes
on; an explorer draws its default view as a static figure, with one line saying how to
make it interactive. The packages are installed here, so the kernel is given a
``sitecustomize`` that makes importing them fail, as if they were not.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parlab.missing import TF_HINT, WIDGETS_HINT, tensorflow_cells

LABS = Path(__file__).resolve().parents[1] / "labs"

# On a kernel's PYTHONPATH: the path finder stops finding these packages, exactly as where
# they are not installed (find_spec gives None, importing raises ModuleNotFoundError).
BLOCKER = textwrap.dedent('''
    import sys
    from importlib.machinery import PathFinder

    NOT_INSTALLED = {"tensorflow", "keras", "tf_keras", "ipywidgets"}

    class WithoutSome(PathFinder):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name.partition(".")[0] in NOT_INSTALLED:
                return None
            return super().find_spec(name, path, target)

    sys.meta_path[:] = [WithoutSome if f is PathFinder else f for f in sys.meta_path]
''')


def _blocked_env(tmp_path: Path) -> dict:
    folder = tmp_path / "not_installed"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH")) if p)
    env.pop("PARLAB_SKIP_TF_CELLS", None)
    return env


def test_an_ipython_shell_without_them_skips_tensorflow_cells_and_draws_explorers_static(tmp_path):
    script = textwrap.dedent('''
        import matplotlib
        matplotlib.use("Agg")
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        cells = ["import parlab\\nfrom parlab.course import lab08",
                 'tf_devs = parlab.devices(2, framework="tf")\\nhistory = 1',
                 "print('history', history)",             # reads what a TF cell made
                 "history = {}\\nprint('redefined', history)",
                 "lab08.zero_explorer()"]
        for cell in cells:
            print("ok" if shell.run_cell(cell).success else "FAILED")
    ''')
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=_blocked_env(tmp_path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "FAILED" not in lines, out.stdout
    assert lines[1] == (f"skipped: this cell needs TensorFlow; TensorFlow is not installed "
                        f"({TF_HINT}). The lab goes on without it.")
    assert lines[3].startswith("skipped: this cell uses what a TensorFlow cell made;")
    assert "redefined {}" in lines
    assert out.stdout.count(WIDGETS_HINT) == 1      # after "Out[5]: " in a plain shell
    assert any("ZeRO-3" in line and "per device" in line for line in lines)


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


@pytest.mark.slow
@pytest.mark.timeout(900)
# One lab end to end (lab 03: TensorFlow cells, an explorer, lessons); the shell test above
# covers the mechanism for any cell. Lab 05 too cost 20-30 s of the suite's 15 minutes.
@pytest.mark.parametrize("name", ["03_vertical_slicing"])
def test_a_lab_runs_top_to_bottom_without_tensorflow_and_ipywidgets(name, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from parlab.course import lessons
    for key, value in _blocked_env(tmp_path).items():
        monkeypatch.setenv(key, value)          # the kernel inherits this environment
    monkeypatch.delenv("PARLAB_SKIP_TF_CELLS", raising=False)
    nb = nbformat.read(LABS / f"{name}.ipynb", as_version=4)
    # stops at the first cell that fails, as Run All does, naming it and its traceback
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(o.get("output_type") != "error" for c in code for o in c.outputs)

    needs_tf = tensorflow_cells([c.source for c in code])
    assert any(needs_tf), f"{name} has no TensorFlow cell to skip"
    for cell, needs in zip(code, needs_tf):
        text = _text(cell)
        if needs:
            assert text.startswith("skipped: this cell ") and f"({TF_HINT})" in text, text
            assert text.count("\n") == 1, f"one line per skipped cell, got: {text}"
        else:
            assert "skipped: this cell" not in text, cell.source

    explorer = next(c for c in code if "_explorer(" in c.source)
    assert _text(explorer).splitlines()[0] == WIDGETS_HINT
    assert any("image/png" in o.get("data", {}) for o in explorer.outputs), explorer.outputs

    lab = name[:2]
    summary = _text(next(c for c in code if f'lessons.summary("{lab}")' in c.source))
    for x in lessons.of_lab(lab):
        assert f"lesson {x.name}: " in summary, summary
    assert "not run in this session" not in summary, summary
