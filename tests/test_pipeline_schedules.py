"""Pipeline schedules past 1F1B: orders on paper against torch.distributed.pipelining's,
the schedule language's checks, the formulas, and every schedule on real ranks against
one device and against the library's own schedule."""
import numpy as np
import pytest
from conftest import rank_processes

import parlab
from parlab import pipeline, pipeline_orders
from parlab.split import SplitConfig
from parlab.torch import pipeline_chunks, split

TOL = 1e-5
LIGHT = SplitConfig(sizes=(64,) + (48,) * 9 + (10,), batch_size=48, steps=3, lr=0.1)
CHUNKED = ("interleaved", "zb-h1", "dualpipev")


def _library_order(name, p, m, v):
    """The library's compute order per rank, read from its own generator (no ranks):
    (stage, "F" | "I" | "B" | "W", micro-batch); an overlapped F&B is its F then its B."""
    from torch.distributed.pipelining import schedules as lib
    cls = {"interleaved": lib.ScheduleInterleaved1F1B, "zb-h1": lib.ScheduleInterleavedZeroBubble,
           "dualpipev": lib.ScheduleDualPipeV}[name]
    sched = object.__new__(cls)
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = p, v, m
    sched.number_of_rounds = max(1, m // p)
    sched.microbatches_per_round = m // sched.number_of_rounds
    out = []
    for rank in range(p):
        row = []
        for a in (a for a in sched._calculate_single_rank_operations(rank) if a is not None):
            parts = a.sub_actions if a.computation_type.value == "OVERLAP_F_B" else (a,)
            row += [(x.stage_index, x.computation_type.value, x.microbatch_index) for x in parts]
        out.append(row)
    return out


def _ours_as_library(ops, p):
    chunks, placement = pipeline.layout(ops)
    out = []
    for d, stage in enumerate(ops):
        parts = [pipeline.op_parts(op) for op in stage]
        split_ = {(i, c) for k, i, c in parts if k == "W"}
        out.append([(pipeline.virtual_stage(d, c, p, placement),
                     "I" if k == "B" and (i, c) in split_ else k, i) for k, i, c in parts])
    return out


@pytest.mark.parametrize("name,v", [("interleaved", 2), ("interleaved", 3), ("zb-h1", 1),
                                    ("dualpipev", 2)])
def test_our_orders_are_the_library_s_orders(name, v):
    for p in (2, 3, 4):
        for m in (2 * p, 3 * p, 4 * p):
            ops = pipeline.make(name, p, m, v)
            assert _ours_as_library(ops, p) == _library_order(name, p, m, v), (p, m)


@pytest.mark.parametrize("name", ["1f1b", *CHUNKED])
def test_each_bubble_on_paper_is_its_formula(name):
    for p in (2, 3, 4, 6):
        for m in (2 * p, 4 * p):
            ops = pipeline.make(name, p, m, 2)
            pipeline.check(ops, p, m)
            paper = pipeline.bubble_share(pipeline.simulate(ops, p, m, 1.0, 2.0))
            if name == "dualpipev":      # no closed form with F and B not overlapped
                assert paper < pipeline_orders.bubble("zb-h1", p, m)
            else:
                assert paper == pytest.approx(pipeline_orders.bubble(name, p, m, v=2))


def test_memory_zb_h1_holds_p_everywhere_interleaving_and_the_v_hold_more():
    assert pipeline.peak_in_flight(pipeline_orders.zb_h1(4, 8)) == [4, 4, 4, 4]
    assert pipeline.peak_in_flight(pipeline_orders.interleaved_1f1b(4, 8, 2)) == [11, 9, 7, 5]
    assert pipeline.peak_in_flight(pipeline_orders.dualpipev(4, 8)) == [9, 9, 9, 9]
    assert pipeline.peak_in_flight(pipeline.one_f_one_b(4, 8)) == [4, 3, 2, 1]


def test_bad_schedules_and_settings_are_explained():
    # a W before its own B
    ops = pipeline.Schedule([[("F", 0, 0), ("W", 0, 0), ("B", 0, 0)]], chunks=1)
    with pytest.raises(ValueError, match="deadlocks: stage 0 waits at W0 for its own B0"):
        pipeline.check(ops, 1, 1)
    # two chunks: the missing pass named with its chunk
    ops = pipeline.Schedule([[("F", 0, 0), ("F", 0, 1), ("B", 0, 1)]], chunks=2)
    with pytest.raises(ValueError, match=r"device 0 chunk 0 must run .* missing \[\('B', 0\)\]"):
        pipeline.check(ops, 1, 1)
    # the V: stage 2 is device 1's chunk 1; device 1 runs B of stage 1 before it
    ops = pipeline.Schedule([[("F", 0, 0), ("F", 0, 1), ("B", 0, 1), ("B", 0, 0)],
                             [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)]],
                            chunks=2, placement="v")
    with pytest.raises(ValueError, match="deadlocks: device 0 chunk 1 waits at F0.1 for F0.1 on "
                                         "device 1 chunk 1; device 1 chunk 0 waits at B0.0 for "
                                         "B0.1 on device 1 chunk 1"):
        pipeline.check(ops, 2, 1)
    with pytest.raises(ValueError, match="at least as many micro-batches as stages"):
        pipeline_orders.dualpipev(4, 6)
    with pytest.raises(ValueError, match="must be a multiple of 4"):
        pipeline_orders.interleaved_1f1b(4, 6, 2)
    with pytest.raises(ValueError, match="placement must be one of"):
        pipeline.Schedule([], chunks=2, placement="zigzag")
    with pytest.raises(ValueError, match="schedule must be one of"):
        pipeline.make("zero-bubble", 2, 2)
    with pytest.raises(ValueError, match="8 virtual stages for a model of 4 linear layers"):
        pipeline_chunks.prepare(SplitConfig(batch_size=16), 4, 4, "interleaved")
    with pytest.raises(ValueError, match="covers linear layers"):
        pipeline_chunks.prepare(SplitConfig(model="cnn"), 2, 2, "zb-h1")


