"""Checking what parlab.launch was given, before anything starts: each bad setting is
named with what to pass instead."""
from __future__ import annotations

import math
import numbers
import os

from .errors import whole_number
from .hardware import DeviceSet


MAX_TIMEOUT_S = 30 * 24 * 3600   # a month: a longer timeout is surely a typo


def check_timeout(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise ValueError(f"timeout= must be a number of seconds, got {timeout!r} "
                         f"({type(timeout).__name__}): pass e.g. timeout=120.")
    seconds = float(timeout)
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise ValueError(f"timeout= must be a number of seconds above 0 and at most "
                         f"{MAX_TIMEOUT_S} (30 days), got {timeout!r}: it is when every rank "
                         "is stopped, so pass a finite time, e.g. timeout=3600 for a long run.")
    return seconds


def check_port(port) -> None:
    """``port`` is only checked: ranks meet through a file, no launch opens a port."""
    if port is None:
        return
    number = whole_number(port)
    if number is None or not 0 <= number <= 65535:
        raise ValueError(f"port= must be None or a port number from 0 to 65535, got {port!r}. "
                         "It can be left out: the ranks meet through a file in a private "
                         "folder, and a launch opens no port of its own.")


def check_other_settings(world_size, devices, process_group, env) -> None:
    if devices is not None and not isinstance(devices, DeviceSet):
        raise TypeError(f"devices= must be a parlab.devices(...) choice, got {devices!r}: "
                        f"pass devices=parlab.devices({world_size}), or leave it out.")
    if not isinstance(process_group, bool):
        raise ValueError(f"process_group= must be True or False, got {process_group!r}.")
    if env is None:
        return
    if not isinstance(env, dict):
        raise TypeError(f"env= must be a dict of environment variables, got "
                        f"{type(env).__name__}: write e.g. env={{'MY_SETTING': '1'}}.")
    for key, value in env.items():
        if not (isinstance(key, str) and isinstance(value, str)):
            raise TypeError(f"env= must map names to strings, got {key!r}: {value!r}: "
                            f"write env={{{str(key)!r}: {str(value)!r}}}.")


def threads_asked(env) -> int | None:
    """The threads per rank that ``env={"OMP_NUM_THREADS": ...}`` asks for, checked."""
    value = (env or {}).get("OMP_NUM_THREADS")
    if value is None:
        return None
    if not (value.strip().isdigit() and int(value) >= 1):
        raise ValueError(f"env={{'OMP_NUM_THREADS': {value!r}}}: the threads each rank "
                         "computes with must be a whole number, at least 1: write e.g. "
                         "env={'OMP_NUM_THREADS': '2'}, or leave it out (one thread per "
                         "simulated device).")
    return int(value)


def check_main_script() -> None:
    """Refuse a script read from standard input: a rank's process re-imports the main
    script from its file (multiprocessing's spawn and fork server both do), and
    ``<stdin>`` is no file."""
    import sys
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is not None and path.startswith("<") and not os.path.exists(path):
        raise RuntimeError(
            f"this script was read from {path} (python - <<EOF, or a pipe): each rank's "
            "process imports the main script again from its file, which it cannot do here. "
            "Save the script to a file and run `python file.py`, or call parlab.launch "
            "from a module you import.")


def pinned_cores(world_size: int, pin_cores) -> list:
    """The cores each rank is pinned to, or None for each (not pinned).

    With c cores for n ranks: where n >= c, rank r gets core r mod c (ranks r and r + c
    share one); otherwise each rank gets its own c // n cores, in order.
    """
    if not isinstance(pin_cores, bool):
        raise ValueError(f"pin_cores= must be True or False, got {pin_cores!r}.")
    if not (pin_cores and hasattr(os, "sched_getaffinity")):
        return [None] * world_size
    cores = sorted(os.sched_getaffinity(0))
    if world_size >= len(cores):
        return [frozenset({cores[r % len(cores)]}) for r in range(world_size)]
    k = len(cores) // world_size
    return [frozenset(cores[r * k:(r + 1) * k]) for r in range(world_size)]


def pack_worker(fn, args, kwargs) -> bytes:
    """``fn`` and its arguments, serialized by value where needed (notebook functions)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args= must be a tuple of the worker's further arguments, got "
                        f"{type(args).__name__} {args!r}: for a single one write "
                        f"args=({args!r},).")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs= must be a dict of the worker's keyword arguments, got "
                        f"{type(kwargs).__name__}: write e.g. kwargs={{'steps': 20}}.")
    for key in kwargs:
        if not isinstance(key, str):
            raise TypeError(f"kwargs= keys must be strings (argument names), got {key!r}.")
        if key in ("rank", "world_size"):
            raise TypeError(f"kwargs= cannot set {key!r}: the launcher passes it to every "
                            "rank.")
    import cloudpickle
    try:
        return cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    except Exception as exc:
        raise TypeError(
            f"could not send {getattr(fn, '__name__', fn)!r} and its args to the ranks "
            f"({type(exc).__name__}: {exc}). Pass plain data (numbers, arrays, tensors) "
            "as args and kwargs, and build models, files or locks inside the worker."
        ) from exc
