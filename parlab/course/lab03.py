"""Lab 03 (labs/03_vertical_slicing.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

from ..launcher import launch
from . import lessons
from .exercise import Exercise, check, register, run_on_ranks, whose  # noqa: F401 (labNN.check, labNN.whose)
from .explorer import (HERE, WIDTHS, choice, cluster_choices, cluster_for, explorer,
                       refuse_unless_here, scaled_mlp, seconds_text, slider)


def _row_parallel_ranks(rank: int, world_size: int, fn) -> dict:
    """On each rank: the learner's row-parallel forward on its slice, and the dense layer."""
    import torch
    from torch import nn
    torch.manual_seed(3)
    full = nn.Linear(12, 6)
    x = torch.randn(5, 12)
    part = 12 // world_size
    cols = slice(rank * part, (rank + 1) * part)
    with torch.no_grad():
        got = fn(x[:, cols].clone(), full.weight[:, cols].clone(), full.bias.clone())
        want = full(x)
    return {"got": None if got is None else torch.as_tensor(got).numpy(), "want": want.numpy(),
            "bias": full.bias.detach().numpy()}


def check_row_parallel(fn, world_size: int = 2):
    """Run the learner's row-parallel forward on real ranks and compare with a dense layer.

    Returns the function to use next: the learner's if right, else the reference.
    """
    import numpy as np

    from ..torch.tensor_parallel import row_parallel_forward
    results = run_on_ranks("row_parallel", _row_parallel_ranks, fn, world_size)
    if results is None:
        return row_parallel_forward
    for r, res in enumerate(results):
        if res["got"] is None or res["got"].shape != res["want"].shape:
            shape = None if res["got"] is None else res["got"].shape
            print(f"[row_parallel] rank {r} returned shape {shape}, expected {res['want'].shape}: "
                  "each rank must return the full output (every unit), not a slice.")
            return row_parallel_forward
        err = float(np.abs(res["got"] - res["want"]).max())
        if err > 1e-5:
            bias_counted_n_times = np.allclose(res["got"] - res["want"],
                                               (world_size - 1) * res["bias"], atol=1e-5)
            hint = (f"It looks like the bias was added on every rank before the all-reduce, so "
                    f"it is counted {world_size} times." if bias_counted_n_times else "")
            print(f"[row_parallel] rank {r} is off by up to {err:.3g} from the dense layer. "
                  "Each rank's product is a partial sum over its inputs: all ranks' partial sums "
                  f"must be added (all-reduce) before the bias is added once. {hint}\n"
                  "The lab goes on with the reference solution.")
            return row_parallel_forward
    print(f"[row_parallel] correct: on {world_size} ranks, every rank's output equals the dense layer's.")
    return fn


def _column_row_bytes(sizes, batch_size, world_size):
    from ..torch.tensor_parallel import expected_comm_bytes
    return expected_comm_bytes(sizes, batch_size, world_size, "column_row")["total"]


register(Exercise(
    name="column_row_bytes",
    reference=_column_row_bytes,
    cases=[((64, 256, 256, 128, 10), 64, 2), ((64, 256, 256, 128, 10), 64, 4),
           ((64, 10, 10), 32, 2), ((16, 8, 8, 8, 8, 4, 4), 5, 2), ((32, 64, 32), 100, 8)],
    hint="layers go in pairs (column-parallel, then row-parallel). Forward: one all-reduce "
         "per pair, of the pair's output. Backward: one all-reduce per pair, of the gradient "
         "of the pair's input, except where no gradient is needed at all. Count each rank's "
         "buffer (batch x width float32 numbers): does an all-reduce's buffer shrink with "
         "the number of ranks?",
))


