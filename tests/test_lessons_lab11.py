"""Lab 11's lessons and exercises: each check says "shown" on numbers that show its claim
and "not shown", with the reason, on planted numbers that contradict it; the functions
that read a run are checked on real runs of 4 ranks; the exercises' checks say what is
wrong with a wrong answer."""
import pytest
import torch

from parlab.course import lab11, lessons
from parlab.course.lab11_exercises import dispatch, kept


@pytest.fixture(scope="module")
def ep_run():
    cfg = lab11.config(d_ff=64)
    run = lab11.run_ep(cfg=cfg, batch_size=64, steps=3)
    return run, lab11.ep_reference(cfg, 64, 3), cfg


def test_a_real_expert_parallel_run_equals_one_device_and_its_bytes(ep_run):
    run, ref, cfg = ep_run
    eq = lab11.equivalence(run.results, ref)
    assert eq["same_routing"] and max(eq["loss"], eq["gradients"], eq["weights"]) < 1e-5
    rows = lab11.all_to_all_rows(run, cfg, 64)
    assert all(r["traced"] == r["formula"] > 0 for r in rows)
    assert sum(r["assignments"] for r in rows) == 3 * 64 * cfg.top_k
    work = lab11.expert_work(lab11.replayed(run), 4)
    assert len(work["compute"]) == 4 and all(t > 0 for t in work["compute"])
    assert lab11.plot_ep_step(run) is not None and lab11.plot_ep_step(run, measured=True)


def test_a_real_mesh_run_carries_its_formula_s_bytes_per_axis():
    rows = lab11.axis_rows(lab11.run_ep_dp())
    assert all(r["traced"] == r["formula"] for r in rows)
    assert lessons.evaluate("11.bytes_per_axis_match", {"axes": rows}).shown


def test_the_one_device_checks_read_their_numbers():
    m = {"baseline": 0.08, "accuracy": {0.0: 0.95, 0.1: 0.94}, "late": {0.0: 3.6, 0.1: 1.4},
         "empty": {0.0: 3, 0.1: 0}}
    assert lessons.evaluate("11.experts_learn", m).shown
    assert lessons.evaluate("11.balance_loss_evens_the_experts", m).shown
    v = lessons.evaluate("11.balance_loss_evens_the_experts", {**m, "late": {0.0: 2.0, 0.1: 1.6}})
    assert not v.shown and "2.00 without the loss, 1.60 with it" in v.figures
    v = lessons.evaluate("11.experts_learn", {**m, "accuracy": {0.0: 0.5, 0.1: 0.94}})
    assert not v.shown


def test_the_capacity_check_wants_no_drop_without_a_limit_and_more_drops_below():
    rows = [{"capacity_factor": None, "dropped_share": 0.0}] + [
        {"capacity_factor": f, "dropped_share": d} for f, d in ((2.0, 0.2), (1.0, 0.5), (0.5, 0.7))]
    assert lessons.evaluate("11.capacity_drops_tokens", {"rows": rows}).shown
    rows[2] = {"capacity_factor": 1.0, "dropped_share": 0.1}
    assert not lessons.evaluate("11.capacity_drops_tokens", {"rows": rows}).shown


def test_the_hot_rank_check_names_who_took_the_most_and_who_waited_least():
    m = {"all_to_all": [{"rank": r, "traced": 1, "formula": 1, "assignments": a,
                         "assignments_late": a}
                        for r, a in enumerate((100, 300, 900, 50))],
         "work": {"compute": [0.01, 0.02, 0.05, 0.005], "wait": [0.04, 0.03, 0.001, 0.05]},
         "equivalence": {"loss": 0, "gradients": 0, "weights": 0, "same_routing": True},
         "devices": 4}
    v = lessons.evaluate("11.hot_rank_sets_the_pace", m)
    assert v.shown and v.source.startswith("replayed on 4 dedicated devices")
    m["work"]["wait"] = [0.04, 0.0005, 0.001, 0.05]
    v = lessons.evaluate("11.hot_rank_sets_the_pace", m)
    assert not v.shown and v.why.startswith("rank 2 took the most tokens")
    assert lessons.evaluate("11.all_to_all_bytes_match", m).shown
    assert lessons.evaluate("11.ep_equals_one_device", m).shown


