"""The validation set of published runs is complete, consistent, and split before use.

Every run names its source and its value; every configuration adds up (GPUs = tp x pp x
dp x cp, widths divide into heads, batches into micro-batches and ranks); the split is a
partition made by its written rule, covering every kind in both sets; and the numbers
printed beside a value in the same row agree with it, so a slip in transcription fails
here rather than as a wrong prediction later.
"""
import datetime

import pytest
from published_records import UNVERIFIED, assert_names_its_source_metric_and_value

from parlab.sim import clusters, published
from parlab.sim import published_runs as pr
from parlab.sim.published_setups import HARDWARE, Collective, ConvNet, Parameters, Transformer

RUNS = pr.runs()
IDS = [r.id for r in RUNS]
RECOMPUTE = {"none", "full", "selective", "full-except-last", None}


def _setups(run):
    return [run.setup] + ([run.baseline] if run.baseline is not None else [])


def _column(run, label):
    return dict(run.columns)[label]


# ------------------------------------------------------------------ completeness
def test_there_are_enough_runs_to_lose_some_and_keep_25():
    assert len(RUNS) >= 30
    assert len(set(IDS)) == len(IDS), "run ids must be unique"


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_every_run_names_its_source_metric_value_and_hardware(run):
    assert_names_its_source_metric_and_value(run)
    if "FLOP" in run.unit or "peak" in run.unit:
        assert run.flops, f"{run.id}: a FLOP/s or utilisation figure needs its FLOP count"
    for setup in _setups(run):
        assert setup.hardware in HARDWARE
    assert run.preset == HARDWARE[run.setup.hardware].preset


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_a_run_not_read_in_a_stored_source_says_so(run):
    assert run.verified or UNVERIFIED in run.note


@pytest.mark.parametrize("key", sorted(HARDWARE))
def test_hardware_records_have_datasheet_figures_and_a_preset_that_exists(key):
    hw = HARDWARE[key]
    assert hw.peak_tflops > 0 and hw.memory_gb > 0 and hw.memory_gbs > 0 and hw.intra_gbs > 0
    assert hw.per_node >= 1 and hw.nics >= 0 and (hw.nic_gbps > 0) == (hw.nics > 0)
    assert hw.source and hw.preset
    if not hw.preset.startswith("new:"):
        name = hw.preset.split()[0]
        assert hasattr(clusters, name) or hasattr(published, name), hw.preset


# ------------------------------------------------------------------ configurations add up
@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_layouts_multiply_to_the_gpu_count(run):
    for setup in _setups(run):
        p = setup.parallel
        if p.gpus is None:
            assert run.kind == "collective" and "not stated" in run.note
            continue
        assert p.tp * p.pp * p.dp * p.cp == p.gpus, (p.tp, p.pp, p.dp, p.cp, p.gpus)
        hw = HARDWARE[setup.hardware]
        if hw.nics == 0:
            assert p.gpus <= hw.per_node, f"{run.id}: {p.gpus} GPUs on a one-node machine"


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_models_are_self_consistent(run):
    for setup in _setups(run):
        m = setup.model
        if isinstance(m, Transformer):
            assert m.hidden % m.heads == 0 and m.heads % m.kv_heads == 0
            assert m.ffn >= m.hidden and m.layers > 0 and m.seq > 0 and m.vocab > 0
            assert m.mlp in ("gelu", "relu", "swiglu")
            assert (m.mlp == "swiglu") == (m.ffn != 4 * m.hidden)
        elif isinstance(m, ConvNet):
            assert len(m.image) == 3 and m.outputs > 0 and m.params
        elif isinstance(m, Parameters):
            assert m.count > 0 and run.kind == "sharded"
        else:
            assert isinstance(m, Collective) and run.kind == "collective"
            assert m.nbytes > 0 and m.algorithm in ("ring", "nvls", "default")


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_batches_divide_into_micro_batches_and_ranks(run):
    for setup in _setups(run):
        p = setup.parallel
        if p.global_batch is not None and p.micro_batch is not None:
            assert p.global_batch % (p.micro_batch * p.dp) == 0, (p.global_batch,
                                                                  p.micro_batch)
            if p.micro_batches is not None:
                assert p.global_batch == p.micro_batch * p.dp * p.micro_batches
        if (p.global_batch is None or p.micro_batch is None) and not isinstance(
                setup.model, (Collective, Parameters)):
            assert "not stated" in run.note.lower(), f"{run.id}: say which batch is unknown"


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_pipelines_sharding_and_recomputation_are_well_formed(run):
    for setup in _setups(run):
        p, m = setup.parallel, setup.model
        assert p.recompute in RECOMPUTE and p.zero in (0, 1, 2, 3)
        assert p.sharding in ("", "fsdp", "hsdp") and (not p.sharding or p.zero >= 2)
        assert p.precision in ("fp16", "bf16", "fp32")
        assert (p.pp > 1) == bool(p.schedule) or (p.pp == 1 and not p.balance)
        if p.balance:
            assert len(p.balance) == p.pp
        if p.interleave and p.interleave > 1:
            assert p.schedule == "interleaved" and m.layers % (p.pp * p.interleave) == 0
        if p.sequence_parallel:
            assert p.tp > 1


def test_a_pipeline_balance_covers_the_whole_model():
    totals = {}
    for run in RUNS:
        p = run.setup.parallel
        if p.balance:
            totals.setdefault(run.setup.model.name, set()).add(sum(p.balance))
    assert totals and all(len(t) == 1 for t in totals.values()), totals


