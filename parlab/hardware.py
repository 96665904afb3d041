"""What devices a lab runs on: real GPUs when there are enough, simulated ones otherwise.

A simulated device is one process on the CPU (PyTorch, gloo backend) or one logical CPU
device (TensorFlow). It shows how a strategy works and what it communicates, but its
speed is that of a share of this machine's cores, and the lab says so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import whole_number

# Each simulated PyTorch device is a process holding its own interpreter and torch
# (~250 MB resident): past this many they mostly measure the operating system.
MAX_SIMULATED = 32


@dataclass(frozen=True)
class DeviceSet:
    """The N devices a lab will use, and how they were chosen."""

    n: int
    framework: str          # "torch" or "tf"
    kind: str               # "cuda" or "cpu"
    simulated: bool
    backend: str            # "nccl", "gloo" (torch) or "logical" / "gpu" (tf)
    names: tuple[str, ...]
    gpus_found: int
    reason: str

    def label(self, rank: int) -> str:
        suffix = " (simulated)" if self.simulated else ""
        return f"rank {rank} · {self.names[rank]}{suffix}"

    def labels(self) -> dict[int, str]:
        return {r: self.label(r) for r in range(self.n)}

    def describe(self) -> str:
        if self.simulated:
            how = ("processes on the CPU, gloo backend" if self.framework == "torch"
                   else "logical CPU devices sharing one thread pool")
            return f"{self.n} simulated device{'s' * (self.n > 1)} ({how}): {self.reason}"
        return f"{self.n} real GPU{'s' * (self.n > 1)} ({self.backend}): {', '.join(self.names)}"

    __str__ = describe

    def __repr__(self) -> str:
        return f"DeviceSet({self.describe()})"


def _check_count(n) -> int:
    count = whole_number(n)
    if count is None:
        raise ValueError(f"the number of devices must be a whole number, got {n!r} "
                         f"({type(n).__name__}): pass e.g. parlab.devices(2)")
    if count < 1:
        raise ValueError(f"the number of devices must be at least 1, got {count}")
    return count


def _check_simulate(simulate) -> bool | None:
    if simulate is None or isinstance(simulate, bool):
        return simulate
    if type(simulate).__name__ == "bool_":  # numpy's True and False
        return bool(simulate)
    raise ValueError(f"simulate= must be True (simulate on the CPU), False (demand real "
                     f"GPUs) or None (real GPUs if enough are visible, else simulate), got "
                     f"{simulate!r}")


def devices(n: int, *, simulate: bool | None = None, framework: str = "torch") -> DeviceSet:
    """Describe the ``n`` devices a lab will use.

    simulate=None (default): real GPUs when at least ``n`` are visible, else ``n``
    simulated CPU devices. simulate=True: always simulate. simulate=False: demand real
    GPUs; too few is a ``ValueError``.
    """
    n = _check_count(n)
    simulate = _check_simulate(simulate)
    if framework not in ("torch", "tf"):
        raise ValueError(f"framework must be 'torch' or 'tf', got {framework!r}")
    gpus = _count_gpus(framework)
    if simulate is False and gpus < n:
        raise ValueError(
            f"{n} real GPUs were demanded (simulate=False) but {gpus} "
            f"{'is' if gpus == 1 else 'are'} visible: ask for at most {gpus} devices, "
            "or pass simulate=None to simulate them on the CPU.")
    if simulate is not True and gpus >= n:
        if framework == "torch":
            import torch.distributed as dist
            backend = "nccl" if dist.is_nccl_available() else "gloo"
            names = tuple(f"cuda:{i}" for i in range(n))
        else:
            backend, names = "gpu", tuple(f"/device:GPU:{i}" for i in range(n))
        return DeviceSet(n, framework, "cuda", False, backend, names, gpus,
                         f"{gpus} GPU(s) visible")
    if framework == "torch" and n > MAX_SIMULATED:
        raise ValueError(
            f"{n} simulated devices would be {n} processes each holding its own torch "
            f"(~250 MB each); use at most {MAX_SIMULATED}.")
    if simulate is True:
        reason = "simulation requested"
    elif gpus == 0:
        reason = "no GPU visible"
    else:
        reason = f"{gpus} GPU{'s' * (gpus > 1)} visible, {n} needed for real devices"
    if framework == "torch":
        names = tuple("cpu" for _ in range(n))
        backend = "gloo"
    else:
        names = tuple(f"/device:CPU:{i}" for i in range(n))
        backend = "logical"
        _configure_logical_cpus(n)
    return DeviceSet(n, framework, "cpu", True, backend, names, gpus, reason)


def quiet_tensorflow() -> None:
    """Fewer start-up banners from TensorFlow; must run before its first import."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # drops a banner; results identical


def _count_gpus(framework: str) -> int:
    if framework == "torch":
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    quiet_tensorflow()
    import tensorflow as tf
    return len(tf.config.list_physical_devices("GPU"))


def _configure_logical_cpus(n: int) -> None:
    """Split the CPU into ``n`` logical TensorFlow devices (must precede any TF op)."""
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
    except RuntimeError as exc:  # TF initialised already: only a restart can change it
        have = len(tf.config.list_logical_devices("CPU"))
        if have != n:
            raise ValueError(
                f"TensorFlow already runs with {have} logical CPU device(s) and cannot be "
                f"changed to {n} in this process: restart the kernel and call "
                f"parlab.devices({n}, framework='tf') before any other TensorFlow code."
            ) from exc


def cpu_count() -> int:
    """Cores this process may use (respects CPU affinity where the OS reports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
