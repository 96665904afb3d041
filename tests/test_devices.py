import subprocess
import sys
import textwrap

import pytest

import parlab
from parlab.hardware import MAX_SIMULATED


@pytest.mark.parametrize("bad", [0, -3, 2.0, "4", None, True])
def test_impossible_counts_are_value_errors(bad):
    with pytest.raises(ValueError, match="number of devices"):
        parlab.devices(bad)


def test_without_enough_gpus_devices_are_simulated_and_say_so():
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    n = gpus + 1
    devs = parlab.devices(n)
    assert devs.simulated and devs.backend == "gloo" and devs.kind == "cpu"
    line = devs.describe()
    assert line.startswith(f"{n} simulated device") and "gloo" in line and "\n" not in line
    assert devs.label(0) == "rank 0 · cpu (simulated)"
    with pytest.raises(ValueError, match="simulate=False"):
        parlab.devices(n, simulate=False)


def test_forced_simulation_and_limits():
    assert parlab.devices(1, simulate=True).reason == "simulation requested"
    with pytest.raises(ValueError, match=f"at most {MAX_SIMULATED}"):
        parlab.devices(MAX_SIMULATED + 1)
    with pytest.raises(ValueError, match="framework"):
        parlab.devices(2, framework="jax")


def test_tensorflow_logical_devices_are_configured_once():
    pytest.importorskip("tensorflow")
    code = textwrap.dedent("""
        import parlab, tensorflow as tf
        devs = parlab.devices(3, framework="tf")
        print(devs.describe())
        print(len(tf.config.list_logical_devices("CPU")))
        tf.constant(1.0) + 1  # TensorFlow is now initialised
        print(parlab.devices(3, framework="tf").n)
        try:
            parlab.devices(2, framework="tf")
        except ValueError as e:
            print("REFUSED", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": ""})
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr[-2000:]
    assert lines[0].startswith("3 simulated devices (logical CPU devices")
    assert lines[1] == "3" and lines[2] == "3"
    assert lines[3].startswith("REFUSED") and "restart the kernel" in lines[3]


def test_listening_addresses_sees_a_socket_of_this_process():
    import socket

    from parlab.system import listening_addresses
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert f"127.0.0.1:{s.getsockname()[1]}" in listening_addresses()
    assert listening_addresses([2**22 + 12345]) == []   # no such process: nothing, no error


def test_bfloat16_instructions_are_read_from_the_cpus_flags(tmp_path):
    from parlab.system import bfloat16_instructions
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f amx_bf16 avx512_bf16\n")
    assert bfloat16_instructions(str(info)) == ["avx512_bf16", "amx_bf16"]
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n")
    assert bfloat16_instructions(str(info)) == []
    assert bfloat16_instructions(str(tmp_path / "missing")) == []


def test_ranks_grouped_into_nodes_as_torchrun_numbers_them():
    from parlab import sim
    devs = parlab.devices(4, nodes=2)
    assert devs.nodes == ((0, 1), (2, 3)) and devs.node_size == 2
    assert [devs.node_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert devs.label(2) == "rank 2 · cpu (simulated) · node 1"
    assert devs.between == sim.link_preset("ethernet")
    assert "2 nodes of 2" in str(devs) and "node 1: ranks [2, 3]" in str(devs)
    slow = sim.Link(1e-3, 1e6)
    assert parlab.devices(4, nodes=4, between=slow).between == slow
    one = parlab.devices(4)
    assert one.nodes == () and one.node_size == 4 and one.label(3) == "rank 3 · cpu (simulated)"
    with pytest.raises(ValueError, match=r"choose nodes among \[1, 2, 4\]"):
        parlab.devices(4, nodes=3)
    with pytest.raises(ValueError, match="whole number of nodes"):
        parlab.devices(4, nodes=0)
    with pytest.raises(TypeError, match="must be a sim.Link"):
        parlab.devices(4, nodes=2, between=1e9)
