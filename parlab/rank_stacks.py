"""A rank's Python stack, asked for when it hangs or read after it died (faulthandler)."""
from __future__ import annotations

import re
import signal
import time

from . import _worker
from .rank_exits import describe_exit, exit_code


STACK_FRAMES = 6            # innermost frames shown for a hung or crashed rank


DUMP_WAIT_S = 1.0           # how long a rank asked for its stack gets to write it


def _read_dump(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _main_thread_frames(dump: str) -> list[str]:
    """The main thread's frames (innermost first) from the last faulthandler dump.

    A dump of one thread ("Stack (most recent call first):") answers a request sent to
    the main thread itself; an all-threads dump names each thread, and the file's first
    line names the main one.
    """
    lines = dump.splitlines()
    if not lines or not lines[0].startswith("main-thread "):
        return []
    main_id = lines[0].split()[1].lower()
    frames, main_frames = None, []
    for line in lines[1:]:
        text = line.strip()
        header = re.match(r"(?:Current thread|Thread) (0x[0-9a-fA-F]+)", text)
        if header or text.startswith("Stack ("):
            frames = []
            if header is None or header.group(1).lower() == main_id:
                main_frames = frames
        elif frames is not None and text.startswith("File "):
            frames.append(text)
    return main_frames


def _format_frames(frames: list[str]) -> str:
    for i, frame in enumerate(frames):  # below the worker call is only parlab's plumbing
        if "_worker.py" in frame and frame.endswith(" in main"):
            frames = frames[:i]
            break
    shown = [re.sub(r'^File "(.*)", line (\d+) in (.*)$',
                    lambda m: f"{m.group(3)} ({_short_path(m.group(1))}:{m.group(2)})", f)
             for f in frames[:STACK_FRAMES]]
    return " <- ".join(shown) + (" <- ..." if len(frames) > STACK_FRAMES else "")


def _short_path(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


def ask_for_stacks(procs, ranks, dump_paths) -> dict[int, str]:
    """Ask each rank for its main thread's stack (faulthandler), and read the dumps.

    A rank that dies from the request (a multi-threaded TensorFlow rank sometimes does)
    is reported as such.
    """
    if not ranks:
        return {}
    if not hasattr(signal, "SIGUSR1"):
        return {r: "running the worker (stacks cannot be requested on this system)"
                for r in ranks}
    sizes = {r: len(_read_dump(dump_paths[r])) for r in ranks}
    for r in ranks:
        _worker.request_stack(procs[r].pid)
    _wait_for_dumps(procs, ranks, dump_paths, sizes)
    report = {}
    for r in ranks:
        frames = _main_thread_frames(_read_dump(dump_paths[r]))
        where = _format_frames(frames) if frames else ""
        code = exit_code(procs[r])
        if code is not None:
            report[r] = (f"died when asked for its stack ({describe_exit(code)})"
                         + (f"; its stack then: {where}" if where else ""))
        elif where:
            report[r] = "stack, most recent call first: " + where
        elif _stopped(procs[r].pid):
            report[r] = ("stopped by a signal (SIGSTOP, SIGTSTP) or a debugger: it was not "
                         "running, so it could not tell where it was")
        else:
            report[r] = f"running the worker; its stack did not arrive within {DUMP_WAIT_S:g} s"
    return report


def _stopped(pid: int) -> bool:
    """Whether a process is stopped (state T, or t under a debugger), on Linux."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def _wait_for_dumps(procs, ranks, dump_paths, sizes) -> None:
    """Until each rank has written a dump (its file grew, then stopped growing) or died."""
    end = time.perf_counter() + DUMP_WAIT_S
    pending, last = set(ranks), dict(sizes)
    while pending and time.perf_counter() < end:
        time.sleep(0.05)
        for r in list(pending):
            size = len(_read_dump(dump_paths[r]))
            if exit_code(procs[r]) is not None or sizes[r] < size == last[r]:
                pending.discard(r)
            last[r] = size


def _crashing_thread(dump: str) -> tuple[bool, list[str]]:
    """(is it the main thread?, its frames innermost first) of the thread that took a
    fatal signal: faulthandler's last "Fatal Python error" names it "Current thread"."""
    fatal = dump.rfind("Fatal Python error")
    lines = dump.splitlines()
    main_id = lines[0].split()[1].lower() if lines and lines[0].startswith("main-thread ") else ""
    frames, is_main = None, False
    for line in dump[fatal:].splitlines() if fatal >= 0 else []:
        text = line.strip()
        header = re.match(r"Current thread (0x[0-9a-fA-F]+)", text)
        if header:
            frames, is_main = [], header.group(1).lower() == main_id
        elif frames is not None and text.startswith("File "):
            frames.append(text)
        elif frames is not None and text:       # the next thread's header: done
            break
    return is_main, frames or []


def crashed_in_library(remote_traceback: str) -> str | None:
    """The installed package (e.g. "tensorflow") whose code the crashing thread was
    running when the process took a fatal signal, from the dump a death report carries;
    None where the crash was in the course's or the caller's code, or is unknown."""
    return _library_of(_crashing_thread(remote_traceback)[1])


def _library_of(frames: list[str]) -> str | None:
    """The installed package of the innermost of ``frames``, if it is in one."""
    found = re.search(r"[/\\](?:site|dist)-packages[/\\]([A-Za-z_][\w]*)", frames[0]) if frames else None
    return found.group(1) if found else None


def death_report(code, dump_path) -> tuple[str, str]:
    """Summary and traceback text for a rank that died without reporting an error."""
    dump = _read_dump(dump_path)
    if not dump.startswith("main-thread "):
        # The worker never ran: the process died while Python was starting it.
        return (f"the process died while starting ({describe_exit(code)}), before parlab's "
                "worker code ran; its error is printed above. In a script, the call to "
                "parlab.launch must sit under `if __name__ == \"__main__\":` (spawned "
                "processes import the main script).", "")
    frames = _main_thread_frames(dump)
    where = f"; last stack: {_format_frames(frames)}" if frames else ""
    fatal = dump.split("\n", 1)[1] if "Fatal Python error" in dump else ""
    is_main, crashing = _crashing_thread(dump)
    library = _library_of(crashing)
    if crashing and not is_main:     # name the thread that crashed, not only the main one
        where = (f"; the crash was in another thread, at {_format_frames(crashing)}"
                 + (f"; the main thread was at {_format_frames(frames)}" if frames else ""))
    if library:
        return (f"the process crashed ({describe_exit(code)}) inside {library}'s own code, "
                f"not in a Python error of the caller's{where}", fatal)
    return (f"the process died ({describe_exit(code)}) without reporting an error{where}", fatal)
