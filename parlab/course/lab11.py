"""Lab 11 (labs/11_mixture_of_experts.ipynb): a mixture of experts on the digits, its
router and balance loss on one device, expert parallelism over a traced all-to-all, a hot
expert on the replayed timeline, experts × data parallel on a mesh, and MoE runs at scale
predicted; what its notebook runs, its lessons and its exercises."""
from __future__ import annotations

from dataclasses import replace

from ..launcher import LaunchResult, launch
from ..metrics import largest_difference
from . import lessons, replays
from .lab11_exercises import check_capacity, check_dispatch  # noqa: F401 (lab11.check_...)
from .replays import replayed  # noqa: F401 (lab11.replayed: a run on dedicated devices)

TOL = 1e-5
BATCH, STEPS = 256, 4       # expert parallelism: 64 digits a rank, 4 SGD steps
LEARNS = 0.8                # lesson 11.experts_learn: test accuracy at least this
EVEN = 1.8                  # lesson 11.balance_loss_evens_the_experts: late busiest/mean
EVENER = 1.5                # ... and at least this much below the run without the loss
DROPS = 0.25                # lesson 11.capacity_drops_tokens: dropped at capacity factor 1
WAIT_LESS = 1.5             # lesson 11.balance_loss_shortens_the_wait: all ranks' waiting


def config(**over):
    """The mixture of the lab: the digits in, width 128, 8 experts of 2048 hidden units,
    top 2 (``moe.MoEConfig``); experts this wide make their work, not a call's fixed
    cost, what a rank spends its time on."""
    from ..torch.moe import MoEConfig
    return replace(MoEConfig(d_ff=2048), **over)


# ------------------------------------------------------------------ one device
def learn(steps: int = 100) -> dict:
    """The mixture trained on one device without and with the balance loss (weight 0.1)
    (``moe_runs.balance_over_training``)."""
    from ..torch.moe_runs import balance_over_training
    return balance_over_training(steps=steps)


def learn_numbers(out: dict) -> dict:
    """What the lessons on one device read: accuracy, the late imbalance (mean of the
    last 10 steps' busiest expert over the mean) and the experts left empty at the end."""
    weights = [w for w in out if w != "baseline"]
    return {"baseline": out["baseline"],
            "accuracy": {w: out[w]["test_accuracy"] for w in weights},
            "late": {w: sum(out[w]["imbalance"][-10:]) / len(out[w]["imbalance"][-10:])
                     for w in weights},
            "empty": {w: sum(c == 0 for c in out[w]["per_expert"][-1]) for w in weights}}


def plot_balance(out: dict):
    """The busiest expert's tokens over the mean, step by step, with and without the loss."""
    from .. import plot
    series = {}
    for w in (w for w in out if w != "baseline"):
        imb = out[w]["imbalance"]
        label = "no balance loss" if w == 0 else f"balance loss, weight {w:g}"
        series[label] = (range(1, len(imb) + 1), imb)
    return plot.curves(series, xlabel="Adam step", ylabel="busiest expert / mean", smooth=5,
                       title="the balance loss evens out the experts' tokens "
                             "(measured, one device)")


def sweep(balance_weight: float = 0.0):
    """Capacity factors applied to a router trained with the balance loss at
    ``balance_weight`` (by default none: an uneven router) (``moe_runs.capacity_sweep``)."""
    from ..torch.moe_runs import BALANCE_CFG, capacity_sweep
    return capacity_sweep(replace(BALANCE_CFG, aux_weight=balance_weight))


def plot_capacity(rows):
    from .. import plot
    limited = [r for r in rows if r["capacity_factor"] is not None]
    xs = [r["capacity_factor"] for r in limited]
    return plot.curves({"assignments dropped": (xs, [r["dropped_share"] for r in limited]),
                        "test accuracy": (xs, [r["test_accuracy"] for r in limited])},
                       xlabel="capacity factor", ylabel="share", points=True,
                       title="a lower capacity drops more of an uneven router's tokens "
                             "(measured)")


