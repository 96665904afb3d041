"""Lab 03 (labs/03_vertical_slicing.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

from ..launcher import launch
from . import lessons, replays
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


def replay_runs(runs: dict) -> dict:
    """Each run of ``runs`` ({name: LaunchResult}) replayed on dedicated devices."""
    return {name: replays.replayed(res) for name, res in runs.items()}


def scheme_numbers(runs: dict, steps: int, sizes=SIZES) -> dict:
    """What lesson 03.column_row_sends_less reads from ``scheme_runs`` (measured): per
    scheme, the bytes rank 0 hands to collectives per step (traced) and by the formula,
    and the collectives per step."""
    from ..torch import tensor_parallel as tp
    return {scheme: {"bytes": res.timeline.comm_bytes(0) / steps,
                     "formula": tp.expected_comm_bytes(sizes, BATCH, len(res.results),
                                                       scheme)["total"],
                     "collectives": sum(s.rank == 0 and s.kind == "comm"
                                        for s in res.timeline) / steps}
            for scheme, res in runs.items()}


def step_numbers(replayed: dict, steps: int, warm: int = WARM) -> dict:
    """What lesson 03.column_row_steps_faster reads from the replayed ``scheme_runs``:
    per scheme, over the warm steps (each cut at rank 0's forward), the median step and
    the median of the ranks' mean compute, wait and transfer (comm) in it; and the
    numbers' ``source``."""
    out = {}
    for scheme, rp in replayed.items():
        per = []
        for k in range(warm, steps):
            st = rp.step(k)
            per.append({"step": st.duration,
                        **{kind: sum(st.seconds_by_kind(r)[kind] for r in st.ranks) / len(st.ranks)
                           for kind in ("compute", "wait", "comm")}})
        out[scheme] = {key: _median(p[key] for p in per) for key in per[0]}
        out["source"] = replays.source(rp)
    return out


def _bytes_experiment() -> dict:
    return scheme_numbers(scheme_runs(), 20)


def _steps_experiment() -> dict:
    return step_numbers(replay_runs(scheme_runs()), 20)


@lessons.lesson("03.column_row_sends_less",
                "column-then-row hands its collectives fewer bytes per step than naive "
                "slicing, and the bytes traced on a rank are exactly those the formula "
                "tp.expected_comm_bytes counts",
                _bytes_experiment)
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
                _steps_experiment)
def column_row_steps_faster(m: dict):
    nv, cr = m["naive"], m["column_row"]
    ratio = cr["step"] / nv["step"]
    figures = (f"column-then-row {cr['step'] * 1e3:.2f} ms per step, naive "
               f"{nv['step'] * 1e3:.2f} ms ({ratio:.2f}x); in collectives (wait + transfer) "
               f"{(cr['wait'] + cr['comm']) * 1e3:.2f} and "
               f"{(nv['wait'] + nv['comm']) * 1e3:.2f} ms, computing "
               f"{cr['compute'] * 1e3:.2f} and {nv['compute'] * 1e3:.2f} ms")
    longer = (["its collectives took as long as naive's"]
              if cr["wait"] + cr["comm"] >= nv["wait"] + nv["comm"] else []) + \
        (["it computed as long as naive"] if cr["compute"] >= nv["compute"] else [])
    why = ("column-then-row's step was more than 0.9x naive's"
           + (": " + " and ".join(longer) if longer else ""))
    return ratio <= 0.9, figures, why


SWEEP_STEPS = 8                     # timed steps per width, sliced and on one device


def sweep_runs(counts=(2, 4), widths=SWEEP_WIDTHS, steps: int = SWEEP_STEPS,
               pin_cores: bool = True) -> dict:
    """``tp.width_sweep`` on n ranks for each n of ``counts``: {n: LaunchResult}. Pinned,
    as ``scheme_runs``: a rank that moves between cores runs its work slower."""
    from ..hardware import devices_alike
    from ..torch import tensor_parallel as tp
    # every count on one kind of device (two GPUs would put 2 ranks on them and simulate 4)
    return {n: launch(tp.width_sweep, n, devices=on, pin_cores=pin_cores,
                      kwargs=dict(widths=widths, steps=steps))
            for n, on in devices_alike(counts).items()}


