"""Lab 10's lessons and exercises: each check says "shown" on numbers that show its claim
and "not shown", with the reason, on planted numbers that contradict it; the functions
that read a run are checked on a real run of 2 ranks; the exercises' checks say what is
wrong with a wrong answer."""
import numpy as np
import pytest
import torch

from parlab.course import lab10, lab10_exercises, lab10_scale, lessons
from parlab.course.lab10_exercises import merge_partials, sp_mlp
from parlab.torch import comm
from parlab.torch.transformer import GPTConfig

SMALL = GPTConfig(vocab=64, seq_len=32, d_model=32, heads=2, layers=2)


@pytest.fixture(scope="module")
def small_run():
    run = lab10.run_strategies(devices=_two(), cfg=SMALL, batch_size=2, steps=3)
    ref = lab10.reference(SMALL, batch_size=2, steps=3)
    return run, ref


def _two():
    import parlab
    return parlab.devices(2)


def test_every_split_of_a_real_run_equals_one_device_and_its_formula(small_run):
    run, ref = small_run
    m = lab10.strategy_numbers(run, ref)
    assert set(m["equivalence"]) == {"tp", "sp", "cp_contiguous", "cp_zigzag", "library"}
    assert m["equivalence"]["library"]["weights"] is None          # one step, no weights
    assert lessons.evaluate("10.strategies_equal_one_device", m).shown
    for name, row in m["comm"].items():
        assert row["traced"] == row["formula"], name
    assert m["comm"]["tp"]["sent"] > 0
    assert 0 < m["comm"]["cp_zigzag"]["sent"] < m["comm"]["cp_zigzag"]["traced"]
    assert lessons.evaluate("10.bytes_match_formulas", m).shown
    saved = m["memory"]["saved"]
    assert saved["tp"] - saved["sp"] == pytest.approx(m["memory"]["norms_region"] / 2, rel=1e-6)
    assert saved["one device"] > saved["tp"] > saved["sp"] > saved["cp_zigzag"]
    assert lessons.evaluate("10.sp_cuts_activation_memory", m).shown
    assert set(m["work"]) == {"contiguous", "zigzag"}
    assert all(len(v) == 2 for v in m["work"].values())
    assert all(t > 0 for v in m["work"].values() for t in v)


def test_the_figures_of_a_run_draw(small_run):
    run, _ = small_run
    work = lab10.attention_work(lab10.replayed(run), run)
    assert lab10.plot_attention_work(work) is not None
    assert lab10.plot_ring(run) is not None and lab10.plot_ring(run, measured=True) is not None
    assert lab10.plot_steps(run) is not None and lab10.plot_steps(run, measured=True) is not None
    rows = lab10.memory_table(run, small_run[1])
    assert set(rows) == {"one device", "tp", "sp", "cp_zigzag"}
    for row in rows.values():     # the cost model's count, within test_sim_context's 10 %
        assert row["predicted"] == pytest.approx(row["measured"], rel=0.10), row
    assert lab10.plot_memory(rows) is not None


def test_the_paper_s_count_splits_all_but_the_norms_region_under_tensor_parallelism():
    one = lab10.paper_block_bytes(SMALL, 2, t=1)
    assert one["tp"] == pytest.approx(one["one device"]) == pytest.approx(one["sp"])
    four = lab10.paper_block_bytes(SMALL, 2, t=4)
    sbh = SMALL.seq_len * 2 * SMALL.d_model
    assert four["tp"] - four["sp"] == pytest.approx(10 * sbh * (1 - 1 / 4))
    assert four["sp"] == pytest.approx(one["one device"] / 4)


def numbers(**over):
    base = {"equivalence": {"tp": {"loss": 1e-6, "logits": 1e-6, "gradients": 1e-8,
                                   "weights": 1e-7},
                            "library": {"loss": 1e-6, "logits": 1e-6, "gradients": 1e-8,
                                        "weights": None}},
            "comm": {"tp": {"traced": 100.0, "formula": 100}, "cp_zigzag": {"traced": 50.0,
                                                                              "formula": 50}},
            "memory": {"saved": {"one device": 100, "tp": 40, "sp": 25, "cp_zigzag": 20},
                       "norms_region": 20, "devices": 4},
            "work": {"contiguous": [1.0, 2.0, 3.0, 4.0], "zigzag": [2.5, 2.5, 2.6, 2.55]},
            "devices": 4}
    base.update(over)
    return base


def test_the_checks_show_their_claims_on_numbers_that_show_them():
    for name in ("10.strategies_equal_one_device", "10.bytes_match_formulas",
                 "10.sp_cuts_activation_memory", "10.zigzag_balances_the_ring"):
        v = lessons.evaluate(name, numbers())
        assert v.shown, v
    v = lessons.evaluate("10.zigzag_balances_the_ring", numbers())
    assert v.source.startswith("replayed on 4 dedicated devices")
    assert "contiguous 4.00x" in v.figures and "zigzag 1.04x" in v.figures