# ------------------------------------------------------------------ expert parallelism
def run_ep(*, devices=None, cfg=None, batch_size: int = BATCH, steps: int = STEPS,
           start=None, timeout: float = 240.0) -> LaunchResult:
    """Expert parallelism on 4 ranks (``moe.train_ep``): 2 experts a rank; ``start``:
    weights to begin from (e.g. a trained router)."""
    from ..torch import moe
    n = devices.n if devices is not None else 4
    return launch(moe.train_ep, n, args=(cfg or config(), batch_size, steps),
                  kwargs={"start": start}, timeout=timeout, devices=devices)


def run_trained_routers(learned: dict, *, devices=None, steps: int = 8) -> dict:
    """Expert parallelism (the lab's wide experts) routed by each router ``learn``
    trained, without and with the balance loss, ``steps`` steps each (the more, the
    likelier an undisturbed one): {weight: run}."""
    return {w: run_ep(devices=devices, steps=steps, start=learned[w]["router"])
            for w in learned if w != "baseline"}


def wait_numbers(runs: dict) -> dict:
    """Per router: each rank's replayed seconds of waiting and of expert work in its
    least disturbed step after the first (the step whose ranks waited least in all: a
    busy machine only ever adds to a replayed span), and the assignments each rank's
    experts took over the steps after the first."""
    out = {}
    for w, run in runs.items():
        tl, n = replays.replayed(run), len(run.results)
        steps = [_per_rank(tl.window(a, b), n) for a, b in tl.step_windows("forward", 0)[1:]]
        least = min(steps, key=lambda step: sum(step["wait"]))
        out[w] = {**least, "assignments": [r["assignments_late"] for r in all_to_all_rows(run)]}
    return out


def ep_reference(cfg=None, batch_size: int = BATCH, steps: int = STEPS) -> dict:
    from ..torch import moe
    return moe.train_reference(cfg or config(), batch_size, steps)


def equivalence(results, ref: dict) -> dict:
    """The largest difference to one device over every rank: losses, the first step's
    gradients and the final weights (each rank's experts and the replicated weights)."""
    grads, weights = [], []
    for res in results:
        grads += [(g, ref["first_grads"][k]) for k, g in res["first_grads"].items()]
        weights += [(w, ref["weights"][k]) for k, w in res["weights"].items()]
    return {"loss": largest_difference((r["losses"], ref["losses"]) for r in results),
            "gradients": largest_difference(grads), "weights": largest_difference(weights),
            "same_routing": all(r["per_expert"] == ref["per_expert"] for r in results)}