def test_the_exercise_checks_accept_the_references_and_name_mistakes(capsys):
    assert lab11.check_dispatch(dispatch) is dispatch
    assert lab11.check_capacity(kept) is kept
    assert capsys.readouterr().out.count("correct") == 2

    def unstable(experts_of, experts):
        order, counts, inverse = dispatch(experts_of, experts)
        return order.flip(0), counts, inverse

    def token_major(experts_of, experts, capacity):        # second choices too early
        mask, taken = torch.zeros_like(experts_of, dtype=torch.bool), [0] * experts
        for t in range(experts_of.shape[0]):
            for c in range(experts_of.shape[1]):
                e = int(experts_of[t, c])
                if taken[e] < capacity:
                    taken[e] += 1
                    mask[t, c] = True
        return mask

    assert lab11.check_dispatch(unstable) is dispatch
    assert "not grouped by expert" in capsys.readouterr().out
    assert lab11.check_capacity(token_major) is kept
    assert "first choices go before any second choice" in capsys.readouterr().out


def test_the_wait_check_compares_all_ranks_waiting_with_and_without_the_loss():
    m = {0.0: {"wait": [0.04, 0.004, 0.009, 0.03], "compute": [0.001] * 4,
               "assignments": [41, 826, 920, 261]},
         0.1: {"wait": [0.008, 0.002, 0.004, 0.008], "compute": [0.001] * 4,
               "assignments": [480, 604, 555, 409]}}
    v = lessons.evaluate("11.balance_loss_shortens_the_wait", m)
    assert v.shown and "x less" in v.figures and v.source.startswith("replayed on 4")
    m[0.1]["wait"] = [0.03, 0.01, 0.01, 0.02]
    assert not lessons.evaluate("11.balance_loss_shortens_the_wait", m).shown


def test_expert_parallelism_from_a_trained_router_routes_as_that_router_does():
    from parlab.torch import moe, training
    cfg = lab11.config(d_ff=64)
    trained = moe.build(cfg, seed=5)
    start = {k: v for k, v in training.state_numpy(trained).items()
             if k.startswith(("inp.", "moe.router."))}
    run = lab11.run_ep(cfg=cfg, batch_size=64, steps=1, start=start)
    x, _ = training.on_device(*next(training.digit_batches("mlp", 64)), "cpu")
    model = moe.build(cfg, seed=0)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in start.items()}, strict=False)
    _, _, per_expert = model(x)
    assert run.results[0]["per_expert"][0] == per_expert.tolist()


def test_the_experts_at_scale_say_what_the_lab_reads_from_them():
    """The text: spreading the experts cuts memory and the step (a rank averages and updates
    only its own experts), the all-to-alls grow with ep, only tp 2 fits 80 GB, on 16 GPUs,
    and there the all-to-alls take a larger share (predicted)."""
    rows = lab11.ep_at_scale()
    one_node = rows[:3]
    assert [r["gpus"] for r in rows] == [8, 8, 8, 16]
    assert rows[-1]["layout"] == "dp 8 × ep 8 × tp 2"
    for a, b in zip(one_node, one_node[1:]):
        assert b["memory"] < a["memory"] and b["step_s"] < a["step_s"]
        assert b["gradients_s"] < a["gradients_s"] and b["update_s"] < a["update_s"]
        assert b["all_to_all_s"] > a["all_to_all_s"]
    assert [r["memory"] <= 80e9 for r in rows] == [False, False, False, True]
    share = [r["all_to_all_s"] / r["step_s"] for r in rows]
    assert share[-1] == max(share) and share[0] == 0
