"""The copy of the labs handed to students: solutions replaced, outputs removed.

``python -m parlab student-copy SRC DST`` (``make student``). The copy never touches the
labs it reads: a destination that is the source folder, or lies inside it, is refused
outright (an instructor who mistypes would otherwise strip the solutions from the only
copy), and a destination that already holds notebooks is refused unless ``force`` says
to replace them, with the list of what was replaced. Every notebook is read and checked
before anything is written, so a broken one stops the copy with its name and nothing
half-written: that includes solution markers the copy cannot strip (unbalanced, nested,
or spelled otherwise, e.g. ``#BEGIN SOLUTION``), which would hand the solution out, and
a destination that cannot take every copy (a file, a folder it may not write to, a
folder where a notebook should go).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

_SOLUTION = re.compile(r"^([ \t]*)# BEGIN SOLUTION[^\n]*\n.*?^[ \t]*# END SOLUTION[^\n]*$",
                       re.S | re.M)
# A marker as strip_solutions reads it, and anything a person may have meant as one: a
# line that looks like a marker but is not the first kind would be copied, solution and all.
_MARKER = re.compile(r"^[ \t]*# (BEGIN|END) SOLUTION\b")
_LOOKS_LIKE_MARKER = re.compile(r"#[\W_]*(BEGIN|END)[\W_]*SOLUTION", re.I)


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
    _refuse_unusable(dst, copies)
    existing = sorted(dst / name for name in copies if (dst / name).exists())
    if existing and not force:
        raise StudentCopyError(
            f"{str(dst)!r} already holds {len(existing)} of these notebooks "
            f"({', '.join(p.name for p in existing)}): pass --force (force=True) to replace "
            "them, or name an empty folder")
    _write_all(dst, copies, existing)
    return [dst / name for name in copies], existing


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


def _refuse_unusable(dst: Path, copies: dict[str, str]) -> None:
    """A destination that is (or lies under) a file, or holds a folder where a notebook goes."""
    for folder in (dst, *dst.parents):
        if folder.exists() and not folder.is_dir():
            what = "" if folder == dst else f" cannot be made: {str(folder)!r}"
            raise StudentCopyError(f"the destination {str(dst)!r}{what} is a file, not a "
                                   "folder. Name a folder, e.g. student")
    for name in copies:
        target = dst / name
        if target.exists() and not target.is_file():
            kind = "a folder" if target.is_dir() else "not a file"
            raise StudentCopyError(f"{str(target)!r} is {kind}, so the copy of {name} cannot "
                                   "go there: move it away, or name another destination")


def _stripped(path: Path) -> str:
    """The notebook at ``path`` without solutions or outputs, as JSON text."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        cells = nb["cells"]
        for index, cell in enumerate(cells):
            if cell["cell_type"] != "code":
                continue
            source = cell["source"]
            text = "".join(source) if isinstance(source, list) else source
            first_line = text.partition("\n")[0]
            where = f"{path}, cell {index} (first line {first_line!r})"
            _check_markers(where, text)
            cell["source"] = strip_solutions(text)
            _check_stripped(where, cell["source"])
            cell["outputs"], cell["execution_count"] = [], None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, StudentCopyError):    # a marker refused above: its own message
            raise
        raise StudentCopyError(f"{path} is not a readable notebook ({type(exc).__name__}: "
                               f"{exc}); nothing was copied. Fix or remove it, then copy "
                               "again") from None
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _check_markers(where: str, text: str) -> None:
    """Every marker written exactly as ``# BEGIN SOLUTION`` / ``# END SOLUTION``, on a line
    of its own, and paired: anything else would leave the solution in the copy."""
    opened = None
    for number, line in enumerate(text.splitlines(), 1):
        if not _LOOKS_LIKE_MARKER.search(line):
            if opened is None and "solution" in line.lower():
                raise StudentCopyError(
                    f"{where}, line {number} says solution outside the markers "
                    f"({line.strip()!r}), so the copy would too: put what students must not "
                    "see between '# BEGIN SOLUTION' and '# END SOLUTION', or reword it; "
                    "nothing was copied")
            continue
        marker = _MARKER.match(line)
        if marker is None:
            raise StudentCopyError(
                f"{where}, line {number}: {line.strip()!r} looks like a solution marker but the "
                "copy would not strip it: write '# BEGIN SOLUTION' or '# END SOLUTION' (that "
                "spelling and case) on a line of its own; nothing was copied")
        if marker.group(1) == "BEGIN" and opened is not None:
            raise StudentCopyError(
                f"{where}, line {number}: '# BEGIN SOLUTION' nested inside the one on line "
                f"{opened}: close that one with '# END SOLUTION' first; nothing was copied")
        if marker.group(1) == "END" and opened is None:
            raise StudentCopyError(
                f"{where}, line {number}: '# END SOLUTION' with no '# BEGIN SOLUTION' before it "
                "in the cell: add the BEGIN or remove this line; nothing was copied")
        opened = number if marker.group(1) == "BEGIN" else None
    if opened is not None:
        raise StudentCopyError(
            f"{where}, line {opened}: '# BEGIN SOLUTION' has no '# END SOLUTION' after it in "
            "the cell: end the solution with '# END SOLUTION'; nothing was copied")


