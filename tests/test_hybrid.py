"""Lab 07: hybrids on a 2 × 2 mesh equal one device; bytes per axis equal the formulas;
bad shapes are refused before any rank starts; the mesh-groups exercise says what is wrong."""
import pytest

import parlab
from parlab.course import lab07
from parlab.mesh import Grid
from parlab.metrics import identical, max_difference, merged
from parlab.split import SplitConfig
from parlab.torch import hybrid as hy
from parlab.torch import single
from parlab.torch import tensor_parallel as tp

TOL = 1e-5        # largest parameter difference from one device after STEPS steps
STEPS = 3
SIZES = hy.SIZES


def _per_step(timeline, rank):
    return {a: b / STEPS for a, b in timeline.bytes_by_axis(rank).items() if b}


def test_dp_by_tp_equals_one_device_and_moves_the_formula_bytes(no_leftover_ranks):
    run = lab07.run_hybrid({"dp": 2, "tp": 2}, global_batch=64, steps=STEPS, lr=0.1)
    ref = tp.dense_reference(SIZES, batch_size=64, steps=STEPS, lr=0.1)
    for pair in Grid(dp=2, tp=2).lines("tp"):                  # each tp pair holds a whole model
        whole = hy.dense_of_shards([run.results[r] for r in pair], SIZES, 2)
        assert max_difference(whole, ref["state"]) < TOL
    for line in Grid(dp=2, tp=2).lines("dp"):                  # replicas hold the same slices
        assert identical(run.results[r]["shards"] for r in line)
    want = hy.expected_dp_tp(SIZES, 64, dp=2, tp=2)
    assert want == {"tp": 4 * 32 * (256 + 10 + 256), "dp": 4 * hy.params_per_rank(SIZES, 2)}
    for rank in range(4):
        assert _per_step(run.timeline, rank) == want
    assert run.timeline.labels[3] == "rank 3 · dp 1 · tp 1"


def test_dp_by_pp_equals_one_device_and_moves_the_formula_bytes(no_leftover_ranks):
    run = lab07.run_hybrid({"dp": 2, "pp": 2}, global_batch=64, steps=STEPS, lr=0.1,
                        micro_batches=4, schedule="1f1b")
    ref = single.train_reference(SplitConfig(sizes=SIZES, batch_size=64, steps=STEPS, lr=0.1))
    for line in Grid(dp=2, pp=2).lines("pp"):                  # each pipeline: a whole model
        assert max_difference(merged(run.results[r] for r in line), ref["state"]) < TOL
    _, cfg, _ = lab07.check_hybrid({"dp": 2, "pp": 2}, global_batch=64, micro_batches=4)
    want = hy.expected_dp_pp(cfg, dp=2)
    cut = hy.mlp_boundary_width(SIZES, cfg.bounds[0])
    assert [w["pp"] for w in want] == [2 * 32 * cut * 4] * 2          # activations + gradients
    assert sum(w["dp"] for w in want) == 4 * sum(a * b + b for a, b in zip(SIZES, SIZES[1:]))
    for rank in range(4):
        assert _per_step(run.timeline, rank) == want[Grid(dp=2, pp=2).coords(rank)["pp"]]


def test_the_library_dtensor_with_fsdp_and_ddp_equals_one_device(no_leftover_ranks):
    run = lab07.run_hybrid_library({"dp": 2, "tp": 2}, global_batch=64, steps=STEPS, lr=0.1)
    ref = tp.dense_reference(SIZES, batch_size=64, steps=STEPS, lr=0.1)
    kinds = tp.layer_kinds(SIZES, 2, "column_row")
    for rank, res in enumerate(run.results):
        index = Grid(dp=2, tp=2).coords(rank)["tp"]
        hand = {n: tp.dense_slice(n, v, kinds[n], index, 2) for n, v in ref["state"].items()}
        for kind in ("fsdp", "ddp"):
            assert max_difference(res[kind]["state"], ref["state"]) < TOL
            assert max_difference(res[kind]["tp_slice"], hand) < TOL   # the hand-written slices
        # the DDP tutorial's way: it either works, or says why (torch 2.13: it does not)
        pg = res["ddp_process_group"]
        assert "error" in pg or max_difference(pg["state"], ref["state"]) < TOL


