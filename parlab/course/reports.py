"""A failure shown the way a lab teaches it: provoked under a timeout, trimmed to the lines
that matter, the whole text in a file.

``provoke(name, fn, world_size, timeout=...)`` launches a rank function that may hang or
fail. What the ranks print is kept out of the notebook: C++ libraries (gloo, TensorFlow)
write to the process's standard error directly, past Python, and a crash prints dozens of
lines. It goes to a file instead, with the error's full text and the function's source.
The ``Outcome`` says how the launch ended (finished, hung, failed) and after how many
seconds, where each rank was (a line of the rank function, numbered as ``listing`` numbers
it, and the call it was in), and ``show()`` prints those few lines and where the rest is.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import re
import reprlib
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import LaunchTimeout, WorkerError
from ..launcher import LaunchResult, launch

_BRIEF = reprlib.Repr()         # results in a report: a few items of each, not every weight
_BRIEF.maxlist = _BRIEF.maxdict = _BRIEF.maxtuple = 8
_BRIEF.maxstring = _BRIEF.maxother = 120
WIDTH = 110                         # characters per printed line before it wraps
FOLDER = Path("traces") / "reports"  # where full reports go, relative to the working folder


def listing(fn: Callable) -> str:
    """The source of ``fn`` with line numbers, 1 for its ``def``: how reports number lines."""
    lines, _ = inspect.getsourcelines(fn)
    lines = textwrap.dedent("".join(lines)).splitlines()
    return "\n".join(f"{i:3d}  {line}" for i, line in enumerate(lines, 1))


@dataclass(frozen=True)
class Where:
    """Where a rank was: a line of the rank function and the call it was making there."""

    line: int        # 1 = the function's def line, as ``listing`` numbers it
    code: str        # the text of that line
    call: str        # the function called from that line that was running ("send"), or ""

    def __str__(self) -> str:
        inside = f"in {self.call}() " if self.call else ""
        return f"{inside}at line {self.line}: {self.code}"


# "send (distributed/distributed_c10d.py:2753)": a frame of a launcher's stack report
_STACK_FRAME = re.compile(r"([\w<>.]+) \(([^()]*?):(\d+)\)")
# 'File "/x/y.py", line 12, in swap': a frame of a Python traceback (outermost first)
_TB_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([\w<>.]+)')


def _tail(path: str) -> str:
    return "/".join(path.replace("\\", "/").split("/")[-2:])


def where_in(fn: Callable, text: str) -> Where | None:
    """The innermost line of ``fn`` in a stack report or a traceback, and the call made
    there; None when ``fn`` is not on it."""
    frames = [(m.group(1), m.group(2), int(m.group(3))) for m in _STACK_FRAME.finditer(text)]
    if not frames:      # a traceback: outermost first, so turn it round
        frames = [(m.group(3), m.group(1), int(m.group(2)))
                  for m in _TB_FRAME.finditer(text)][::-1]
    code = fn.__code__
    for i, (func, path, line) in enumerate(frames):
        if func == fn.__name__ and _tail(path) == _tail(code.co_filename):
            return Where(line - code.co_firstlineno + 1, _source_line(fn, line),
                         frames[i - 1][0] if i else "")
    return None


def _source_line(fn: Callable, line: int) -> str:
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return ""
    i = line - start
    return lines[i].strip() if 0 <= i < len(lines) else ""


def clean(text: str) -> str:
    """An error message without its noise: gloo's build paths, the device options of
    every tensor in a collective's fingerprint, TensorFlow's frames, sign-offs."""
    text = re.sub(r"\[/\S*?/third_party/(\w+)/\S*/([\w.]+:\d+)\]", r"[\1 \2]", text)
    text = _drop_calls(text, ", TensorDeviceTypes=TensorOptions(")
    text = re.sub(r" Check the logs of the remote worker.*", "", text)
    kept = [line for line in text.splitlines() if line.strip()
            and not line.strip().startswith("File ") and "defined at (most recent" not in line]
    return "\n".join(kept)


def _drop_calls(text: str, opening: str) -> str:
    """Remove every ``opening...)`` with its parentheses balanced."""
    while (i := text.find(opening)) >= 0:
        depth, j = 1, i + len(opening)
        while j < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
        text = text[:i] + text[j:]
    return text


def _wrapped(line: str, indent: str = "    ") -> list[str]:
    return textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False) or [""]


@dataclass
class Outcome:
    """How a provoked launch ended, and what the learner should read of it."""

    name: str
    fn: Callable
    world_size: int
    seconds: float                     # from the launch to its end, start-up included
    result: LaunchResult | None = None
    error: BaseException | None = None
    output: str = ""                   # everything the ranks printed
    path: Path | None = None           # the full report

    @property
    def ended(self) -> str:
        if isinstance(self.error, LaunchTimeout):
            return "hung"
        return "failed" if self.error is not None else "finished"

    @property
    def results(self) -> list | None:
        return self.result.results if self.result is not None else None

    def where(self) -> dict[int, Where]:
        """Each rank's line of the rank function: where it hung, or where it failed."""
        err, out = self.error, {}
        if isinstance(err, LaunchTimeout):
            for rank, text in err.stuck.items():
                if (w := where_in(self.fn, text)) is not None:
                    out[rank] = w
        elif isinstance(err, WorkerError):
            w = where_in(self.fn, err.remote_traceback) or where_in(self.fn, err.summary)
            if w is not None:
                out[err.rank] = w
        return out

    def lines(self) -> list[str]:
        """The lines that matter, then where the full text is."""
        where, err = self.where(), self.error
        if isinstance(err, LaunchTimeout):
            out = [f"{self.name}: hung — still running when the timeout of {err.timeout:g} s ran "
                   f"out ({self.seconds:.1f} s after the launch); every rank was stopped"]
            for rank, text in sorted(err.stuck.items()):
                out += _wrapped(f"  rank {rank}: {where.get(rank) or clean(text)}")
        elif isinstance(err, WorkerError):
            head = clean(err.summary).splitlines() or [""]
            out = _wrapped(f"{self.name}: failed after {self.seconds:.1f} s — rank {err.rank} of "
                           f"{err.world_size}: {head[0]}")
            for line in head[1:4]:
                out += _wrapped(f"  {line.strip()}")
            if err.rank in where:
                out += _wrapped(f"  rank {err.rank} was {where[err.rank]}")
            for line in self.output.splitlines():   # a C++ library's last words (gloo's abort)
                if "what():" in line:
                    out += _wrapped("  printed: " + clean(line.split("what():", 1)[1].strip()))
            for other in err.other_failures:
                out += _wrapped(f"  then {clean(other).splitlines()[0]}")
        else:
            out = [f"{self.name}: finished in {self.seconds:.1f} s"]
        if self.path is not None:
            out.append(f"  full report ({len(self.text().splitlines())} lines): {self.path}")
        return out

    def show(self) -> None:
        print("\n".join(self.lines()))

    def text(self) -> str:
        """The whole report: the function, how the launch ended, what the ranks printed."""
        try:
            source = listing(self.fn)
        except (OSError, TypeError):
            source = f"({self.fn!r}: no source)"
        ended = (f"{type(self.error).__name__}: {self.error}" if self.error is not None
                 else f"results: {_BRIEF.repr(self.results)}")
        return (f"{self.name}: {self.ended} after {self.seconds:.2f} s on {self.world_size} ranks\n\n"
                f"--- the rank function ---\n{source}\n\n--- how the launch ended ---\n{ended}\n\n"
                f"--- what the ranks printed ---\n{self.output.rstrip() or '(nothing)'}\n")


