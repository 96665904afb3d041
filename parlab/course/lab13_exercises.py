"""Lab 13's exercises: which slices of a checkpoint a rank reads when it resumes on another
number of ranks, and which checkpoint to resume from. Each check says what is wrong in
words and returns the function the lab goes on with: the learner's when it is right, the
reference otherwise."""
from __future__ import annotations

from .exercise import check_with


# ------------------------------------------------------------------ 13.1: resharding
def _chunk(rows: int, n: int, i: int) -> tuple[int, int]:
    """Rows [start, stop) of part i of n, torch.chunk's way: ceil(rows / n) a part."""
    size = -(-rows // n)
    return min(i * size, rows), min((i + 1) * size, rows)


def reads(rows: int, saved_on: int, loaded_on: int, rank: int) -> list[tuple[int, int, int]]:
    """The reference: (saved rank, start, stop) of every slice of the saved files that
    rank ``rank`` of ``loaded_on`` reads for its part of a tensor of ``rows`` rows, saved
    by ``saved_on`` ranks; each rank holds ceil(rows / ranks) rows, in rank order."""
    lo, hi = _chunk(rows, loaded_on, rank)
    out = []
    for s in range(saved_on):
        a, b = _chunk(rows, saved_on, s)
        if max(a, lo) < min(b, hi):
            out.append((s, max(a, lo), min(b, hi)))
    return out


CASES = ((512, 4, 2), (512, 4, 1), (512, 2, 4), (10, 4, 3), (7, 4, 4))


def _reads_problem(fn) -> str | None:
    for rows, saved_on, loaded_on in CASES:
        for rank in range(loaded_on):
            got = [tuple(int(v) for v in t) for t in fn(rows, saved_on, loaded_on, rank)]
            want = reads(rows, saved_on, loaded_on, rank)
            where = (f"{rows} rows saved on {saved_on} ranks, rank {rank} of {loaded_on}")
            if got == want:
                continue
            covered = sorted(r for _, a, b in got for r in range(a, b))
            lo, hi = _chunk(rows, loaded_on, rank)
            if covered != list(range(lo, hi)):
                return (f"{where}: your slices cover rows {_span(covered)}; this rank's part "
                        f"is rows {lo}-{hi - 1} (ceil(rows / ranks) a rank, in rank order).")
            return (f"{where}: the rows are right but the slices are not: each slice comes "
                    "from the saved rank that holds it, one slice per saved rank, in rank "
                    f"order (got {got}).")
    return None


def _span(rows: list) -> str:
    return f"{rows[0]}-{rows[-1]}" if rows else "none"


def check_reads(fn):
    """Check the learner's resharding plan on five shapes of saved and loaded ranks."""
    return check_with("reads", fn, _reads_problem, reads,
                      f"on {len(CASES)} layouts each rank reads exactly its rows, from the "
                      "saved ranks that hold them: what DCP plans when it reshards.")


# ------------------------------------------------------------------ 13.2: which checkpoint
def newest_complete(folder):
    """The reference: the newest ``step-NNNNNN`` folder in ``folder`` that holds a
    ``manifest.json`` (its save finished), or None."""
    from pathlib import Path
    done = [p for p in Path(folder).iterdir()
            if p.is_dir() and p.name.startswith("step-") and (p / "manifest.json").is_file()]
    return max(done, key=lambda p: int(p.name[len("step-"):]), default=None)


def _folder_with_traps(root):
    """step-000002 and step-000004 complete; step-000006 without its manifest; a partial
    save of step 8 that wrote its manifest before the crash."""
    from pathlib import Path
    root = Path(root)
    for name, manifest in (("step-000002", True), ("step-000004", True),
                           ("step-000006", False), (".step-000008.partial-1f2e", True)):
        (root / name).mkdir(parents=True)
        (root / name / "__0_0.distcp").write_bytes(b"\0" * 16)
        if manifest:
            (root / name / "manifest.json").write_text("{}")
    return root


def _newest_problem(fn) -> str | None:
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty"
        empty.mkdir()
        if fn(empty) is not None:
            return "in a folder without checkpoints, return None."
        got = fn(_folder_with_traps(Path(tmp) / "run"))
        name = Path(got).name if got is not None else None
        if name == "step-000006":
            return ("you chose step-000006, whose manifest is missing: its save never "
                    "finished, and some ranks' files may be missing too.")
        if name and name.startswith(".step"):
            return ("you chose a .partial folder: a save that crashed before its rename, "
                    "even though it holds a manifest. Only step-NNNNNN folders count.")
        if name != "step-000004":
            return f"you chose {name}; the newest complete checkpoint is step-000004."
    return None


def check_newest_complete(fn):
    """Check the learner's choice of checkpoint on a folder with traps."""
    return check_with("newest complete", fn, _newest_problem, newest_complete,
                      "you skip the save without a manifest and the crashed partial folder, "
                      "and resume from the newest whole checkpoint.")
