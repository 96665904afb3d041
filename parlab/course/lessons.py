"""Lessons: each quantitative claim of a lab, as a check that the lab's own run evaluates.

A lab states a lesson once, as a claim ("with one worker 3x slower, asynchronous training
processes more samples per second than synchronous"). Its module registers the claim
with two functions: an *experiment*, which runs what the notebook runs and returns the
numbers the claim is about, and a *check*, which reads those numbers and says whether
this run showed the claim, with the figures, and if not, why (measured: e.g. how much of
the ranks' time went to waiting for a core). The notebook calls the same check on the
numbers it just measured and prints one line (numbers with a "source", e.g. "replayed on
2 dedicated devices, this machine's link", say so in it); ``python -m parlab lessons`` runs the
experiments several times, without the notebooks, and counts how often each lesson
showed: the course's measure of whether its labs teach what they say, on this machine.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable

def _labs() -> tuple[str, ...]:
    """The lab numbers that have a module here (``labNN.py``), in order."""
    import pkgutil
    import re

    from . import __path__ as here
    return tuple(sorted(m.name[3:] for m in pkgutil.iter_modules(here)
                        if re.fullmatch(r"lab\d\d", m.name)))


LABS = _labs()


@dataclass(frozen=True)
class Verdict:
    """What one run showed of one lesson: shown or not, the figures, and why not."""

    lesson: str
    shown: bool
    figures: str
    why: str = ""
    source: str = ""    # what the lesson read, where not the measurement: "replayed on ..."

    def __str__(self) -> str:
        read = f" ({self.source})" if self.source else ""
        if self.shown:
            return f"lesson {self.lesson}: shown{read} — {self.figures}"
        return (f"lesson {self.lesson}: not shown on this run{read} — {self.figures}"
                + (f"; {self.why}" if self.why else ""))

    __repr__ = __str__


@dataclass(frozen=True)
class Lesson:
    name: str                                   # "06.async_beats_sync": lab, then the claim's name
    claim: str                                  # the sentence the lab states
    check: Callable[[dict], tuple]              # numbers -> (shown, figures, why[, source])
    experiment: Callable[[], dict]              # runs the lab's measurement -> numbers

    @property
    def lab(self) -> str:
        return self.name.split(".", 1)[0]


_LESSONS: dict[str, Lesson] = {}


def lesson(name: str, claim: str, experiment: Callable[[], dict]):
    """Register the decorated ``check(numbers) -> (shown, figures, why)`` as lesson ``name``."""
    lab, _, short = name.partition(".")
    if lab not in LABS or not short:
        raise ValueError(f"a lesson's name is 'NN.what_it_shows' with NN a lab number "
                         f"{LABS[0]}-{LABS[-1]}, got {name!r}")

    def register(check):
        _LESSONS[name] = Lesson(name, claim, check, experiment)
        return check
    return register


def evaluate(name: str, numbers: dict) -> Verdict:
    """The verdict of lesson ``name`` on ``numbers`` (what its experiment returns)."""
    try:
        found = _LESSONS[name]
    except KeyError:
        raise KeyError(f"no lesson {name!r}; the lessons are {sorted(_LESSONS)}") from None
    out = found.check(numbers)
    shown, figures, why = out[:3]
    # what the lesson read: its own word (a 4th value), else the numbers' "source"
    source = out[3] if len(out) > 3 else (
        numbers.get("source", "") if isinstance(numbers, dict) else "")
    return Verdict(name, bool(shown), figures, "" if shown else why, source)


_SHOWN: dict[str, Verdict] = {}     # the latest verdict of each lesson in this process


def show(name: str, numbers: dict) -> None:
    """Print the one line of lesson ``name`` on this run's numbers (a notebook's call;
    it returns nothing, so a cell ending with it prints the line once)."""
    verdict = evaluate(name, numbers)
    _SHOWN[name] = verdict
    print(verdict)


def summary(lab: str) -> None:
    """Print a lab's closing lines: each lesson's claim, then what this session's run
    showed of it (the verdicts printed by ``show``), never a result written in advance."""
    lines = []
    for x in of_lab(lab):
        got = _SHOWN.get(x.name)
        lines.append(f"* {x.claim[0].upper()}{x.claim[1:]}.\n  "
                     + (str(got) if got else f"lesson {x.name}: not run in this session"))
    print("\n".join(lines))


def of_lab(lab: str) -> list[Lesson]:
    """The lessons of lab ``lab`` ("06"), registered when its module is imported."""
    importlib.import_module(f"parlab.course.lab{lab}")
    return [x for x in _LESSONS.values() if x.lab == lab]


def beside(value: float, threshold: float, digits: int = 2, *, at_most: bool = False) -> str:
    """``value`` with enough decimals to land on the same side of ``threshold`` as the
    value itself, for a check ``value >= threshold`` (``at_most``: ``value <= threshold``):
    a check that needs 1.2 prints 1.1996, not a "1.20" that looks passed."""
    def ok(x):
        return x <= threshold if at_most else x >= threshold
    for d in range(digits, digits + 7):
        text = f"{value:.{d}f}"
        if ok(float(text)) == ok(value):
            return text
    return repr(value)


def core_wait_share(timeline, ranks) -> float:
    """Mean share of ``ranks``' lanes spent waiting for a core: the measured reason a
    lesson about parallel work fails where ranks outnumber cores."""
    summary = timeline.summary()
    return sum(summary[r]["core_wait_share"] for r in ranks) / max(len(ranks), 1)


def run(labs=LABS, runs: int = 1, out=print) -> dict[str, list[Verdict]]:
    """Run every lesson experiment of ``labs`` ``runs`` times; print one line per lesson
    (``lesson NN.name: shown k/N (figures of each run)``, with the reason after the figures
    of a run that did not show it) and a last line with the count shown in every run and
    the machine's mean load while they ran. An experiment shared by several lessons runs
    once per run."""
    verdicts: dict[str, list[Verdict]] = {}
    loads = []          # the 1-minute load average after each experiment: its mean is printed
    for lab in labs:
        found = of_lab(lab)
        for _ in range(runs):
            numbers: dict = {}
            for x in found:
                if x.experiment not in numbers:
                    numbers[x.experiment] = x.experiment()
                    loads.append(_load())
                verdicts.setdefault(x.name, []).append(evaluate(x.name, numbers[x.experiment]))
        for x in found:
            got = verdicts[x.name]
            runs_text = "; ".join(v.figures if v.shown else f"{v.figures} [not shown: {v.why}]"
                                  for v in got)
            out(f"lesson {x.name}: shown {sum(v.shown for v in got)}/{len(got)} ({runs_text})")
    every = sum(all(v.shown for v in got) for got in verdicts.values())
    load = sum(loads) / len(loads) if loads else _load()
    # the course's targets: 9 runs in 10 on a quiet machine, 8 in 10 under load
    nine, eight = (sum(10 * sum(v.shown for v in got) >= k * len(got)
                       for got in verdicts.values()) for k in (9, 8))
    out(f"lessons: {every} of {len(verdicts)} shown in every run, {nine} in at least 9 runs "
        f"of 10, {eight} in at least 8 of 10 ({runs} run{'s' * (runs != 1)}, load {load:.1f})")
    return verdicts


def _load() -> float:
    """The 1-minute load average (the experiments' own ranks included): 2.0 is a 2-core
    machine kept busy by one 2-rank run; nan where the system has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
