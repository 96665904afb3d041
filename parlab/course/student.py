"""The copy of the labs handed to students: solutions replaced, outputs removed.

``python -m parlab student-copy SRC DST`` (``make student``). The copy never touches the
labs it reads: a destination that is the source folder, or lies inside it, is refused
outright (an instructor who mistypes would otherwise strip the solutions from the only
copy), and a destination that already holds notebooks is refused unless ``force`` says
to replace them, with the list of what was replaced. Every notebook is read and checked
before anything is written, so a broken one stops the copy with its name and nothing
half-written.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

_SOLUTION = re.compile(r"^([ \t]*)# BEGIN SOLUTION[^\n]*\n.*?^[ \t]*# END SOLUTION[^\n]*$",
                       re.S | re.M)


def strip_solutions(source: str) -> str:
    """Replace each marked solution with a ``raise NotImplementedError`` at its indent."""
    return _SOLUTION.sub(
        lambda m: f'{m.group(1)}raise NotImplementedError("your code here")', source)


class StudentCopyError(ValueError):
    """The copy was refused; the message says what to change. Nothing was written."""


def student_copy(src: str | Path = "labs", dst: str | Path = "student", *,
                 force: bool = False) -> tuple[list[Path], list[Path]]:
    """Copy every notebook of ``src`` into ``dst`` without solutions or outputs.

    Returns ``(written, replaced)``: every notebook written, and those among them that
    replaced a file already in ``dst`` (only with ``force=True``).
    """
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise StudentCopyError(f"no folder {str(src)!r} to copy the labs from: name the folder "
                               "that holds the lab notebooks, e.g. labs")
    sources = sorted(src.glob("*.ipynb"))
    if not sources:
        raise StudentCopyError(f"{str(src)!r} holds no notebooks (*.ipynb): nothing to copy. "
                               "Name the folder that holds the labs, e.g. labs")
    _refuse_inside(src, dst)
    copies = {path.name: _stripped(path) for path in sources}   # all read before any write
    existing = sorted(dst / name for name in copies if (dst / name).exists())
    if existing and not force:
        raise StudentCopyError(
            f"{str(dst)!r} already holds {len(existing)} of these notebooks "
            f"({', '.join(p.name for p in existing)}): pass --force (force=True) to replace "
            "them, or name an empty folder")
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in copies.items():
        _write_whole(dst / name, text)
        written.append(dst / name)
    return written, existing


def _refuse_inside(src: Path, dst: Path) -> None:
    src_r, dst_r = src.resolve(), dst.resolve()
    if dst_r == src_r:
        raise StudentCopyError(
            f"the destination {str(dst)!r} is the source folder itself: the copy would strip "
            "the solutions from the labs it reads. Name another folder, e.g. student")
    if src_r in dst_r.parents:
        raise StudentCopyError(
            f"the destination {str(dst)!r} lies inside the source folder {str(src)!r}: the "
            "stripped copies would sit among the labs. Name a folder outside it, e.g. student")


def _stripped(path: Path) -> str:
    """The notebook at ``path`` without solutions or outputs, as JSON text."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        cells = nb["cells"]
        for cell in cells:
            if cell["cell_type"] != "code":
                continue
            source = cell["source"]
            text = "".join(source) if isinstance(source, list) else source
            cell["source"] = strip_solutions(text)
            cell["outputs"], cell["execution_count"] = [], None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise StudentCopyError(f"{path} is not a readable notebook ({type(exc).__name__}: "
                               f"{exc}); nothing was copied. Fix or remove it, then copy "
                               "again") from None
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _write_whole(path: Path, text: str) -> None:
    """Write through a temporary file and rename: a reader never sees half a notebook."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
