"""The transformer block with DTensor layouts (``parlab.tf.transformer``) equals the block
on one device, forward and gradients, with Megatron's column and row layouts. Each case
runs in a fresh process: TensorFlow fixes its logical devices at its first operation."""
import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow   # TensorFlow: make test runs it, make test-fast leaves it out

pytest.importorskip("tensorflow")

TOLERANCE = 1e-5
COLUMN = "[unsharded, model]"
ROW = "[model, unsharded]"


def _results(code: str, timeout: int = 240) -> dict:
    """What the script prints as its last line, read as JSON."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check_equal_to_one_device(run: dict, devices: int) -> None:
    assert run["devices"] == devices, run["mesh"]
    assert run["output_difference"] < TOLERANCE, run
    assert run["gradient_difference"] < TOLERANCE, run
    assert run["max_difference"] == max(run["output_difference"], run["gradient_difference"])
    assert run["gradient_layouts_match"], run["layouts"]


def _check_megatron_layouts(run: dict, devices: int, d_model: int = 64) -> None:
    layouts, pieces = run["layouts"], run["pieces"]
    for layer in ("q", "k", "v", "fc1"):        # column-parallel: cut by output units
        assert layouts[f"{layer}.kernel"] == COLUMN, (layer, layouts)
        assert layouts[f"{layer}.bias"] == "[model]", (layer, layouts)
    for layer in ("proj", "fc2"):               # row-parallel: cut by input units
        assert layouts[f"{layer}.kernel"] == ROW, (layer, layouts)
        assert layouts[f"{layer}.bias"] == "[unsharded]", (layer, layouts)
    for norm in ("ln1", "ln2"):
        assert layouts[f"{norm}.gamma"] == layouts[f"{norm}.beta"] == "[unsharded]"
    # each device holds its share only
    assert pieces["q.kernel"] == [d_model, d_model // devices]
    assert pieces["fc1.kernel"] == [d_model, 4 * d_model // devices]
    assert pieces["fc2.kernel"] == [4 * d_model // devices, d_model]
    assert pieces["proj.bias"] == [d_model]
    activations = list(run["activation_layouts"].values())
    assert activations == ["[unsharded, model, unsharded, unsharded]",   # heads split
                           "[unsharded, unsharded, model]",              # MLP hidden split
                           "[unsharded, unsharded, unsharded]"], activations


def test_four_devices_equal_one_device_with_megatron_layouts_and_refuse_uneven_heads():
    out = _results("""
        import json
        from parlab.tf import transformer
        four = transformer.block_on_mesh(4, batch=2, seq=16, d_model=64, heads=4, seed=0)
        # TensorFlow now has 4 logical devices: a mesh of 2 takes the first two of them
        two = transformer.block_on_mesh(2, batch=3, seq=8, d_model=32, heads=2, seed=1)

        def refusal(**kwargs):
            try:
                transformer.block_on_mesh(**kwargs)
            except ValueError as e:
                return str(e)
            return "no error"

        refused = [refusal(devices=3, heads=4), refusal(devices=[]),
                   refusal(devices=4, d_model=48, heads=6)]
        print(json.dumps({"four": four, "two": two, "refused": refused}))
    """)
    _check_equal_to_one_device(out["four"], 4)
    _check_megatron_layouts(out["four"], 4)
    _check_equal_to_one_device(out["two"], 2)
    _check_megatron_layouts(out["two"], 2, d_model=32)
    assert "CPU:0, CPU:1)" in out["two"]["mesh"], out["two"]["mesh"]
    uneven, empty, six_heads = out["refused"]
    assert "heads=4 do not divide by devices=3" in uneven and "[1, 2, 4]" in uneven, uneven
    assert "devices is empty" in empty, empty
    assert "heads=6 do not divide by devices=4" in six_heads, six_heads


def test_two_devices_from_an_earlier_cell_equal_one_device_and_a_larger_count_says_why():
    out = _results("""
        import json, parlab
        devs = parlab.devices(2, framework="tf")           # an earlier TensorFlow cell
        from parlab.tf import transformer
        two = transformer.block_on_mesh(devs, batch=2, seq=16, d_model=64, heads=4)
        asked_four = transformer.block_on_mesh(4)          # TensorFlow keeps its 2 devices
        print(json.dumps({"two": two, "asked_four": asked_four}))
    """)
    _check_equal_to_one_device(out["two"], 2)
    _check_megatron_layouts(out["two"], 2)
    _check_equal_to_one_device(out["asked_four"], 2)
    assert "restart the kernel for 4" in out["asked_four"]["mesh"], out["asked_four"]["mesh"]
