"""parlab.devices' modes: auto, cpu, gpu, shared-gpu, and $PARLAB_DEVICES.

GPUs are pretended (the count of visible GPUs is patched) to check the choice, the one-line
description and the errors; what runs on a real GPU is tested in tests/test_gpu.py.
"""
import pytest

import parlab
from parlab import hardware


@pytest.fixture
def gpus(monkeypatch):
    monkeypatch.delenv(hardware.MODE_ENV, raising=False)

    def pretend(count):
        monkeypatch.setattr(hardware, "_count_gpus", lambda framework: count)
    return pretend


def test_one_gpu_and_four_devices_defaults_to_the_cpu_and_names_the_other_choice(gpus):
    gpus(1)
    devs = parlab.devices(4)
    assert devs.simulated and devs.kind == "cpu" and not devs.shared
    assert "mode='shared-gpu'" in devs.describe() and "\n" not in devs.describe()
    assert parlab.devices(4, mode="cpu").reason == "simulation requested"


def test_shared_gpu_mode_puts_every_rank_on_the_gpu_and_says_so_in_one_line(gpus):
    gpus(1)
    devs = parlab.devices(4, mode="shared-gpu")
    assert devs.shared and not devs.simulated and devs.kind == "cuda" and devs.backend == "gloo"
    assert devs.names == ("cuda:0",) * 4
    line = devs.describe()
    assert line.startswith("4 ranks sharing 1 GPU (cuda:0), messages through host memory")
    assert "\n" not in line
    assert devs.label(3) == "rank 3 · cuda:0 (shared)"
    # ranks join plain gloo on CUDA: init_rank turns host staging on from exactly this pair
    from parlab.launcher import _process_group_spec
    spec = _process_group_spec("/nowhere", 4, devs, 60)
    assert (spec["backend"], spec["device_kind"]) == ("gloo", "cuda")
    gpus(2)
    assert parlab.devices(4, mode="shared-gpu").names == ("cuda:0", "cuda:1", "cuda:0", "cuda:1")
    assert parlab.devices(4, mode="shared-gpu").describe().startswith("4 ranks sharing 2 GPUs")


def test_enough_gpus_means_one_rank_per_gpu(gpus):
    gpus(4)
    for devs in (parlab.devices(4), parlab.devices(4, mode="gpu"), parlab.devices(2, simulate=False)):
        assert devs.kind == "cuda" and not devs.simulated and not devs.shared
        assert devs.names == tuple(f"cuda:{i}" for i in range(devs.n))
        assert devs.describe().startswith(f"{devs.n} real GPUs")


def test_the_environment_variable_chooses_for_every_lab(gpus, monkeypatch):
    gpus(1)
    monkeypatch.setenv(hardware.MODE_ENV, "shared-gpu")
    assert parlab.devices(2).shared
    assert parlab.devices(2, mode="cpu").simulated, "an explicit mode beats the variable"
    assert parlab.devices(2, simulate=True).simulated, "so does simulate="
    monkeypatch.setenv(hardware.MODE_ENV, "gpus")
    with pytest.raises(ValueError, match="PARLAB_DEVICES='gpus'.*auto, cpu, gpu, shared-gpu"):
        parlab.devices(2)


def test_bad_settings_say_what_to_change(gpus, monkeypatch):
    gpus(0)
    with pytest.raises(ValueError, match="mode='shared-gpu' needs a GPU.*mode='cpu'"):
        parlab.devices(2, mode="shared-gpu")
    monkeypatch.setenv(hardware.MODE_ENV, "shared-gpu")
    with pytest.raises(ValueError, match="unset PARLAB_DEVICES"):
        parlab.devices(2)
    monkeypatch.delenv(hardware.MODE_ENV)
    with pytest.raises(ValueError, match="none is visible.*mode='cpu'"):
        parlab.devices(2, mode="gpu")
    with pytest.raises(ValueError, match="mode must be one of"):
        parlab.devices(2, mode="GPU")
    with pytest.raises(ValueError, match="either mode= or simulate="):
        parlab.devices(2, mode="cpu", simulate=True)
    gpus(1)
    with pytest.raises(ValueError, match="mode='shared-gpu' to share the GPU"):
        parlab.devices(2, mode="gpu")
    with pytest.raises(ValueError, match="at most"):
        parlab.devices(hardware.MAX_SIMULATED + 1, mode="shared-gpu")