def test_the_checks_say_why_on_numbers_that_contradict_them():
    bad = numbers(equivalence={"sp": {"loss": 3e-5, "logits": 0, "gradients": 0, "weights": 0}})
    v = lessons.evaluate("10.strategies_equal_one_device", bad)
    assert not v.shown and v.why.startswith("sp differ from one device")
    v = lessons.evaluate("10.bytes_match_formulas",
                         numbers(comm={"tp": {"traced": 104.0, "formula": 100}}))
    assert not v.shown and v.why == "tp off the formula"
    v = lessons.evaluate("10.sp_cuts_activation_memory", numbers(
        memory={"saved": {"one device": 100, "tp": 40, "sp": 35, "cp_zigzag": 20},
                "norms_region": 20, "devices": 4}))
    assert not v.shown
    v = lessons.evaluate("10.zigzag_balances_the_ring",
                         numbers(work={"contiguous": [1, 2, 3, 4], "zigzag": [2, 2, 2, 2.4]}))
    assert not v.shown and "zigzag 1.20x" in v.figures
    v = lessons.evaluate("10.zigzag_balances_the_ring",
                         numbers(work={"contiguous": [1, 1.2, 1.5, 1.9], "zigzag": [2, 2, 2, 2]}))
    assert not v.shown and "contiguous 1.90x" in v.figures
    v = lessons.evaluate("10.zigzag_balances_the_ring",
                         numbers(work={"contiguous": [0, 2, 3, 4], "zigzag": [2, 2, 2, 2]}))
    assert not v.shown and v.why == "a rank ran no attention tile"


def test_the_model_learns_check_reads_the_baseline():
    assert lessons.evaluate("10.model_learns", {"held_out": 2.0, "unigram": 3.6,
                                                "uniform": 4.8}).shown
    v = lessons.evaluate("10.model_learns", {"held_out": 3.3, "unigram": 3.6, "uniform": 4.8})
    assert not v.shown and "held-out 3.30" in v.figures


# ------------------------------------------------------------------ exercises
def test_the_merge_check_accepts_the_reference_and_names_each_mistake(capsys):
    assert lab10.check_merge(merge_partials) is merge_partials
    assert "correct" in capsys.readouterr().out

    def averaged(out_a, lse_a, out_b, lse_b):
        return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)

    def overflowing(out_a, lse_a, out_b, lse_b):
        sa, sb = torch.exp(lse_a), torch.exp(lse_b)
        return ((sa.unsqueeze(-1) * out_a + sb.unsqueeze(-1) * out_b) / (sa + sb).unsqueeze(-1),
                torch.log(sa + sb))

    def unfilled(*args):
        raise NotImplementedError

    for fn, said in ((averaged, "you averaged the two outputs"),
                     (overflowing, "large scores: the output has inf or NaN"),
                     (unfilled, "not attempted yet")):
        assert lab10.check_merge(fn) is merge_partials
        assert said in capsys.readouterr().out


def test_the_sp_mlp_check_runs_on_ranks_and_names_the_missing_collective(capsys):
    assert lab10.check_sp_mlp(sp_mlp, world_size=2) is sp_mlp
    assert "correct: on 2 real ranks" in capsys.readouterr().out

    def all_reduced(x_part, fc1, fc2, group=None):      # tensor parallel, not sequence
        whole = torch.cat(comm.all_gather(x_part.contiguous(), group=group), dim=0)
        return comm.all_reduce(fc2(torch.nn.functional.gelu(fc1(whole))), group=group)

    assert lab10.check_sp_mlp(all_reduced, world_size=2) is sp_mlp
    assert "every rank returned every position" in capsys.readouterr().out


def test_the_sp_mlp_reference_equals_the_whole_mlp_on_one_rank():
    import parlab
    out = parlab.launch(lab10_exercises._mlp_ranks, 1, args=(sp_mlp,), timeout=60)
    got = out.results[0]
    np.testing.assert_allclose(got["got"], got["want"], atol=1e-5)


def test_the_ring_at_scale_says_what_the_lab_reads_from_it():
    """The text: at 1,024 and 4,096 tokens a pass outlasts the attention beside it and the
    ranks wait; from 16,384 on it hides completely (predicted, ``sim.hybrid``)."""
    rows = {r["seq"]: r for r in lab10.ring_at_scale()}
    for seq in (1024, 4096):
        assert rows[seq]["pass_s"] > rows[seq]["beside_s"] and rows[seq]["waited_s"] > 0
    for seq in (16384, 65536):
        assert rows[seq]["pass_s"] < rows[seq]["beside_s"] and rows[seq]["waited_s"] == 0


def test_the_ring_figure_shows_the_waits_the_text_names():
    """The text: at 4,096 tokens rank 0 waits for each pass of a block's forward (cp 4: 3
    passes), at 16,384 never; each panel one block, predicted."""
    for seq, waits in ((4096, 3), (16384, 0)):
        block = lab10_scale.ring_block(seq)
        assert block.predicted and len(block.ranks) == 2
        assert len([s for s in block.spans if s.name == "K/V pass"]) == 3
        assert len([s for s in block.spans if s.rank == 0 and s.name == "wait for K/V"
                    and s.end > s.start]) == waits
    fig = lab10.plot_ring_at_scale()
    assert len(fig.axes) == 2
