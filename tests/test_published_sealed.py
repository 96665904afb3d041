"""The held-out set sealed on 2026-11-29 (``parlab.sim.published_runs_sealed``): new sources
only, every record complete, the records pinned, and the first prediction kept on file.

The recorded predictions (``published_predictions_sealed.txt``) are history, not a check:
a later change to the model moves today's predictions, and that is what the set is for. So
this file checks only that the record exists and names every sealed run. The records
themselves must not move: a change to any of them changes the content hash below, and the
set is then no longer the one that was sealed.
"""
import re
from pathlib import Path

import pytest
from published_records import UNVERIFIED, assert_names_its_source_metric_and_value

from parlab.sim import experts
from parlab.sim import published_runs as pr
from parlab.sim import published_runs_sealed as sealed
from parlab.sim.published_setups import HARDWARE, Transformer

SEALED_SHA256 = "091a40b7d09b4fc3479d079f72e507fbf41ce45669087f5d9aa0c779be17c18f"
RECORDED = Path(__file__).with_name("published_predictions_sealed.txt")
NOW = Path(__file__).with_name("published_predictions_sealed_now.txt")
RUNS = sealed.runs()
IDS = [r.id for r in RUNS]


def _source(ref: str) -> str:
    """A reference reduced to its source: the arXiv id, or the GitHub owner/name."""
    arxiv = re.search(r"arXiv:(\d{4}\.\d{4,5})", ref)
    if arxiv:
        return f"arXiv:{arxiv.group(1)}"
    repo = re.search(r"github\.com/([^/\s]+/[^/\s()]+)", ref)
    return repo.group(1).lower() if repo else ref


def _old_sources() -> set:
    refs = {r.cite.ref for r in pr.runs()} | {r.cite.ref for r in experts.published_runs()}
    return {_source(piece) for ref in refs for piece in ref.split(";")}


# ------------------------------------------------------------------ (a) new sources only
def test_no_sealed_source_is_used_by_the_fitting_or_held_out_sets():
    old = _old_sources()
    assert "nvidia/megatron-lm" in old and "arXiv:2407.21783" in old     # the parser works
    for run in RUNS:
        assert _source(run.cite.ref) not in old, (run.id, run.cite.ref)
    assert not set(IDS) & set(pr.FITTING + pr.HELD_OUT)
    assert not set(IDS) & set(pr.by_id())


def test_there_are_at_least_15_runs_from_several_sources():
    assert len(RUNS) >= 15 and len(set(IDS)) == len(IDS)
    assert len({_source(r.cite.ref) for r in RUNS}) >= 4
    expressible = [r for r in RUNS if r.id not in sealed.NOT_IN_THE_MODEL and
                   r.setup.parallel.cp == 1]
    assert len(expressible) >= 15


# ------------------------------------------------------------------ (b) complete records
@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_every_record_is_complete(run):
    assert_names_its_source_metric_and_value(run)
    assert run.verified or UNVERIFIED in run.note
    assert run.setup.hardware in HARDWARE and run.baseline is None
    model, p = run.setup.model, run.setup.parallel
    assert isinstance(model, Transformer)
    assert model.layers > 0 and model.seq > 0 and model.vocab > 0 and model.ffn > 0
    assert model.hidden % model.heads == 0 and model.heads % model.kv_heads == 0
    assert p.gpus == p.tp * p.pp * p.dp * p.cp, (p.tp, p.pp, p.dp, p.cp, p.gpus)
    assert p.global_batch and p.global_batch % p.dp == 0
    if p.micro_batch:
        assert (p.global_batch // p.dp) % p.micro_batch == 0
    if p.pp > 1:
        assert p.schedule in ("1f1b", "interleaved")
        assert model.layers >= p.pp * (p.interleave or 1)     # uneven: validate's rule
    assert p.zero in (0, 1, 2, 3) and p.sharding in ("", "fsdp", "hsdp")
    assert p.recompute in ("none", "full", "selective", None)
    assert p.precision in ("fp16", "bf16", "fp32") or run.id in sealed.NOT_IN_THE_MODEL


def test_runs_outside_the_model_say_why():
    for rid, why in sealed.NOT_IN_THE_MODEL.items():
        assert rid in IDS and why
    for run in RUNS:
        if run.setup.parallel.precision == "fp8":
            assert "Float8" in sealed.NOT_IN_THE_MODEL[run.id]


# ------------------------------------------------------------------ (c) the records are pinned
def test_the_sealed_records_are_the_ones_sealed():
    """Editing a sealed record (a value, a width, a note) fails here. Do not update the hash
    to make it pass: add new runs to a new, dated set instead."""
    assert sealed.content_hash() == SEALED_SHA256


# ------------------------------------------------------------------ (d) the first prediction
def test_the_first_prediction_is_recorded_for_every_sealed_run():
    lines = RECORDED.read_text().splitlines()
    assert [line.split("\t")[0] for line in lines[:-1]] == IDS
    for line in lines[:-1]:
        assert "\tpredicted " in line or "\tinexpressible: " in line, line
    assert lines[-1] == sealed.BEFORE
    assert lines[-1].startswith(f"sealed {sealed.SEALED_DATE}, predicted before any change: ")


def test_every_run_is_predicted_or_says_why_and_the_bench_prints_them():
    got = sealed.lines()
    assert got[0] == sealed.BEFORE and len(got) == len(RUNS) + 2
    for run, line in zip(RUNS, got[1:-1]):
        assert line.startswith(f"sim vs published: {run.id} ")
        assert "; sealed; " in line
    assert got[-1].startswith(f"sealed {sealed.SEALED_DATE}, predicted now: ")


def test_the_prediction_of_the_day_is_the_recorded_one():
    """The model as it is predicts every sealed run as ``published_predictions_sealed_now
    .txt`` records (the first prediction stays in ``published_predictions_sealed.txt``). A
    change to the model that moves one fails here: write the file again
    (``print(*sealed.recorded_lines(sealed.NOW), sep=chr(10))``) and say in
    docs/cost-model-sealed.md what moved."""
    want = NOW.read_text().splitlines()
    got = sealed.recorded_lines(sealed.NOW)
    assert len(got) == len(want) == len(RUNS) + 1
    for mine, theirs in zip(got, want):
        assert mine == theirs