@pytest.mark.parametrize("shape,kwargs,message", [
    ({"dp": 3, "tp": 2}, {"devices": "4"}, r"dp 3 × tp 2 needs 3 × 2 = 6 ranks, but the world has 4"),
    ({"dp": 2, "tp": 4}, {"sizes": (64, 30, 10)}, r"does not split over tp=4: .*30 units"),
    ({"dp": 1, "tp": 4}, {"sizes": (64, 256, 256, 10, 10)}, r"output has 10 units"),
    ({"dp": 3, "tp": 1}, {"global_batch": 64}, r"global batch of 64 does not split over dp=3"),
    ({"dp": 2, "pp": 2}, {"global_batch": 64, "micro_batches": 5}, r"does not divide into 5"),
    ({"tp": 2, "dp": 2}, {}, r"data parallel first"),
    ({"dp": 0, "tp": 2}, {}, r"whole number >= 1"),
])
def test_bad_meshes_and_models_are_refused_before_any_rank_starts(shape, kwargs, message,
                                                                   monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("a rank was started")
    monkeypatch.setattr(lab07, "launch", no_launch)
    if kwargs.get("devices") == "4":
        kwargs = {**kwargs, "devices": parlab.devices(4)}
    with pytest.raises(ValueError, match=message):
        lab07.run_hybrid(shape, **kwargs)


def test_the_formulas_on_shapes_without_a_second_axis():
    assert hy.expected_dp_tp(SIZES, 64, dp=4, tp=1) == {"tp": 0, "dp": 4 * 116_618}
    assert hy.expected_dp_tp(SIZES, 64, dp=1, tp=4)["dp"] == 0
    assert hy.params_per_rank(SIZES, 1) == sum(a * b + b for a, b in zip(SIZES, SIZES[1:]))
    # every rank of a tp group holds its share: the shares add up to the whole, plus the
    # row layers' biases, which every rank keeps whole
    whole = hy.params_per_rank(SIZES, 1)
    assert 4 * hy.params_per_rank(SIZES, 4) == whole + 3 * (256 + 10)


# ------------------------------------------------------------------ the exercise
def _swap(fn, a, b):
    def swapped(shape):
        g = fn(shape)
        g[a], g[b] = g[b], g[a]
        return g
    return swapped


def test_mesh_groups_check_accepts_the_reference_on_real_ranks(capsys, no_leftover_ranks):
    def mine(shape):
        return {a: [list(line) for line in Grid(**shape).lines(a)] for a in shape}
    assert lab07.check_mesh_groups(mine) is mine
    assert "correct for 4 meshes" in capsys.readouterr().out


def test_mesh_groups_check_says_what_is_wrong(capsys, no_leftover_ranks):
    ref = lab07.mesh_groups_reference
    # tp and dp swapped: a valid partition, so it also runs on ranks and sums the wrong lines
    assert lab07.check_mesh_groups(_swap(ref, "tp", "dp")) is ref
    out = capsys.readouterr().out
    assert "your tp groups are the dp groups: the last axis (tp) varies fastest" in out
    assert "on real ranks" in out and "tp all-reduce summed ranks [0, 2] = 2" in out

    def unnamed(shape):
        return list(ref(shape).values())

    def missing_rank(shape):
        g = ref(shape)
        g["dp"] = g["dp"][:-1]
        return g

    def reversed_lines(shape):
        g = ref(shape)
        g["tp"] = [line[::-1] for line in g["tp"]]
        return g

    def not_attempted(shape):
        raise NotImplementedError

    for fn, words in ((unnamed, "return a dict with one list of groups per axis"),
                      (missing_rank, "in no group"),
                      (reversed_lines, "wrong order"),
                      (not_attempted, "not attempted yet")):
        assert lab07.check_mesh_groups(fn) is ref
        out = capsys.readouterr().out
        assert words in out, out
        assert "all-reduce summed" not in out          # no launch needed to say so


# ------------------------------------------------------------------ the figures
def test_timeline_colours_transfers_by_mesh_axis():
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.colors import to_hex

    from parlab import plot
    from parlab.trace import COMM, COMPUTE, Span, Timeline
    tl = Timeline([Span(0, COMPUTE, "forward", 0.0, 1.0), Span(0, COMM, "all_reduce", 1.0, 2.0, 8, axis="tp"),
                   Span(0, COMM, "dp all_reduce", 2.0, 3.0, 8, axis="dp"),
                   Span(1, COMM, "send", 0.0, 1.0, 8, axis="pp"), Span(1, COMM, "wait sends", 1.0, 2.0)])
    fig = plot.timeline(tl, color_by="axis")
    leg = fig.axes[0].get_legend()
    colors = {t.get_text(): to_hex(h.get_facecolor()) for t, h in zip(leg.get_texts(), leg.legend_handles)}
    assert list(colors)[:4] == ["compute", "transfer: tp", "transfer: pp", "transfer: dp"]
    assert colors["transfer: no axis"] not in {colors[f"transfer: {a}"] for a in ("tp", "pp", "dp")}
    for axis in ("tp", "pp", "dp"):
        assert colors[f"transfer: {axis}"] == plot.AXIS_COLORS[axis].lower()
    bars = {to_hex(p.get_facecolor()) for p in fig.axes[0].patches}
    assert {c.lower() for c in plot.AXIS_COLORS.values()} <= bars     # every axis drawn in its colour
    # compute, wait and idle keep colours of their own (tp keeps the course's transfer orange)
    kinds = {plot.COLORS[k].lower() for k in ("compute", "wait", "idle")}
    assert not {c.lower() for c in plot.AXIS_COLORS.values()} & kinds