def test_a_mode_the_variable_chose_is_named_as_the_variable(gpus, monkeypatch):
    # before: "pass mode='auto'", to someone who had typed PARLAB_DEVICES=gpu and no mode=
    gpus(0)
    monkeypatch.setenv(hardware.MODE_ENV, "gpu")
    with pytest.raises(ValueError, match="demanded by PARLAB_DEVICES=gpu but none is visible: "
                                         "set PARLAB_DEVICES=auto or PARLAB_DEVICES=cpu") as e:
        parlab.devices(2)
    assert "mode=" not in str(e.value)
    monkeypatch.setenv(hardware.MODE_ENV, "shared-gpu")
    with pytest.raises(ValueError, match="^PARLAB_DEVICES=shared-gpu needs a GPU.*"
                                         "set PARLAB_DEVICES=cpu") as e:
        parlab.devices(2)
    assert "mode=" not in str(e.value)
    gpus(1)
    monkeypatch.setenv(hardware.MODE_ENV, "gpu")
    with pytest.raises(ValueError, match="set PARLAB_DEVICES=auto to simulate them on the CPU, "
                                         "or PARLAB_DEVICES=shared-gpu to share the GPU"):
        parlab.devices(2)
    with pytest.raises(ValueError, match=r"\(simulate=False / mode='gpu'\).*pass mode='auto'"):
        parlab.devices(2, mode="gpu")         # an argument is still named as the argument


def test_the_line_says_who_chose_the_mode(gpus, monkeypatch):
    gpus(1)
    assert parlab.devices(2, mode="shared-gpu").reason == "shared-GPU mode requested"
    monkeypatch.setenv(hardware.MODE_ENV, "cpu")
    assert parlab.devices(2).describe().endswith("simulation set by PARLAB_DEVICES")
    monkeypatch.setenv(hardware.MODE_ENV, "shared-gpu")
    assert parlab.devices(2).describe().endswith("shared-GPU mode set by PARLAB_DEVICES")


def test_counts_compared_with_each_other_get_one_kind_of_device(gpus):
    # one GPU: "auto" would put 1 device on it and simulate 2 and 4 on the CPU
    gpus(1)
    alike = hardware.devices_alike((1, 2, 4))
    assert list(alike) == [1, 2, 4]
    assert all(d.simulated and d.kind == "cpu" for d in alike.values())
    assert parlab.devices(1).kind == "cuda"            # what the mismatch would have been
    assert parlab.devices(2).like(1).simulated
    shared = hardware.devices_alike((1, 4), mode="shared-gpu")
    assert all(d.shared and d.names[0] == "cuda:0" for d in shared.values())
    # enough GPUs for the largest count: real GPUs throughout
    gpus(4)
    assert all(d.kind == "cuda" and not d.simulated and not d.shared
               for d in hardware.devices_alike((2, 4)).values())
    gpus(0)
    assert parlab.devices(4).like(1).names == ("cpu",)
    with pytest.raises(ValueError, match="at least one device count"):
        hardware.devices_alike(())


def test_a_like_set_says_why_it_is_not_what_the_setting_would_pick(gpus):
    gpus(1)
    one = parlab.devices(2).like(1)
    assert one.simulated and one.reason.startswith("the kind of the 2 devices it is compared with")
    gpus(0)
    assert parlab.devices(2).like(1).reason == "no GPU visible"     # the setting's own choice


def test_like_refuses_tensorflow_sets_and_says_what_to_use():
    tf_set = hardware.DeviceSet(2, "tf", "cpu", True, "logical", ("/device:CPU:0", "/device:CPU:1"),
                                0, "no GPU visible")
    with pytest.raises(ValueError, match=r"devs.names\[:1\]"):
        tf_set.like(1)