def _check_stripped(where: str, stripped: str) -> None:
    """The last guard, should the checks above miss a case: a code cell of the copy that
    still says "solution" is not handed out."""
    for number, line in enumerate(stripped.splitlines(), 1):
        if "solution" in line.lower():
            raise StudentCopyError(
                f"{where}, line {number} of the copy still says solution ({line.strip()!r}): "
                "put what students must not see between '# BEGIN SOLUTION' and "
                "'# END SOLUTION', or reword it; nothing was copied")


def _write_all(dst: Path, copies: dict[str, str], existing: list[Path]) -> None:
    """Write every copy or none: each is staged next to its place first, so a folder that
    refuses files fails before any notebook is touched; a rename that still fails puts back
    the notebooks already replaced."""
    created = not dst.exists()
    staged: dict[Path, str] = {}
    try:
        dst.mkdir(parents=True, exist_ok=True)
        for name, text in copies.items():
            fd, tmp = tempfile.mkstemp(dir=dst, prefix=f".{name}.", suffix=".tmp")
            staged[dst / name] = tmp
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
    except BaseException as exc:       # Ctrl-C too: no temporary file is left behind
        _unstage(staged.values())
        if created:
            _remove_empty(dst)
        if not isinstance(exc, OSError):
            raise
        raise StudentCopyError(f"cannot write into {str(dst)!r} ({exc.strerror or exc}); "
                               "nothing was changed. Name a folder you may write to") from None
    earlier: dict[Path, bytes | None] = {}      # what each replaced notebook held, to put back
    for path, tmp in staged.items():
        try:
            earlier[path] = path.read_bytes() if path in existing else None
            os.replace(tmp, path)
        except BaseException as exc:
            _unstage(staged.values())
            lost = _put_back(earlier, path)
            if not isinstance(exc, OSError):
                raise
            raise StudentCopyError(
                f"cannot replace {str(path)!r} ({exc.strerror or exc}); "
                + ("nothing was changed" if not lost else
                   f"and could not put back {', '.join(lost)}, now holding the new copy")
                + ". Make it writable or move it away, then copy again") from None


def _put_back(earlier: dict[Path, bytes | None], failed: Path) -> list[str]:
    """Undo the renames before ``failed``; the names of any that could not be undone."""
    lost = []
    for path, data in earlier.items():
        if path == failed:
            continue
        try:
            if data is None:
                path.unlink(missing_ok=True)
            else:
                _write_whole(path, data)
        except OSError:
            lost.append(path.name)
    return lost


def _unstage(tmps) -> None:
    for tmp in tmps:
        Path(tmp).unlink(missing_ok=True)


def _remove_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass     # not empty, or not ours to remove: leave it


def _write_whole(path: Path, data: bytes) -> None:
    """Write through a temporary file and rename: a reader never sees half a notebook."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
