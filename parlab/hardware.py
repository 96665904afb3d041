"""What devices a lab runs on: real GPUs when there are enough, simulated ones otherwise.

A simulated device is one process on the CPU (PyTorch, gloo backend) or one logical CPU
device (TensorFlow). It shows how a strategy works and what it communicates, but its
speed is that of a share of this machine's cores, and the lab says so.

Modes (``parlab.devices(n, mode=...)``, or for every lab at once the environment variable
``PARLAB_DEVICES``):

* ``"auto"`` (default): ``n`` real GPUs when at least ``n`` are visible, else ``n``
  simulated CPU devices.
* ``"cpu"``: always simulate on the CPU.
* ``"gpu"``: demand ``n`` real GPUs, one per rank; too few is an error.
* ``"shared-gpu"``: ``n`` ranks share the visible GPU(s) (rank r computes on
  ``cuda:r % gpus``). NCCL refuses two ranks on one GPU ("Duplicate GPU detected",
  NVIDIA/nccl#418), so their messages are staged through host memory and carried by gloo;
  the timeline counts that staging as transfer. TensorFlow instead splits GPU 0 into ``n``
  logical GPUs (``tf.config.set_logical_device_configuration`` with a memory limit each).

Which of "cpu" and "shared-gpu" is faster for an N-device lab on one GPU has not been
measured yet (no GPU was available when this was written): "auto" keeps the CPU until
``python -m parlab bench --only gpu`` (its lab 05 line: CPU simulation against ranks
sharing cuda:0) has been run on a GPU.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from . import core_waits
from .errors import whole_number

# Each simulated PyTorch device is a process holding its own interpreter and torch
# (~250 MB resident): past this many they mostly measure the operating system.
MAX_SIMULATED = 32

MODES = ("auto", "cpu", "gpu", "shared-gpu")
MODE_ENV = "PARLAB_DEVICES"   # a mode for every lab of a session, e.g. PARLAB_DEVICES=shared-gpu

# Memory each logical TensorFlow GPU may use in shared-GPU mode: TensorFlow needs a limit
# per logical device (tf.config.LogicalDeviceConfiguration(memory_limit=...), in MiB).
LOGICAL_GPU_MB = 2048


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
    shared: bool = False    # several ranks per GPU, messages through host memory
    nodes: tuple = ()       # the ranks of each node, e.g. ((0, 1), (2, 3)); () is one machine
    between: object = None  # the link between nodes a replay prices (a sim.Link), if nodes

    @property
    def node_size(self) -> int:
        """Ranks per node (all of them on one machine)."""
        return len(self.nodes[0]) if self.nodes else self.n

    def node_of(self, rank: int) -> int:
        return rank // self.node_size

    def replay_link(self, inside):
        """The link a replay of a run on these devices prices its messages on: ``inside``
        (a ``sim.Link``) on one machine; with nodes, ``inside`` within a node and
        ``between`` across nodes (a ``sim.TwoTier``)."""
        if not self.nodes:
            return inside
        from .sim.replay import TwoTier
        return TwoTier(inside, self.between, nodes=self.nodes)

    def like(self, n: int) -> "DeviceSet":
        """``n`` devices of this set's kind (real GPUs, ranks sharing a GPU, or simulated), for
        a comparison that must not change kind with the count: one device on the GPU against
        two simulated on the CPU would compare a GPU with the CPU."""
        from dataclasses import replace
        if self.framework != "torch":
            # a second parlab.devices call would re-split TensorFlow's logical devices,
            # which TensorFlow refuses once it has started
            raise ValueError("like() is for PyTorch device sets; with TensorFlow, take the "
                             f"first {n} of one set's devices: devs.names[:{n}]")
        chosen = devices(n, framework=self.framework)      # what the setting picks for n
        if (chosen.kind, chosen.simulated, chosen.shared) == (self.kind, self.simulated,
                                                              self.shared):
            return chosen
        mode = "shared-gpu" if self.shared else "cpu" if self.simulated else "gpu"
        return replace(devices(n, framework=self.framework, mode=mode),
                       reason=f"the kind of the {self.n} devices it is compared with "
                              f"({self.reason})")

    def label(self, rank: int) -> str:
        suffix = " (simulated)" if self.simulated else " (shared)" if self.shared else ""
        node = f" · node {self.node_of(rank)}" if self.nodes else ""
        return f"rank {rank} · {self.names[rank]}{suffix}{node}"

    def labels(self) -> dict[int, str]:
        return {r: self.label(r) for r in range(self.n)}

    def describe(self) -> str:
        if self.simulated:
            how = ("processes on the CPU, gloo backend" if self.framework == "torch"
                   else "logical CPU devices sharing one thread pool")
            # once, in the first line of every lab: where a rank's wait for a core is not
            # measured, it hides inside compute and transfer (parlab.core_waits)
            unmeasured = "" if core_waits.MEASURED else (
                "; waiting for a core is not measured on this system and hides inside compute "
                "and transfer")
            return (f"{self.n} simulated device{'s' * (self.n > 1)} ({how}): {self.reason}"
                    f"{unmeasured}")
        if self.shared:
            gpus = sorted(set(self.names))
            if self.framework == "tf":
                return (f"{self.n} logical GPU{'s' * (self.n > 1)} split from 1 GPU "
                        f"({LOGICAL_GPU_MB} MiB each): {self.reason}")
            return (f"{self.n} rank{'s' * (self.n > 1)} sharing {len(gpus)} GPU"
                    f"{'s' * (len(gpus) > 1)} ({', '.join(gpus)}), messages through host "
                    f"memory (gloo), timed with CUDA events: {self.reason}")
        how = ("TensorFlow devices of this process" if self.framework == "tf" else
               f"{self.backend}, a rank per GPU, timed with CUDA events"
               + (", messages through host memory" if self.backend == "gloo" else ""))
        return f"{self.n} real GPU{'s' * (self.n > 1)} ({how}): {', '.join(self.names)}"

    __str__ = describe

    def __repr__(self) -> str:
        return f"DeviceSet({self.describe()})"

    def __str__(self) -> str:
        if not self.nodes:
            return self.describe()
        return (f"{self.describe()}; grouped into {len(self.nodes)} nodes of {self.node_size} "
                f"({', '.join(f'node {k}: ranks {list(ranks)}' for k, ranks in enumerate(self.nodes))}), "
                f"the link between them {self.between}")


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


def _check_mode(mode, simulate) -> tuple[str, str]:
    """The mode asked for, and by what: mode=, else simulate= (the older spelling), else
    $PARLAB_DEVICES."""
    if mode is not None and simulate is not None:
        raise ValueError(f"pass either mode= or simulate=, not both (got mode={mode!r}, "
                         f"simulate={simulate!r}): simulate=True is mode='cpu', "
                         "simulate=False is mode='gpu'.")
    if simulate is not None:
        return ("cpu" if simulate else "gpu"), "requested"
    if mode is None:
        mode = os.environ.get(MODE_ENV, "").strip() or "auto"
        if mode not in MODES:
            raise ValueError(f"the environment variable {MODE_ENV}={mode!r} is not a device "
                             f"mode: set it to one of {', '.join(MODES)}, or unset it.")
        return mode, f"set by {MODE_ENV}"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(repr(m) for m in MODES)}, got "
                         f"{mode!r}")
    return mode, "requested"


def devices(n: int, *, simulate: bool | None = None, framework: str = "torch",
            mode: str | None = None, nodes: int = 1, between=None) -> DeviceSet:
    """Describe the ``n`` devices a lab will use.

    mode="auto" (default, or ``$PARLAB_DEVICES``): real GPUs when at least ``n`` are
    visible, else ``n`` simulated CPU devices. mode="cpu": always simulate. mode="gpu":
    demand ``n`` real GPUs; too few is a ``ValueError``. mode="shared-gpu": ``n`` ranks
    share the visible GPU(s), messages through host memory (see the module's notes).
    simulate=True / False is the older spelling of mode="cpu" / "gpu".

    nodes: group the ranks into that many nodes of consecutive ranks, as torchrun numbers
    them (rank = node · ranks per node + local rank). A replay then prices messages inside
    a node on this machine's link and messages between nodes on ``between`` (a ``sim.Link``;
    default ``sim.link_preset("ethernet")``, 1 Gb/s). The ranks still run on this machine.
    """
    chosen = _devices(n, simulate=simulate, framework=framework, mode=mode)
    return _in_nodes(chosen, nodes, between)


def _in_nodes(chosen: DeviceSet, nodes, between) -> DeviceSet:
    from dataclasses import replace
    if nodes == 1 and between is None:
        return chosen
    count = whole_number(nodes)
    if count is None or count < 1:
        raise ValueError(f"devices(nodes=...) must be a whole number of nodes >= 1, got {nodes!r}")
    if chosen.n % count:
        raise ValueError(f"devices({chosen.n}, nodes={nodes}): {chosen.n} ranks do not split "
                         f"into {nodes} nodes of equal size; choose nodes among "
                         f"{[k for k in range(1, chosen.n + 1) if chosen.n % k == 0]}")
    from .sim.links import Link
    if between is None:
        from .sim.replay import link_preset
        between = link_preset("ethernet")
    if not isinstance(between, Link):
        raise TypeError(f"devices(between=...) must be a sim.Link (e.g. "
                        f"sim.link_preset('ethernet')), got {type(between).__name__}")
    size = chosen.n // count
    groups = tuple(tuple(range(k * size, (k + 1) * size)) for k in range(count))
    return replace(chosen, nodes=groups, between=between)


def _devices(n: int, *, simulate: bool | None, framework: str, mode: str | None) -> DeviceSet:
    n = _check_count(n)
    simulate = _check_simulate(simulate)
    if framework not in ("torch", "tf"):
        raise ValueError(f"framework must be 'torch' or 'tf', got {framework!r}")
    mode, by = _check_mode(mode, simulate)
    simulate = {"auto": None, "cpu": True, "gpu": False, "shared-gpu": None}[mode]
    gpus = _count_gpus(framework)
    if mode == "shared-gpu":
        return _shared_gpu(n, framework, gpus, f"shared-GPU mode {by}")
    # name the setting that was made, the variable or the argument, as it was typed
    if by == f"set by {MODE_ENV}":
        asked, verb, opt = f"by {MODE_ENV}=gpu", "set", f"{MODE_ENV}={{}}".format
    else:
        asked, verb, opt = "(simulate=False / mode='gpu')", "pass", "mode='{}'".format
    if simulate is False and gpus == 0:
        raise ValueError(
            f"{n} real GPU{'s' * (n > 1)} {'were' if n > 1 else 'was'} demanded {asked} but "
            f"none is visible: {verb} {opt('auto')} or {opt('cpu')} to simulate the devices "
            "on the CPU.")
    if simulate is False and gpus < n:
        raise ValueError(
            f"{n} real GPUs were demanded {asked} but {gpus} "
            f"{'is' if gpus == 1 else 'are'} visible: ask for at most {gpus} devices, "
            f"or {verb} {opt('auto')} to simulate them on the CPU"
            + (f", or {opt('shared-gpu')} to share the GPU." if gpus else "."))
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
        reason = f"simulation {by}"
    elif gpus == 0:
        reason = "no GPU visible"
    else:
        reason = (f"{gpus} GPU{'s' * (gpus > 1)} visible, {n} needed for real devices "
                  f"(mode='shared-gpu' would put the {n} ranks on {'it' if gpus == 1 else 'them'})")
    if framework == "torch":
        names = tuple("cpu" for _ in range(n))
        backend = "gloo"
    else:
        names = tuple(f"/device:CPU:{i}" for i in range(n))
        backend = "logical"
        _configure_logical("CPU", n)
    return DeviceSet(n, framework, "cpu", True, backend, names, gpus, reason)


def devices_alike(counts, *, framework: str = "torch", mode: str | None = None) -> dict:
    """{n: DeviceSet} for each n in ``counts``, all of the kind ``devices`` picks for the
    largest count (``DeviceSet.like``). A speed-up over fewer devices compares like with like
    only so: with one GPU, mode "auto" puts one device on the GPU and two simulated ones on
    the CPU (on an H100 lab 05 measured "2 devices 0.07x one device" that way)."""
    counts = list(counts)
    if not counts:
        raise ValueError("devices_alike needs at least one device count")
    largest = devices(max(counts), framework=framework, mode=mode)
    return {n: largest.like(n) for n in counts}


def _shared_gpu(n: int, framework: str, gpus: int, reason: str) -> DeviceSet:
    """``n`` ranks (torch) or logical GPUs (tf) on the visible GPU(s)."""
    if gpus == 0:
        seen = "torch" if framework == "torch" else "TensorFlow"
        if reason.endswith(MODE_ENV):     # the variable chose it: name the variable
            raise ValueError(
                f"{MODE_ENV}=shared-gpu needs a GPU, but {seen} sees none: set {MODE_ENV}=cpu "
                f"(or auto) to simulate the devices on the CPU, or unset {MODE_ENV}.")
        raise ValueError(
            f"mode='shared-gpu' needs a GPU, but {seen} sees none: use mode='cpu' (or 'auto') "
            "to simulate the devices on the CPU.")
    if framework == "torch":
        if n > MAX_SIMULATED:
            raise ValueError(f"{n} ranks sharing a GPU would be {n} processes each holding "
                             f"its own torch and CUDA context; use at most {MAX_SIMULATED}.")
        names = tuple(f"cuda:{r % gpus}" for r in range(n))
        return DeviceSet(n, framework, "cuda", False, "gloo", names, gpus, reason, shared=True)
    _configure_logical("GPU", n)
    names = tuple(f"/device:GPU:{i}" for i in range(n))
    return DeviceSet(n, framework, "cuda", False, "logical", names, gpus, reason, shared=True)


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


def _configure_logical(kind: str, n: int) -> None:
    """Split the first physical ``kind`` ("CPU" or "GPU") into ``n`` logical TensorFlow devices.

    Must precede any TF op ("Virtual devices cannot be modified after being
    initialized"). A logical GPU gets ``LOGICAL_GPU_MB`` of memory (TensorFlow needs a limit
    per logical GPU). Logical devices serve strategies that place work on devices of this
    process (MirroredStrategy, CentralStorageStrategy, tf.device placement, DTensor);
    MultiWorkerMirroredStrategy and parameter servers run separate processes, each of
    which sees the whole device. Logical GPUs have not been run on a GPU yet: see the
    README's GPU section.
    """
    import tensorflow as tf
    device = tf.config.list_physical_devices(kind)[0]
    limit = LOGICAL_GPU_MB if kind == "GPU" else None
    try:
        tf.config.set_logical_device_configuration(
            device, [tf.config.LogicalDeviceConfiguration(memory_limit=limit) for _ in range(n)])
    except RuntimeError as exc:  # TF initialised already: only a restart can change it
        have = len(tf.config.list_logical_devices(kind))
        if have != n:
            shared = ", mode='shared-gpu'" if kind == "GPU" else ""
            call = f"parlab.devices({n}, framework='tf'{shared})"
            raise ValueError(
                f"TensorFlow already runs with {have} logical {kind} device(s) and cannot be "
                f"changed to {n} in this process: restart the kernel and call {call} before "
                "any other TensorFlow code."
            ) from exc


def cpu_count() -> int:
    """Cores this process may use (respects CPU affinity where the OS reports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
