"""The GPU run's nbval plugin finds the labs' TensorFlow cells, and only those (with
``parlab.missing``'s rule, which a notebook kernel without TensorFlow follows too)."""
import json
from pathlib import Path

import nbval_tensorflow_cells
from parlab.missing import tensorflow_cells

LABS = Path(__file__).resolve().parents[1] / "labs"


def test_tensorflow_cells_and_the_cells_that_use_their_names():
    flags = tensorflow_cells([
        "import parlab\ndevs = parlab.devices(2)",
        'tf_devs = parlab.devices(2, framework="tf")\nhistory = fit(tf_devs)',
        "print(history)",                       # reads a TF cell's name: skipped too
        "history = {}\nprint(history)",         # defines it first: runs
        "%matplotlib inline\nprint(devs)",      # magics do not hide a cell's names
        "crash = run_tf_cluster(steps=3)",
    ])
    assert flags == [False, True, True, False, False, True]


def test_the_plugin_and_the_notebooks_share_one_rule():
    assert nbval_tensorflow_cells.tensorflow_cells is tensorflow_cells


def test_installing_tensorflow_in_a_cell_is_not_a_tensorflow_cell():
    assert tensorflow_cells(["%pip install tensorflow-cpu", "!pip install keras",
                             "%pip install tensorflow-cpu\nimport tensorflow"]) == [False, False, True]


def test_every_lab_keeps_its_pytorch_cells():
    for path in sorted(LABS.glob("*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        sources = ["".join(c["source"]) for c in cells]
        flags = tensorflow_cells(sources)
        for source, flag in zip(sources, flags):
            if "import tensorflow" in source or 'framework="tf"' in source:
                assert flag, f"{path.name}: a TensorFlow cell would run without TensorFlow"
        assert flags.count(False) >= len(flags) // 2, f"{path.name}: most cells would be skipped"
