"""What hardware and software this machine has, for the first cell of a lab."""
from __future__ import annotations

import importlib.util
import os
import platform

from .hardware import MODE_ENV, cpu_count


class SystemReport(dict):
    """A dict of facts that prints as a short, readable list."""

    def __str__(self) -> str:
        width = max(len(k) for k in self)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.items())

    __repr__ = __str__


def _memory_gib() -> str:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return f"{pages * size / 2**30:.1f} GiB"
    except (ValueError, OSError, AttributeError):
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")


def bfloat16_instructions(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The CPU's bfloat16 multiply instructions, as ``cpuinfo`` lists them
    (``avx512_bf16``, ``amx_bf16``): where there are none, autocast to bfloat16 converts
    and multiplies in float32. Empty where none are listed or the file is missing."""
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [f for f in BFLOAT16_FLAGS if f in flags]
    except OSError:
        pass
    return []


def system_report(torch: bool = True) -> SystemReport:
    """Operating system, CPU, memory, and (if asked) torch with its GPUs and backends.

    TensorFlow is reported as installed or not, without importing it.
    """
    report = SystemReport()
    report["os"] = f"{platform.system()} {platform.release()}"
    report["python"] = platform.python_version()
    report["cpu"] = f"{_cpu_model()}, {cpu_count()} cores usable"
    report["memory"] = _memory_gib()
    if torch and importlib.util.find_spec("torch") is not None:
        import torch as _torch
        import torch.distributed as dist
        report["torch"] = _torch.__version__
        report["torch threads"] = _torch.get_num_threads()
        backends = [b for b, ok in (("gloo", dist.is_gloo_available()),
                                    ("nccl", dist.is_nccl_available()),
                                    ("mpi", dist.is_mpi_available())) if ok]
        report["distributed backends"] = ", ".join(backends) or "none"
        n = _torch.cuda.device_count() if _torch.cuda.is_available() else 0
        report["GPUs"] = n
        if n:
            report["CUDA (torch build)"] = _torch.version.cuda
        for i in range(n):
            p = _torch.cuda.get_device_properties(i)
            report[f"cuda:{i}"] = (f"{p.name}, {p.total_memory / 2**30:.1f} GiB, "
                                   f"compute capability {p.major}.{p.minor}")
    report["device mode"] = (f"{os.environ[MODE_ENV]} (from {MODE_ENV})"
                             if os.environ.get(MODE_ENV) else "auto")
    tf = importlib.util.find_spec("tensorflow") is not None
    report["tensorflow"] = "installed (not imported)" if tf else "not installed"
    return report


def listening_addresses(pids=None) -> list[str]:
    """The TCP addresses these processes (default: this one) listen on, as "ip:port".

    The labs print them to show where their servers can be reached: the loopback only
    ("127.0.0.1:..."), or every interface ("0.0.0.0:..." or ":::...").
    """
    import psutil
    found = set()
    for pid in [os.getpid()] if pids is None else pids:
        try:  # per process: the machine-wide list needs root on macOS
            conns = psutil.Process(pid).net_connections("tcp")
        except psutil.NoSuchProcess:
            continue
        found |= {f"{c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN}
    return sorted(found)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n ports on ``host`` that were free a moment ago (TF_CONFIG and cluster specs take
    them). Here rather than in ``parlab.tf.cluster``, whose package imports TensorFlow: a
    notebook that only starts TensorFlow processes need not import it itself."""
    import socket
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