def provoke(name: str, fn: Callable, world_size: int, *, timeout: float,
            kwargs: dict | None = None, env: dict | None = None, devices=None,
            process_group: bool = True, folder: str | Path = FOLDER) -> Outcome:
    """Launch ``fn`` on ``world_size`` ranks, expecting that it may hang or fail; never
    longer than ``timeout`` seconds (plus stopping the ranks). The ranks' output and the
    full report go to ``folder/name.txt``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    result, error = None, None
    with _ranks_output() as captured:
        t0 = time.perf_counter()
        try:
            result = launch(fn, world_size, kwargs=kwargs, timeout=timeout, env=env,
                            devices=devices, process_group=process_group)
        except (LaunchTimeout, WorkerError) as exc:
            error = exc
        seconds = time.perf_counter() - t0
        output = captured.read_text(errors="replace")
    file_name = re.sub(r"[^\w.-]+", "_", name) + ".txt"
    out = Outcome(name, fn, world_size, seconds, result, error, output, folder / file_name)
    out.path.write_text(out.text())
    return out


@contextlib.contextmanager
def _ranks_output():
    """Send this process's file descriptors 1 and 2 to a file while the block runs.

    Ranks inherit them (spawned), or receive them at each launch (forked from the fork
    server): so what they print, Python or C++, lands in the file, not in the cell.
    """
    fd, name = tempfile.mkstemp(prefix="parlab-ranks-", suffix=".txt")
    path = Path(name)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = []
    try:
        for target in (1, 2):
            try:
                saved.append((target, os.dup(target)))
            except OSError:        # not open: nothing to redirect
                continue
            os.dup2(fd, target)
        yield path
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for target, copy in saved:
            os.dup2(copy, target)
            os.close(copy)
        os.close(fd)
        path.unlink(missing_ok=True)