def test_pass_names_read_back():
    assert pipeline.pass_of("W3.1") == ("W", 3, 1) and pipeline.pass_of("F12") == ("F", 12)
    assert pipeline.pass_of("F1.x") is None and pipeline.pass_kind("W0") == "W"
    assert pipeline.pass_name("B", 2, 1, chunks=2) == "B2.1" and pipeline.pass_name("B", 2, 0) == "B2"


@pytest.fixture(scope="module")
def runs():
    """Every schedule by hand on 2 and on 4 ranks, then the library's, one launch each."""
    out = {}
    for p, m in ((2, 4), (4, 8)):
        plans = {name: pipeline_chunks.prepare(LIGHT, p, m, name) for name in ("1f1b", *CHUNKED)}
        out[p] = parlab.launch(pipeline_chunks.train_each, p, args=(plans, m),
                               kwargs={"library": CHUNKED}, timeout=300)
    assert not rank_processes(), "ranks left running"
    return out


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("name", ["1f1b", *CHUNKED])
def test_every_schedule_trains_as_one_device_by_hand_and_with_the_library(runs, p, name):
    ref = split.train_reference(LIGHT)
    results = runs[p].results
    losses = [x for r in results for x in r[name]["losses"]]
    np.testing.assert_allclose(losses, ref["losses"], atol=TOL)
    grads = {k: v for r in results for k, v in r[name]["first_grads"].items()}
    state = {k: v for r in results for k, v in r[name]["state"].items()}
    assert grads.keys() == ref["first_grads"].keys()
    for k, v in ref["first_grads"].items():
        np.testing.assert_allclose(grads[k], v, atol=TOL, err_msg=k)
        np.testing.assert_allclose(state[k], ref["state"][k], atol=TOL, err_msg=k)
    if name in CHUNKED:
        lib = {k: v for r in results for k, v in r[f"library {name}"]["grads"].items()}
        for k, v in ref["first_grads"].items():
            np.testing.assert_allclose(lib[k], v, atol=TOL, err_msg=f"library {k}")


@pytest.mark.parametrize("p", [2, 4])
def test_the_ranks_hold_and_send_what_the_schedule_says(runs, p):
    m = 4 if p == 2 else 8
    for name in ("1f1b", *CHUNKED):
        ops = pipeline.make(name, p, m, 2)
        held = [r[name]["peak_micro_batches"] for r in runs[p].results]
        assert held == pipeline.peak_in_flight(ops), name
        chunks, placement = pipeline.layout(ops)
        crossings = sum(pipeline.device_of(k, p, placement)[0] != pipeline.device_of(k + 1, p, placement)[0]
                        for k in range(p * chunks - 1))
        assert sum(r[name]["sends_per_step"] for r in runs[p].results) == 2 * m * crossings, name