def sweep_numbers(runs: dict) -> dict:
    """What lesson 03.slicing_pays_for_wide_layers reads from ``sweep_runs``, replayed on
    dedicated devices: per (number of ranks, width), the median sliced step (cut at rank
    0's forward) and the median step on one device (its steps after the first, on rank 0,
    from the same replay), the speed-up, and the share of the sliced steps the ranks spent
    in collectives (wait + transfer, mean over the ranks); and the numbers' ``source``."""
    from ..torch import tensor_parallel as tp
    out = {}
    for n, res in runs.items():
        rp = replays.replayed(res)
        if n == 2 or "source" not in out:      # the lesson reads 2 devices
            out["source"] = replays.source(rp)
        for w in res.results[0]:
            sliced = [s for s in rp if s.name == tp.sliced_span(w)]
            t0, t1 = min(s.start for s in sliced), max(s.end for s in sliced)
            win = rp.window(t0, t1)
            secs = [win.seconds_by_kind(k) for k in win.ranks]
            dense = [s.duration for s in rp if s.name == tp.dense_span(w) and s.rank == 0]
            sliced_step = _median(b - a for a, b in win.step_windows("forward"))
            dense_step = _median(dense[1:])
            out[n, w] = {"comm_share": sum(s["comm"] + s["wait"] for s in secs)
                         / (len(secs) * (t1 - t0)),
                         "sliced_step": sliced_step, "dense_step": dense_step,
                         "speed_up": dense_step / sliced_step}
    return out


def measured_speed_ups(runs: dict) -> dict:
    """{(ranks, width): the speed-up over one device on this machine's wall clock}."""
    return {(n, w): r["dense_step"] / r["sliced_step"]
            for n, res in runs.items() for w, r in res.results[0].items()}


def _sweep_experiment() -> dict:
    return sweep_numbers(sweep_runs(counts=(2,)))


@lessons.lesson("03.slicing_pays_for_wide_layers",
                "sliced column-then-row over 2 devices, narrow layers lose to one device and "
                "wide layers beat it: the speed-up over one device is below 1x at width 32 "
                "and above 1x at width 1024 (the arithmetic grows with width², the "
                "exchanged activations only with width)",
                _sweep_experiment)
def slicing_pays_for_wide_layers(m: dict):
    lo, hi = SWEEP_WIDTHS[0], SWEEP_WIDTHS[-1]
    narrow, wide = m[2, lo], m[2, hi]
    # digits enough to land on the side of 1 the strict checks below see (1.004, not 1.00)
    figures = (f"on 2 devices, speed-up {lessons.beside(narrow['speed_up'], 1)}x "
               f"at width {lo}, {lessons.beside(wide['speed_up'], 1, at_most=True)}x at width {hi} "
               f"(sliced step {wide['sliced_step'] * 1e3:.2f} ms, one device "
               f"{wide['dense_step'] * 1e3:.2f} ms)")
    failed = ([f"slicing beat one device even at width {lo}"] if narrow["speed_up"] >= 1
              else []) + ([f"slicing lost to one device even at width {hi}, where collectives "
                           f"took {wide['comm_share']:.0%} of the sliced step"]
                          if wide["speed_up"] <= 1 else [])
    return narrow["speed_up"] < 1 < wide["speed_up"], figures, "; ".join(failed)


def share_text(m: dict, devices: int = 2) -> str:
    """One line: how the collectives' share of the sliced step moved from the narrowest
    to the widest layers on ``devices`` devices, said from the numbers."""
    lo, hi = m[devices, SWEEP_WIDTHS[0]], m[devices, SWEEP_WIDTHS[-1]]
    moved = ("fell" if hi["comm_share"] < lo["comm_share"] - 0.02 else
             "rose" if hi["comm_share"] > lo["comm_share"] + 0.02 else "stayed within 2 points")
    return (f"on {devices} devices, wait + transfer took {lo['comm_share']:.0%} of the sliced "
            f"step at width {SWEEP_WIDTHS[0]} and {hi['comm_share']:.0%} at width "
            f"{SWEEP_WIDTHS[-1]}: its share {moved} as the layers widened")