def tensor_parallel_explorer(here, *, batch: int = 64):
    """Lab 03: slice the MLP's layers over n devices, naive or column-then-row (PREDICTED).

    here: this machine as the lab calibrated it (``sim.calibrate.this_machine``). The
    hidden width scales the MLP (64 -> w -> w -> w/2 -> 10). "measure it here" trains
    the sliced MLP on n ranks of this machine (``tensor_parallel.train_sliced``).
    """
    from .. import sim

    def predict(width, n, scheme, cluster):
        net, c = sim.Network.mlp(scaled_mlp(width)), cluster_for(cluster, n, here)
        tl = sim.tensor_parallel(net, c, batch, devices=n, scheme=scheme)
        one = sim.single_device(net, c, batch)
        comm = tl.seconds_by_kind(0)["comm"] + tl.seconds_by_kind(0)["wait"]
        return tl, (f"PREDICTED: one step {seconds_text(tl.step_s)} on {n} devices, {seconds_text(one.step_s)} on "
                    f"one: speed-up {one.step_s / tl.step_s:.2f}x; in collectives "
                    f"{comm / tl.duration:.0%} of the step (rank 0)"), \
            f"{scheme}, width {width}, {n} devices, {c.name}"

    def measure(width, n, scheme, cluster):
        from ..launcher import launch
        from ..torch import tensor_parallel as tp
        refuse_unless_here(cluster, n)
        steps = 6
        run = launch(tp.train_sliced, n, kwargs=dict(sizes=scaled_mlp(width), scheme=scheme,
                                                     steps=steps, batch_size=batch))
        durations = [run.timeline.step(k).duration for k in range(2, steps)]
        k = 2 + sorted(range(len(durations)), key=durations.__getitem__)[len(durations) // 2]
        net = sim.Network.mlp(scaled_mlp(width))
        return run.timeline.step(k), sim.tensor_parallel(net, cluster_for(HERE, n, here), batch,
                                                         devices=n, scheme=scheme)

    controls = {"width": slider("hidden width w", WIDTHS, 256),
                "n": slider("devices n", [2, 4, 8], 2),
                "scheme": choice("scheme", ["column_row", "naive"]),
                "cluster": choice("cluster", cluster_choices(here))}
    return explorer(predict, controls, measure=measure)


# ------------------------------------------------------------------ lessons
SIZES = (64, 256, 256, 128, 10)     # the course's MLP, as the lab slices it
BATCH = 64                          # train_sliced's batch: the same on every rank
WARM = 2                            # the first steps pay for start-up: compare the ones after
SWEEP_WIDTHS = (32, 128, 512, 1024)


def _median(values) -> float:
    import statistics
    return float(statistics.median(values))


def scheme_runs(steps: int = 20, devices=None, sizes=SIZES) -> dict:
    """The MLP ``sizes`` trained sliced over 2 ranks both ways, ``steps`` steps each:
    {"naive": LaunchResult, "column_row": LaunchResult} (the lab's comparison)."""
    from ..hardware import devices as find_devices
    from ..torch import tensor_parallel as tp
    devices = devices or find_devices(2)
    return {scheme: launch(tp.train_sliced, 2, devices=devices, pin_cores=True,
                           kwargs=dict(sizes=sizes, scheme=scheme, steps=steps))
            for scheme in ("naive", "column_row")}


def scheme_numbers(runs: dict, steps: int, sizes=SIZES, warm: int = WARM) -> dict:
    """What lessons 03.column_row_sends_less and 03.column_row_steps_faster read from
    ``scheme_runs``, per scheme: the bytes rank 0 hands to collectives per step (traced)
    and by the formula; collectives per step; over the warm steps (each cut at rank 0's
    forward), the median step and the median of the ranks' mean compute, wait, transfer
    (comm) and core wait in it; the quickest warm step; the share of the ranks' warm
    time spent waiting for a core."""
    from ..torch import tensor_parallel as tp
    out = {}
    for scheme, res in runs.items():
        tl, per = res.timeline, []
        for k in range(warm, steps):
            st = tl.step(k)
            per.append({"step": st.duration,
                        **{kind: sum(st.seconds_by_kind(r)[kind] for r in st.ranks) / len(st.ranks)
                           for kind in ("compute", "wait", "comm", "core_wait")}})
        out[scheme] = {**{key: _median(p[key] for p in per) for key in per[0]},
                       "quickest": min(p["step"] for p in per),
                       "bytes": tl.comm_bytes(0) / steps,
                       "formula": tp.expected_comm_bytes(sizes, BATCH, len(res.results),
                                                         scheme)["total"],
                       "collectives": sum(s.rank == 0 and s.kind == "comm" for s in tl) / steps,
                       "core_wait_share": lessons.core_wait_share(
                           tl.step(warm, count=steps - warm), tl.ranks)}
    return out


def collective_seconds(run, steps: int, rank: int = 0) -> list[float]:
    """Per step, the seconds ``rank`` spent inside its collectives: waiting for the
    other ranks, transferring, and waiting for a core in them (each collective's core
    wait is carved out of it into a span of its own, and a first collective's set-up
    shows there or as waiting, rarely as transfer: the transfer alone can be 0)."""
    from ..core_waits import waiting_name
    tl = run.timeline.filter(ranks=[rank])
    names = {s.name for s in tl if s.kind in ("comm", "wait")}
    inside = names | {waiting_name(n) for n in names}
    return [sum(s.duration for s in tl.step(k) if s.name in inside and s.kind != "compute")
            for k in range(steps)]


def start_up_text(run, steps: int, warm: int = WARM) -> str:
    """One line: rank 0's time in collectives in the first step against a warm step's."""
    per = collective_seconds(run, steps)
    first, later = per[0], _median(per[warm:])
    return (f"rank 0's time in collectives (wait, transfer and waits for a core in them): "
            f"{first * 1e3:.2f} ms in the first step, {later * 1e3:.2f} ms in a warm step "
            f"(median), {first / later:.1f}x")


def _schemes_experiment() -> dict:
    return scheme_numbers(scheme_runs(), 20)


@lessons.lesson("03.column_row_sends_less",
                "column-then-row hands its collectives fewer bytes per step than naive "
                "slicing, and the bytes traced on a rank are exactly those the formula "
                "tp.expected_comm_bytes counts",
                _schemes_experiment)
def column_row_sends_less(m: dict):
    nv, cr = m["naive"], m["column_row"]
    figures = (f"column-then-row {cr['bytes']:,.0f} bytes per step, naive {nv['bytes']:,.0f} "
               f"({cr['bytes'] / nv['bytes']:.2f}x); formula {cr['formula']:,} and "
               f"{nv['formula']:,}")
    off = [s for s in ("naive", "column_row") if m[s]["bytes"] != m[s]["formula"]]
    why = (f"the traced bytes of {' and '.join(off)} differ from the formula: an exchange "
           "bypassed the traced layer, or the formula miscounts" if off
           else "column-then-row sent as many bytes as naive or more")
    return not off and cr["bytes"] < nv["bytes"], figures, why


@lessons.lesson("03.column_row_steps_faster",
                "column-then-row, with fewer collectives per step, takes at least 10 % less "
                "time per step than naive slicing (median warm steps)",
                _schemes_experiment)
def column_row_steps_faster(m: dict):
    nv, cr = m["naive"], m["column_row"]
    ratio = cr["step"] / nv["step"]
    figures = (f"column-then-row {cr['step'] * 1e3:.2f} ms per step, naive "
               f"{nv['step'] * 1e3:.2f} ms ({ratio:.2f}x); in collectives (wait + transfer) "
               f"{(cr['wait'] + cr['comm']) * 1e3:.2f} and "
               f"{(nv['wait'] + nv['comm']) * 1e3:.2f} ms; "
               f"{cr['collectives']:.0f} and {nv['collectives']:.0f} collectives per step")
    why = (f"the ranks waited for a core {cr['core_wait_share']:.0%} (column-then-row) and "
           f"{nv['core_wait_share']:.0%} (naive) of the warm steps; their quickest warm steps: "
           f"{cr['quickest'] * 1e3:.2f} and {nv['quickest'] * 1e3:.2f} ms "
           f"({cr['quickest'] / nv['quickest']:.2f}x)")
    return ratio <= 0.9, figures, why


def sweep_runs(counts=(2, 4), widths=SWEEP_WIDTHS) -> dict:
    """``tp.width_sweep`` on n ranks for each n of ``counts``: {n: LaunchResult}."""
    from ..hardware import devices_alike
    from ..torch import tensor_parallel as tp
    # every count on one kind of device (two GPUs would put 2 ranks on them and simulate 4)
    return {n: launch(tp.width_sweep, n, devices=on, kwargs=dict(widths=widths))
            for n, on in devices_alike(counts).items()}


def sweep_numbers(runs: dict) -> dict:
    """What lesson 03.slicing_pays_for_wide_layers reads from ``sweep_runs``: per number
    of ranks and width, the share of the sliced steps the ranks spent in collectives (wait
    + transfer) and waiting for a core (means over the ranks), and the speed-up over one
    device (its step measured on rank 0 while the others wait)."""
    out = {}
    for n, res in runs.items():
        for w, r in res.results[0].items():
            win, (t0, t1) = res.timeline.window(*r["window"]), r["window"]
            secs = [win.seconds_by_kind(k) for k in win.ranks]
            per_rank = len(secs) * (t1 - t0)
            out[n, w] = {"comm_share": sum(s["comm"] + s["wait"] for s in secs) / per_rank,
                         "core_wait_share": sum(s["core_wait"] for s in secs) / per_rank,
                         "speed_up": r["dense_step"] / r["sliced_step"]}
    return out


def _sweep_experiment() -> dict:
    return sweep_numbers(sweep_runs(counts=(2,)))


@lessons.lesson("03.slicing_pays_for_wide_layers",
                "sliced column-then-row over 2 devices, narrow layers lose to one device and "
                "the loss shrinks as the layers widen: the speed-up over one device is below "
                "1x at width 32, and at least twice as high at width 1024 (the arithmetic "
                "grows with width², the exchanged activations only with width)",
                _sweep_experiment)
def slicing_pays_for_wide_layers(m: dict):
    lo, hi = SWEEP_WIDTHS[0], SWEEP_WIDTHS[-1]
    narrow, wide = m[2, lo], m[2, hi]
    gain = wide["speed_up"] / narrow["speed_up"]
    figures = (f"on 2 devices, speed-up {narrow['speed_up']:.2f}x at width {lo}, "
               f"{wide['speed_up']:.2f}x at width {hi} ({lessons.beside(gain, 2, digits=1)} "
               f"times as high; at width {hi} "
               + ("faster than one device" if wide["speed_up"] > 1 else
                  "still no faster than one device") + ")")
    failed = ([f"slicing beat one device even at width {lo}"] if narrow["speed_up"] >= 1
              else []) + ([f"width {hi} gained only {lessons.beside(gain, 2, digits=1)}x on "
                           f"width {lo}"] if gain < 2 else [])
    why = "; ".join(failed + [f"the ranks waited for a core {narrow['core_wait_share']:.0%} "
                              f"(width {lo}) and {wide['core_wait_share']:.0%} (width {hi}) "
                              "of the sliced steps"])
    return narrow["speed_up"] < 1 and gain >= 2, figures, why


def share_text(m: dict, devices: int = 2) -> str:
    """One line: how the collectives' share of the sliced step moved from the narrowest
    to the widest layers on ``devices`` devices, said from the numbers."""
    lo, hi = m[devices, SWEEP_WIDTHS[0]], m[devices, SWEEP_WIDTHS[-1]]
    moved = ("fell" if hi["comm_share"] < lo["comm_share"] - 0.02 else
             "rose" if hi["comm_share"] > lo["comm_share"] + 0.02 else "stayed within 2 points")
    return (f"on {devices} devices, wait + transfer took {lo['comm_share']:.0%} of the sliced "
            f"step at width {SWEEP_WIDTHS[0]} and {hi['comm_share']:.0%} at width "
            f"{SWEEP_WIDTHS[-1]}: its share {moved} as the layers widened (waiting for a "
            f"core: {lo['core_wait_share']:.0%} and {hi['core_wait_share']:.0%})")