# ------------------------------------------------------------------ the split
def test_the_split_is_a_partition_of_the_runs():
    fit, held = set(pr.FITTING), set(pr.HELD_OUT)
    assert len(fit) == len(pr.FITTING) and len(held) == len(pr.HELD_OUT)
    assert not fit & held
    assert fit | held == set(IDS)
    assert 0.4 <= len(held) / len(IDS) <= 0.6
    assert [r.id for r in pr.fitting()] == list(pr.FITTING)
    assert [r.id for r in pr.held_out()] == list(pr.HELD_OUT)


def test_the_frozen_split_is_the_one_its_rule_gives():
    assert pr.split_by_rule() == (pr.FITTING, pr.HELD_OUT)
    datetime.date.fromisoformat(pr.SPLIT_DATE)
    assert "sha256" in pr.SPLIT_RULE


def test_the_rule_does_not_look_at_values():
    # The same runs with other values split the same way.
    from dataclasses import replace
    shifted = [replace(r, value=r.value * 3.7) for r in RUNS]
    assert pr.split_by_rule(shifted) == pr.split_by_rule()


def test_both_sets_cover_every_kind_and_every_source_with_two_runs():
    for ids in (pr.FITTING, pr.HELD_OUT):
        assert {pr.by_id()[i].kind for i in ids} == set(pr.KINDS)
    sources = {}
    for run in RUNS:
        sources.setdefault(run.cite.ref, []).append(run.id)
    for ref, ids in sources.items():
        if len(ids) >= 2:
            assert set(ids) & set(pr.FITTING) and set(ids) & set(pr.HELD_OUT), ref


def test_the_in_sample_checks_are_in_neither_set():
    gpipe_m32 = [r for r in RUNS if r.cite.ref == "arXiv:1811.06965" and r.cite.where ==
                 "Table 2" and isinstance(r.setup.model, Transformer)
                 and r.setup.parallel.micro_batches == 32]
    megatron_8way = [r for r in RUNS if r.cite.ref == "arXiv:1909.08053"
                     and r.setup.parallel.tp == 8 and r.setup.parallel.dp == 1]
    identity = [r for r in RUNS if r.kind == "collective" and "/algbw" in r.metric]
    assert not gpipe_m32 and not megatron_8way and not identity


def test_the_table_prints_one_line_a_run_with_its_set():
    lines = pr.table()
    assert len(lines) == len(RUNS)
    assert sum(" held-out " in line for line in lines) == len(pr.HELD_OUT)
    assert sum(" fitting " in line for line in lines) == len(pr.FITTING)


# ------------------------------------------------------------------ transcription cross-checks
@pytest.mark.parametrize("run", [r for r in RUNS if r.id.startswith(("narayanan21", "mcore24-"))
                                 and r.columns], ids=lambda r: r.id)
def test_aggregate_and_utilisation_columns_agree_with_the_per_gpu_figure(run):
    gpus = run.setup.parallel.gpus
    assert run.value * gpus / 1000 == pytest.approx(_column(run, "aggregate PFLOP/s"), rel=0.01)
    peak = HARDWARE[run.setup.hardware].peak_tflops
    printed = _column(run, "% of peak") if run.id.startswith("narayanan") else _column(
        run, "MFU %")
    assert abs(100 * run.value / peak - printed) <= 1.0


@pytest.mark.parametrize("run", [r for r in RUNS if r.id.startswith("mlm20-")],
                         ids=lambda r: r.id)
def test_megatron_readme_tflops_are_its_iteration_times_with_recomputation(run):
    p = run.setup.parallel
    ms = run.value * 1000 if run.unit == "s" else _column(run, "iteration ms")
    flops = pr.megatron_flops(run.setup.model, p.global_batch, recompute=True)
    assert flops / (ms / 1000 * p.gpus) / 1e12 == pytest.approx(
        _column(run, "TFLOP/s per GPU"), rel=0.01)
    if run.baseline is not None:       # scaling: parameter ratio x time ratio / GPUs
        base_ms = {8: 1121, 16: 1076}[run.baseline.parallel.global_batch]
        scaling = _column(run, "parameters B") / 1.16 * base_ms / ms / p.gpus * p.dp
        assert scaling == pytest.approx(run.value, abs=0.003)


@pytest.mark.parametrize("run", [r for r in RUNS if r.id.startswith("korthikanti22-")
                                 and r.unit == "fraction of peak"], ids=lambda r: r.id)
def test_remembered_iteration_times_reproduce_the_verified_mfu(run):
    assert pr.implied_step_s(run) == pytest.approx(_column(run, "iteration s (memory)"),
                                                   rel=0.005)


@pytest.mark.parametrize("run", [r for r in RUNS if r.id.startswith("llama3-")],
                         ids=lambda r: r.id)
def test_llama3_rows_hold_16m_tokens_and_their_mfu(run):
    assert 16e6 <= _column(run, "tokens per batch (printed 16M)") <= 2 ** 24
    assert abs(100 * run.value / 989 - _column(run, "BF16 MFU %")) <= 1.0


@pytest.mark.parametrize("run", [r for r in RUNS if r.id.startswith("zero-")],
                         ids=lambda r: r.id)
def test_zero_memory_is_its_papers_formula(run):
    psi, nd, stage = run.setup.model.count, run.setup.parallel.dp, run.setup.parallel.zero
    k = run.setup.model.optimizer_bytes_per_param
    per_param = {1: 2 + 2 + k / nd, 2: 2 + (2 + k) / nd, 3: (2 + 2 + k) / nd}[stage]
    assert psi * per_param / 1e9 == pytest.approx(run.value, rel=0.02)


def test_implied_step_times_are_positive_where_a_megatron_count_applies():
    implied = {r.id: pr.implied_step_s(r) for r in RUNS}
    counted = [i for i, s in implied.items() if s is not None]
    assert len(counted) >= 20 and all(implied[i] > 0 for i in counted)
    assert implied["narayanan21-1.7b"] == pytest.approx(3.53, rel=0.01)