# ------------------------------------------------------------------ figures
def schemes_figure(replayed: dict):
    """The warm step nearest the median of each scheme, replayed, one above the other on
    one time scale, titled with its number of collectives."""
    from .. import plot
    from ..steps import typical_step
    fig, axes = plot.pyplot().subplots(len(replayed), 1, figsize=(14, 6.4), sharex=True)
    for ax, (scheme, rp) in zip(axes, replayed.items()):
        step = typical_step(rp)
        count = sum(s.rank == step.ranks[0] and s.kind == "comm" for s in step)
        plot.timeline(step, ax=ax, color_by="name", legend=ax is axes[0],
                      title=f"{scheme}: {count} collectives in a typical warm step "
                            "(replayed on dedicated devices)")
    fig.tight_layout()
    return plot.finish(fig)


def here_from_sweep(sweep: dict, link, devices: int = 2):
    """This machine for the cost model, calibrated from the replayed width sweep: a
    straight line through the one-device steps' time against their arithmetic gives the
    rate and a fixed cost per layer pass; the link is the replay's."""
    from .. import sim
    widths = [key[1] for key in sweep if key != "source" and key[0] == devices]
    flops = [3 * BATCH * sum(layer.flops for layer in sim.Network.mlp((64, w, w, w, 10)).layers)
             for w in widths]
    rate, per_pass = sim.calibrate.fit_compute(flops, [sweep[devices, w]["dense_step"]
                                                       for w in widths], layers=4)
    return sim.calibrate.this_machine(link, flops=rate, layer_overhead_s=per_pass)


def beside_prediction(replayed, predicted, title: str):
    """A replayed step (left) and the cost model's prediction (right, dotted) on one
    time scale: both are dedicated devices on the same link."""
    from .. import plot
    plt = plot.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(16, 3.4), sharex=True)
    plot.timeline(replayed, ax=left, color_by="name", title="replayed on dedicated devices")
    plot.timeline(predicted, ax=right, color_by="name", title="PREDICTED (cost model)")
    handles = {}
    for ax in (left, right):
        legend = ax.get_legend()
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            handles.setdefault(text.get_text(), handle)
        legend.remove()
    fig.legend(list(handles.values()), list(handles), loc="lower center",
               ncol=min(len(handles), 7), fontsize=plot.FONT - 3, frameon=False)
    fig.suptitle(title, fontsize=plot.FONT + 1)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return plot.finish(fig)


def on_this_machine(runs: dict, grouped, sweeps: dict):
    """The optional cell: what this machine's wall clock showed of the lab's runs, in a
    few printed lines and one figure (the typical warm step of each scheme, and three
    warm steps of the grouped layers, measured)."""
    from .. import plot
    from ..steps import typical_step
    for scheme, res in runs.items():
        step = typical_step(res.timeline)
        print(f"{scheme}: a typical warm step took {step.duration * 1e3:.2f} ms here, "
              f"waiting for a core {lessons.core_wait_share(step, step.ranks):.0%} of it")
    ups = measured_speed_ups(sweeps)
    print("speed-up over one device on this machine's clock: " + ", ".join(
        f"{u:.2f}x ({n} devices, width {w})" for (n, w), u in ups.items() if w == SWEEP_WIDTHS[-1]))
    drawn = {**{scheme: typical_step(res.timeline) for scheme, res in runs.items()},
             "grouped layers": grouped.timeline.step(-3, count=3)}
    fig, axes = plot.pyplot().subplots(len(drawn), 1, figsize=(14, 9))
    for ax, (name, tl) in zip(axes, drawn.items()):
        plot.timeline(tl, ax=ax, color_by="name", legend=ax is axes[0],
                      title=f"{name}, measured on this machine's clock")
    fig.tight_layout()
    return plot.finish(fig)