def all_to_all_rows(run: LaunchResult, cfg=None, batch_size: int = BATCH) -> list[dict]:
    """Per rank: the bytes it handed to all-to-alls over the run (traced) and what the
    steps' routing implies (``moe.expected_all_to_all_bytes``), and the assignments its
    experts took (in all, and in the steps after the first: "assignments_late")."""
    from ..torch.moe import expected_all_to_all_bytes
    cfg, n = cfg or config(), len(run.results)
    local = cfg.experts // n
    rows = []
    steps = run.results[0]["per_expert"]
    for rank in range(n):
        traced = sum(s.bytes for s in run.timeline.spans if s.rank == rank
                     and s.kind == "comm" and "all_to_all" in s.name)
        want = sum(expected_all_to_all_bytes(cfg, batch_size // n, step, rank, n)
                   for step in steps)
        took = [sum(step[rank * local:(rank + 1) * local]) for step in steps]
        rows.append({"rank": rank, "traced": traced, "formula": want,
                     "assignments": sum(took), "assignments_late": sum(took[1:])})
    return rows


def _per_rank(part, n: int) -> dict:
    """Each rank's seconds of its experts' work (spans "expert e") and of waiting in
    ``part`` (a window of a timeline)."""
    out = {"compute": [0.0] * n, "wait": [0.0] * n}
    for s in part.spans:
        if s.name.startswith("expert "):
            out["compute"][s.rank] += s.duration
        elif s.kind == "wait":
            out["wait"][s.rank] += s.duration
    return out


def expert_work(tl, n: int) -> dict:
    """Per rank, over the steps after the first (the first warms up): seconds of its
    experts' work and of waiting, read from ``tl`` (a replay: each span's CPU time, the
    waits recomputed on dedicated devices)."""
    steps = tl.step_windows("forward", 0)
    return _per_rank(tl.window(steps[1][0] if len(steps) > 1 else tl.start, tl.end), n)


def plot_ep_step(run: LaunchResult, *, measured: bool = False):
    """The last step of expert parallelism, one lane per rank, replayed on dedicated
    devices (``measured``: as this machine ran it); each expert's work in its colour."""
    from .. import plot
    tl = run.timeline if measured else replays.replayed(run)
    step = tl.step(-1)
    shown = replays.lanes_named(step, {r: f"rank {r}" for r in step.ranks})
    title = ("the same step as this machine ran it (measured)" if measured else
             "the rank with the busiest experts sets the pace (replayed on dedicated devices)")
    return plot.timeline(shown, color_by="name", names=False,
                         order=tuple(f"expert {e}" for e in range(8)), title=title)


def run_ep_dp(*, cfg=None, batch_size: int = 64, steps: int = 3, timeout: float = 240.0):
    """Experts over 2 ranks × data parallel over 2, on a 2 × 2 mesh
    (``moe_runs.train_ep_dp``)."""
    from ..torch import moe_runs
    cfg = cfg or config(d_ff=256)
    moe_runs.check_ep_dp(cfg, 4, batch_size, 2, 2)
    return launch(moe_runs.train_ep_dp, 4, kwargs=dict(cfg=cfg, batch_size=batch_size,
                                                       steps=steps), timeout=timeout)


def axis_rows(run: LaunchResult, cfg=None) -> list[dict]:
    """Per rank: traced bytes per mesh axis against ``moe_runs.expected_bytes_per_axis``."""
    from ..torch.moe_runs import expected_bytes_per_axis
    cfg = cfg or config(d_ff=256)
    steps = len(run.results[0]["routing"])
    rows = []
    for rank in range(len(run.results)):
        want: dict = {}
        for step in range(steps):
            routing = [res["routing"][step] for res in run.results]
            for axis, b in expected_bytes_per_axis(cfg, routing, rank).items():
                want[axis] = want.get(axis, 0) + b
        got = {a or "world": b for a, b in run.timeline.bytes_by_axis(rank).items() if b}
        rows.append({"rank": rank, "traced": got, "formula": want})
    return rows


def ep_at_scale() -> list[dict]:
    """PREDICTED (``sim.hybrid`` and ``sim.memory``): Mixtral 8x7B's shape (8 experts, 2 a
    token, 4,096 tokens a sequence) on 8 sequences a step: data parallel over 8 H100s with
    the experts spread over ep of them, then tp 2 over two nodes, where each all-to-all
    leaves NVLink for InfiniBand. Per layout: the step, rank 0's gradient averaging (dense
    and experts'), its update, its all-to-alls, its memory."""
    from .. import sim
    net = sim.Network.llama("Mixtral 8x7B", 32, 4096, 32, 4096, 32000, kv_heads=8, ffn=14336,
                            experts=8, top_k=2)
    rows = []
    for nodes, shape in ((1, {"ep": 1}), (1, {"ep": 2}), (1, {"ep": 8}), (2, {"ep": 8, "tp": 2})):
        tl = sim.hybrid(net, sim.h100_nodes(nodes), 8, dp=8, **shape)
        comm = {axis: sum(s.end - s.start for s in tl.spans
                          if s.rank == 0 and s.axis in axes and s.kind == "comm")
                for axis, axes in (("ep", ("ep",)), ("dp", ("dp", "edp")))}
        rows.append({"layout": " × ".join(f"{k} {v}" for k, v in {"dp": 8, **shape}.items()),
                     "gpus": 8 * shape.get("tp", 1), "step_s": tl.step_s,
                     "all_to_all_s": comm["ep"], "gradients_s": comm["dp"],
                     "update_s": tl.seconds_by_name(0)["update"],
                     "memory": sim.memory(net, 8, dp=8, **shape).total})
    return rows


def print_ep_at_scale() -> None:
    print("PREDICTED: Mixtral 8x7B's shape, 8 sequences of 4,096 tokens a step, H100 nodes "
          "of 8 (parlab.sim.hybrid, parlab.sim.memory)")
    print(f"{'layout':<20}{'GPUs':>5}{'step':>9}{'averaging':>12}{'update':>9}{'all-to-alls':>13}"
          f"{'share':>7}{'memory a GPU':>14}")
    for r in ep_at_scale():
        print(f"{r['layout']:<20}{r['gpus']:>5}{r['step_s'] * 1e3:>6.0f} ms"
              f"{r['gradients_s'] * 1e3:>9.0f} ms{r['update_s'] * 1e3:>6.0f} ms"
              f"{r['all_to_all_s'] * 1e3:>10.1f} ms{r['all_to_all_s'] / r['step_s']:>7.1%}"
              f"{r['memory'] / 1e9:>11.0f} GB")


def print_at_scale() -> None:
    """PREDICTED: published MoE runs as the cost model prices them (``sim.experts``),
    each row followed by its sources and what the model leaves out."""
    import textwrap

    from ..sim import experts
    for line in experts.lines():
        indent = " " * (len(line) - len(line.lstrip()))
        print(textwrap.fill(line, 100, initial_indent="", subsequent_indent=indent + "  ")
              if len(line) > 100 and indent else line)


# ------------------------------------------------------------------ lessons
def _learn_experiment() -> dict:
    return learn_numbers(learn())


@lessons.lesson("11.experts_learn",
                f"the mixture of experts classifies the digits: test accuracy at least "
                f"{LEARNS:g}, with and without the balance loss",
                _learn_experiment)
def experts_learn(m: dict):
    acc = m["accuracy"]
    figures = (", ".join(f"weight {w:g}: {a:.3f}" for w, a in acc.items())
               + f" test accuracy; the commonest digit alone {m['baseline']:.3f}")
    return all(a >= LEARNS for a in acc.values()), figures, "a run did not learn the digits"


@lessons.lesson("11.balance_loss_evens_the_experts",
                f"with the balance loss the busiest expert ends within {EVEN:g}x of the mean "
                f"tokens, at least {EVENER:g}x closer than without it, and no expert is left "
                "empty",
                _learn_experiment)
def balance_loss_evens_the_experts(m: dict):
    late, empty = m["late"], m["empty"]
    off, on = late[0.0], max(late[w] for w in late if w > 0)
    figures = (f"busiest expert / mean over the last 10 steps: {off:.2f} without the loss, "
               f"{on:.2f} with it; experts left empty {empty[0.0]} and "
               f"{max(empty[w] for w in empty if w > 0)}")
    shown = on <= EVEN and off >= EVENER * on and all(empty[w] == 0 for w in empty if w > 0)
    return shown, figures, "the loss did not even the experts out here"


def _capacity_experiment() -> dict:
    return {"rows": [{k: r[k] for k in ("capacity_factor", "dropped_share")} for r in sweep()]}


@lessons.lesson("11.capacity_drops_tokens",
                f"with no capacity limit no assignment is dropped; the lower the capacity "
                f"factor, the more an uneven router drops: at factor 1, at least "
                f"{DROPS:.0%}", _capacity_experiment)
def capacity_drops_tokens(m: dict):
    rows = m["rows"]
    free = [r["dropped_share"] for r in rows if r["capacity_factor"] is None]
    limited = sorted((r for r in rows if r["capacity_factor"] is not None),
                     key=lambda r: -r["capacity_factor"])
    shares = [r["dropped_share"] for r in limited]
    at_one = next(r["dropped_share"] for r in limited if r["capacity_factor"] == 1.0)
    figures = ("dropped: " + ", ".join(f"{r['capacity_factor']:g} {r['dropped_share']:.0%}"
                                       for r in limited) + f"; no limit {free[0]:.0%}")
    shown = (free == [0.0] and all(a <= b for a, b in zip(shares, shares[1:]))
             and at_one >= DROPS)
    return shown, figures, "the drops do not follow the capacity"


def _ep_experiment() -> dict:
    run = run_ep()
    return ep_numbers(run, ep_reference())


def ep_numbers(run: LaunchResult, ref: dict, replay=None) -> dict:
    """What the lessons on expert parallelism read from a run and its reference."""
    tl = replay if replay is not None else replays.replayed(run)
    return {"equivalence": equivalence(run.results, ref), "all_to_all": all_to_all_rows(run),
            "work": expert_work(tl, len(run.results)), "devices": len(run.results)}


@lessons.lesson("11.ep_equals_one_device",
                f"expert parallelism trains exactly as one device: every expert takes the "
                f"same tokens, and losses, gradients and weights agree within {TOL:g}",
                _ep_experiment)
def ep_equals_one_device(m: dict):
    eq = m["equivalence"]
    worst = max(eq["loss"], eq["gradients"], eq["weights"])
    figures = (f"largest difference {worst:.1e}; the same routing as one device: "
               f"{eq['same_routing']}")
    return worst <= TOL and eq["same_routing"], figures, "the split changed the training"


@lessons.lesson("11.all_to_all_bytes_match",
                "each rank's all-to-all bytes are what its routing implies, to the byte: "
                "its tokens out and its experts' rows back, forward and backward",
                _ep_experiment)
def all_to_all_bytes_match(m: dict):
    rows = m["all_to_all"]
    figures = ", ".join(f"rank {r['rank']} {r['traced']:,} ({r['formula']:,})" for r in rows)
    off = [r["rank"] for r in rows if r["traced"] != r["formula"]]
    return not off, figures + " bytes, traced (formula)", f"ranks {off} off the formula"


@lessons.lesson("11.hot_rank_sets_the_pace",
                "the rank whose experts take the most tokens computes longest and waits "
                "least; the others wait for it",
                _ep_experiment)
def hot_rank_sets_the_pace(m: dict):
    rows, work = m["all_to_all"], m["work"]
    hot = max(rows, key=lambda r: r["assignments_late"])["rank"]
    longest = max(range(len(work["compute"])), key=work["compute"].__getitem__)
    least = min(range(len(work["wait"])), key=work["wait"].__getitem__)
    figures = ("assignments " + ", ".join(str(r["assignments_late"]) for r in rows)
               + "; experts' work " + ", ".join(f"{t * 1e3:.1f}" for t in work["compute"])
               + " ms; waiting " + ", ".join(f"{t * 1e3:.1f}" for t in work["wait"])
               + " ms (ranks 0-3, steps after the first)")
    return (hot == longest == least, figures,
            f"rank {hot} took the most tokens, rank {longest} computed longest, rank {least} "
            "waited least", f"replayed on {m['devices']} dedicated devices, each span's CPU time")


def _wait_experiment() -> dict:
    return wait_numbers(run_trained_routers(learn()))


@lessons.lesson("11.balance_loss_shortens_the_wait",
                f"routed by the router trained with the balance loss, the ranks wait at "
                f"least {WAIT_LESS:g}x less in all in a step than routed by the one trained "
                "without it",
                _wait_experiment)
def balance_loss_shortens_the_wait(m: dict):
    waited = {w: sum(v["wait"]) for w, v in m.items()}
    without, with_loss = waited[0.0], min(waited[w] for w in waited if w > 0)
    figures = "; ".join(
        f"{'no balance loss' if w == 0 else f'weight {w:g}'}: assignments per rank "
        f"{', '.join(str(a) for a in v['assignments'])}, waiting "
        f"{', '.join(f'{t * 1e3:.1f}' for t in v['wait'])} ms" for w, v in m.items())
    return (without >= WAIT_LESS * with_loss, figures + f"; {without / with_loss:.2f}x less",
            "the balanced router did not shorten the wait enough",
            "replayed on 4 dedicated devices, each span's CPU time")


def _axes_experiment() -> dict:
    return {"axes": axis_rows(run_ep_dp())}


@lessons.lesson("11.bytes_per_axis_match",
                "on a 2 × 2 mesh each axis carries the bytes its formula gives: the "
                "all-to-alls on the expert axis, the experts' gradients on the data axis",
                _axes_experiment)
def bytes_per_axis_match(m: dict):
    rows = m["axes"]
    figures = "; ".join(f"rank {r['rank']} " + ", ".join(
        f"{a} {b:,}" for a, b in sorted(r["traced"].items())) for r in rows) + " bytes"
    off = [r["rank"] for r in rows if r["traced"] != r["formula"]]
    return not off, figures, f"ranks {off} off the formula"
