"""Lab 05 (labs/05_mirrored.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

from ..launcher import LaunchResult, launch
from . import lessons
from .replays import replayed  # noqa: F401 (lab05.replayed: a run on dedicated devices)
from .exercise import Exercise, check, register, run_on_ranks, whose  # noqa: F401 (labNN.check, labNN.whose)
from .explorer import (WIDTHS, bytes_text, checkbox, choice, cluster_choices, cluster_for,
                       explorer, here_costs, refuse_unless_here, scaled_mlp, seconds_text,
                       slider)


def run_multi_worker(workers: int = 2, steps: int = 20, *, timeout: float = 180.0,
                     **options) -> LaunchResult:
    """MultiWorkerMirroredStrategy: ``workers`` TensorFlow worker processes, TF_CONFIG each.

    Ports on 127.0.0.1 are chosen here; every process is gone when this returns.
    ``options`` go to ``parlab.tf.data_parallel.multi_worker`` (global_batch, lr).
    """
    from ..tf.cluster import free_ports
    from ..tf.data_parallel import multi_worker
    return launch(multi_worker, workers, kwargs=dict(ports=free_ports(workers), steps=steps, **options),
                  process_group=False, timeout=timeout, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


def _tiny_problem():
    """A small MLP and batch, the same on every rank (the averaging exercise's test)."""
    import torch

    from ..torch import models
    torch.manual_seed(0)
    net = models.mlp((16, 8, 4))
    return net, torch.randn(8, 16), torch.randint(0, 4, (8,))


def _average_ranks(rank: int, world_size: int, fn) -> dict:
    """On each rank: the gradient of its half of the batch, averaged by the learner's fn."""
    from torch import nn
    net, x, y = _tiny_problem()
    b = 8 // world_size
    nn.functional.cross_entropy(net(x[rank * b:(rank + 1) * b]), y[rank * b:(rank + 1) * b]).backward()
    fn(net)
    return {n: p.grad.numpy().copy() for n, p in net.named_parameters()}


def check_average_gradients(fn, world_size: int = 2):
    """Run the learner's gradient averaging on real ranks; compare with one device."""
    import numpy as np
    from torch import nn

    from ..torch.data_parallel import average_gradients
    results = run_on_ranks("average_gradients", _average_ranks, fn, world_size)
    if results is None:
        return average_gradients
    net, x, y = _tiny_problem()
    nn.functional.cross_entropy(net(x), y).backward()
    for name, p in net.named_parameters():
        got = [r[name] for r in results]
        if any(not np.allclose(g, got[0], atol=1e-7) for g in got):
            print(f"[average_gradients] the ranks disagree on {name}: every rank must end with "
                  "the same gradient. The lab goes on with the reference.")
            return average_gradients
        if not np.allclose(got[0], p.grad.numpy(), atol=1e-6):
            ratio = float(np.median(got[0] / np.where(p.grad.numpy() == 0, np.nan, p.grad.numpy())))
            hint = (f" (yours is about {ratio:.2g}x the right one: a sum needs dividing by the "
                    "number of ranks)" if np.isfinite(ratio) else "")
            print(f"[average_gradients] {name} differs from the whole-batch gradient{hint}. "
                  "The lab goes on with the reference.")
            return average_gradients
    print(f"[average_gradients] correct: on {world_size} ranks the averaged gradients equal "
          "the whole batch's on one device.")
    return fn


def _ring_chunk(position, step, world_size, phase):
    # as parlab.torch.data_parallel.ring_all_reduce: position r of n, step k
    if phase == "reduce-scatter":
        return (position - step) % world_size
    return (position + 1 - step) % world_size


register(Exercise(
    name="ring_chunk",
    reference=_ring_chunk,
    cases=[(r, k, n, ph) for n in (2, 3, 4, 5) for ph in ("reduce-scatter", "all-gather")
           for r in range(n) for k in range(n - 1)],
    hint="in the reduce-scatter, position r starts by sending its own chunk r, and each step "
         "it sends on the chunk it has just added to. After n-1 steps position r holds the "
         "finished sum of one chunk (which one?): the all-gather starts by sending that one, "
         "and then sends on whatever finished chunk just arrived.",
))


# bucket count (sim) -> DDP's bucket cap measuring it here (lab 05: 25 MB gives one
# bucket for the MLP, 0.2 MB two, a tiny cap one per layer)
BUCKETS = {"one bucket": 1, "2 buckets": 2, "one bucket per layer": 4}


BUCKET_CAP_MB = {1: 25.0, 2: 0.2, 4: 0.004}


def data_parallel_explorer(here, measured=None, *, sizes=(64, 256, 256, 128, 10),
                           global_batch: int = 128):
    """Lab 05: n replicas, gradients averaged by ring all-reduce in buckets (PREDICTED).

    here: this machine as the lab calibrated it; measured: its per-layer costs of the
    lab's MLP (``sim.Measured``), used for this machine at the lab's width (else the
    roofline at the calibrated rate). "measure it here" runs DDP with the bucket cap
    that gives the chosen buckets, overlapped with the backward or all-reduced after it.
    """
    from .. import sim
    lab_net = sim.Network.mlp(sizes)
    lab_width = sizes[1]

    def predicted(width, n, buckets, overlap, cluster, steps=1):
        net = sim.Network.mlp(scaled_mlp(width)) if width != lab_width else lab_net
        c = cluster_for(cluster, n, here)
        costs = here_costs(cluster, net, measured, lab_net)
        tl = sim.data_parallel(net, c, global_batch, devices=n, buckets=buckets,
                               overlap=overlap, steps=steps, costs=costs)
        return net, c, costs, tl

    def predict(n, width, buckets, overlap, cluster):
        net, c, costs, tl = predicted(width, n, buckets, overlap, cluster)
        one = sim.single_device(net, c, global_batch, costs=costs)
        shown = tl if n <= 2 else tl.filter(ranks=[r for r in tl.ranks if r % n < 2])
        note = " (replicas 0 and 1 drawn: the others do the same)" if n > 2 else ""
        return shown, (f"PREDICTED{note}: one step {seconds_text(tl.step_s)} on {n} replicas of "
                    f"{global_batch // n} samples, {seconds_text(one.step_s)} on one device with all "
                    f"{global_batch}: speed-up {one.step_s / tl.step_s:.2f}x; gradients "
                    f"{bytes_text(net.params * net.grad_wire_bytes)} per all-reduce round"), \
            f"data parallel, {n} replicas, width {width}, {c.name}"

    def measure(n, width, buckets, overlap, cluster):
        from ..launcher import launch
        from ..torch import data_parallel as dp
        from ..trace import Timeline
        refuse_unless_here(cluster, n)
        if width != lab_width:
            raise ValueError(f"measuring here runs the lab's MLP: choose width {lab_width}")
        mode = "ddp" if overlap else "ddp_no_overlap"
        run = launch(dp.train_data_parallel, n, kwargs=dict(
            mode=mode, global_batch=global_batch, steps=10, bucket_mb=BUCKET_CAP_MB[buckets]))
        labels = {r: f"rank {r}" for r in range(n)}
        if overlap:
            labels.update({n + r: f"rank {r} buckets" for r in range(n)})
        tl = Timeline(run.timeline.spans, labels)
        done = run.results[0]["buckets_each_step"][-1]
        *_, pred = predicted(width, n, done, overlap, cluster, steps=2)
        return tl.step(-3, count=2), pred

    controls = {"n": slider("replicas n", [2, 4, 8], 2),
                "width": slider("hidden width w", WIDTHS, lab_width),
                "buckets": choice("gradients in", BUCKETS),
                "overlap": checkbox("overlap with the backward (DDP)", True),
                "cluster": choice("cluster", cluster_choices(here))}
    return explorer(predict, controls, measure=measure)


# ------------------------------------------------------------------ lessons
def ring_numbers(demo: LaunchResult) -> dict:
    """What lesson 05.ring_sends_2_n_minus_1_over_n reads from the ring demo (``dp.ring_demo``):
    the ranks, the tensor's bytes, and the bytes each rank handed to ``isend`` (traced)."""
    n = len(demo.results)
    return {"world_size": n, "tensor_bytes": int(demo.results[0]["result"].nbytes),
            "sent": {r: sum(s.bytes for s in demo.timeline.spans
                            if s.rank == r and s.kind == "comm" and s.name == "isend")
                     for r in range(n)}}


def _ring_experiment() -> dict:
    from ..hardware import devices
    from ..torch import data_parallel as dp
    return ring_numbers(launch(dp.ring_demo, 4, kwargs=dict(numel=8), devices=devices(4)))


@lessons.lesson("05.ring_sends_2_n_minus_1_over_n",
                "in the ring all-reduce each of n ranks sends 2(n − 1)/n of the tensor, "
                "whatever n (the bytes each rank hands to isend, traced; within 1 %)",
                _ring_experiment)
def ring_sends_2_n_minus_1_over_n(m: dict):
    n, size = m["world_size"], m["tensor_bytes"]
    want = 2 * (n - 1) / n
    share = {r: b / size for r, b in m["sent"].items()}
    figures = (f"each of {n} ranks sent " + ", ".join(f"{x:.3f}" for x in share.values())
               + f" of the {size}-byte tensor (2(n − 1)/n = {want:.3f})")
    off = [r for r, x in share.items() if abs(x - want) > 0.01 * want]
    return not off, figures, ("rank" + "s" * (len(off) > 1) + " " + ", ".join(map(str, off))
                              + " off the formula (traced isend bytes)")


def run_ddp(devices=None, bucket_mb: float = 0.1, steps: int = 10) -> LaunchResult:
    """DDP on 2 replicas of the lab's MLP, gradients in buckets of ``bucket_mb`` (0.1 MB:
    3 buckets) averaged by the traced hook, whose all-reduces run on lanes 2 and 3."""
    from ..hardware import devices as find_devices
    from ..torch import data_parallel as dp
    return launch(dp.train_data_parallel, 2, devices=devices or find_devices(2), kwargs=dict(
        mode="ddp", global_batch=128, steps=steps, bucket_mb=bucket_mb))


def step_seconds(tl, skip: int = 2) -> list:
    """Every warm step of a (replayed) timeline, rank 0's forward to its next forward:
    the first ``skip`` dropped (DDP rebuilds its buckets after the first), and the last
    (it has no next forward)."""
    return [b - a for a, b in tl.step_windows("forward", rank=0)[skip:-1]]


def compare(timelines: dict, *, color_by: str = "name"):
    """Timelines stacked on one time scale, each titled by its key."""
    from .. import plot
    plt = plot.pyplot()
    lanes = sum(len(tl.ranks) for tl in timelines.values())
    fig, axes = plt.subplots(len(timelines), 1, sharex=True,
                             figsize=(13, 0.7 * lanes + 1.4 * len(timelines) + 0.6))
    for k, (ax, (title, tl)) in enumerate(zip(axes, timelines.items())):
        plot.timeline(tl, ax=ax, title=title, color_by=color_by, legend=k == 0)
        if k < len(timelines) - 1:
            ax.set_xlabel("")
    axes[0].set_xlim(0, max(tl.duration for tl in timelines.values()) * 1e3)
    fig.tight_layout()
    return plot.style.finish(fig)


def on_this_machine(runs: dict, replays: dict):
    """The optional figure: ``overlap_runs`` on this machine's wall clock, one warm step
    each, with the median warm step measured here and replayed."""
    import numpy as np

    from ..timeline import Timeline
    for name, run in runs.items():
        print(f"{name:>7}: median warm step {np.median(run.results[0]['step_s'][2:]) * 1e3:.1f} ms "
              f"measured here, {np.median(step_seconds(replays[name])) * 1e3:.1f} ms replayed")
    lanes = {2: "rank 0 · buckets", 3: "rank 1 · buckets"}
    return compare({f"measured on this machine's wall clock: {name}":
                    Timeline(run.timeline.recorded, lanes).step(-2) for name, run in runs.items()})


# DDP against the same buckets all-reduced after the backward: an MLP whose gradients
# weigh (4.2 MB a hidden layer), one bucket per layer (cap 1 MB), 16 samples a replica.
# Measured (2 cores, 2026-11-28, 3 busy loops beside): the overlap saved 18-26 % of a
# replayed step; with 32 samples a replica -1 to 30 % (the backward, memory-bound, is
# hardly longer, and overlap lengthens it where the cores are contended).
OVERLAP_SIZES = (64, 1024, 1024, 1024, 1024, 10)
OVERLAP_BATCH, OVERLAP_CAP_MB = 32, 1.0


def overlap_runs(devices=None, steps: int = 20) -> dict:
    """DDP on 2 replicas of ``OVERLAP_SIZES``, twice: {"overlap": each bucket all-reduced
    as soon as it is full, beside the backward (mode "ddp"); "after": the same buckets
    all-reduced one by one after the backward (mode "ddp_no_overlap")}. Gradients are
    views of the buckets in both (no copies: the same work either way)."""
    from ..hardware import devices as find_devices
    from ..torch import data_parallel as dp
    devices = devices or find_devices(2)
    return {name: launch(dp.train_data_parallel, 2, devices=devices, kwargs=dict(
        mode=mode, sizes=OVERLAP_SIZES, global_batch=OVERLAP_BATCH, steps=steps, lr=0.05,
        bucket_mb=OVERLAP_CAP_MB, bucket_view=True))
        for name, mode in (("overlap", "ddp"), ("after", "ddp_no_overlap"))}


def _per_step(tl, rank: int, names, skip: int = 2) -> float:
    """Median seconds a step that ``rank`` spent in spans named (or starting with) ``names``."""
    import numpy as np
    per = []
    for a, b in tl.step_windows("forward", rank=0)[skip:-1]:
        per.append(sum(min(s.end, b) - max(s.start, a) for s in tl.spans if s.rank == rank
                       and s.name.startswith(names) and s.end > a and s.start < b))
    return float(np.median(per)) if per else 0.0


def overlap_numbers(runs: dict, replays: dict | None = None) -> dict:
    """What lesson 05.buckets_overlap_backward reads from ``overlap_runs``, replayed on
    dedicated devices: each variant's warm steps, and rank 0's backward, its wait for
    the buckets (overlap) or its all-reduces (after), medians a step."""
    from . import replays as kept
    replays = replays or {name: replayed(run) for name, run in runs.items()}
    out = {}
    for name, rp in replays.items():
        out[name] = {"step_s": step_seconds(rp), "backward_s": _per_step(rp, 0, "backward"),
                     "comm_s": _per_step(rp, 0, ("wait for buckets", "bucket all_reduce"))}
    return {"source": kept.source(next(iter(replays.values()))), **out,
            "buckets": runs["overlap"].results[0]["buckets_each_step"][-1]}


def _overlap_experiment() -> dict:
    return overlap_numbers(overlap_runs())


@lessons.lesson("05.buckets_overlap_backward",
                "DDP's bucket all-reduces, overlapping the backward pass, make a step "
                "quicker than the same buckets all-reduced after the backward "
                "(median warm step)",
                _overlap_experiment)
def buckets_overlap_backward(m: dict):
    import numpy as np
    if not m["overlap"]["step_s"] or not m["after"]["step_s"]:
        return False, "no warm step in one of the runs", "the run recorded too few steps"
    o, a = (float(np.median(m[k]["step_s"])) * 1e3 for k in ("overlap", "after"))
    figures = (f"a step took {o:.2f} ms with overlap, {a:.2f} ms with the same "
               f"{m['buckets']} buckets after the backward ("
               + (f"{1 - o / a:.0%} less)" if o <= a else f"{o / a - 1:.0%} more)"))
    ob, ab = m["overlap"]["backward_s"] * 1e3, m["after"]["backward_s"] * 1e3
    why = (f"after the backward the buckets took {m['after']['comm_s'] * 1e3:.2f} ms a step; "
           f"with overlap rank 0 still waited {m['overlap']['comm_s'] * 1e3:.2f} ms for them, "
           f"and its backward took {ob:.2f} ms against {ab:.2f} ms")
    return o < a, figures, why


SCALING_BATCH = 512     # images per global batch in the scaling runs


def scaling_runs(counts=(1, 2, 4), steps: int = 20, global_batch: int = SCALING_BATCH) -> dict:
    """Lab 02's convolution stack under DDP on each number of simulated (or real) devices
    in ``counts``: {n: LaunchResult}. A global batch of 512 keeps the all-reduce (0.2 MB
    of gradients) small beside the work."""
    from ..hardware import devices_alike
    from ..torch import data_parallel as dp
    # every count on one kind of device: one device on a GPU against two simulated on the
    # CPU would compare a GPU with the CPU
    return {n: launch(dp.train_data_parallel, n, devices=on, kwargs=dict(
        mode="ddp", model="conv_stack", global_batch=global_batch, steps=steps, lr=0.05))
        for n, on in devices_alike(counts).items()}


def scaling_numbers(runs: dict, skip: int = 2, replays: dict | None = None) -> dict:
    """What lesson 05.data_parallel_scales reads from ``scaling_runs``, each replayed on
    dedicated devices (one device's run too: a 1-rank replay is its own work), per
    device count: the median warm step, rank 0's compute and wait for buckets a step."""
    import numpy as np

    from . import replays as kept
    replays = replays or {n: replayed(run) for n, run in runs.items()}
    out = {}
    for n, rp in replays.items():
        warm = len(rp.step_windows("forward", rank=0)) - skip
        secs = rp.step(skip, count=warm, rank=0).seconds_by_kind(0)
        out[n] = {"step_s": float(np.median(step_seconds(rp, skip))),
                  "compute_s": secs["compute"] / warm, "wait_s": secs["wait"] / warm}
    return {"source": kept.source(replays[max(replays)]).replace(
        f"on {max(replays)} dedicated", f"on {', '.join(map(str, replays))} dedicated"),
        "devices": out}


def plot_scaling(m: dict):
    """The speed-up of ``scaling_numbers``' replayed steps against the number of devices."""
    from .. import plot
    d = m["devices"]
    fig = plot.scaling(list(d), [x["step_s"] for x in d.values()], title=(
        f"data parallel, global batch {SCALING_BATCH}: speed-up, replayed on dedicated devices"))
    ax = fig.axes[0]
    ax.lines[0].set_label("replayed speed-up")      # plot.scaling names its line "measured"
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    return fig


def _scaling_experiment() -> dict:
    return scaling_numbers(scaling_runs())


@lessons.lesson("05.data_parallel_scales",
                "data parallel on 2 devices takes a step at least 1.25x faster than one device "
                "on the same global batch (the ideal is 2x; the all-reduce, and compute "
                "that does not halve, take part of it)",
                _scaling_experiment)
def data_parallel_scales(m: dict):
    d = m["devices"]
    one = d[1]["step_s"]
    figures = ", ".join(f"{n} device{'s' * (n > 1)} {one / x['step_s']:.2f}x"
                        for n, x in d.items() if n > 1) + " one device (median warm step)"
    two = d[2]
    share = two["compute_s"] / d[1]["compute_s"]
    why = (f"on 2 devices rank 0 computed its half batch in {share:.0%} of one device's "
           f"time for the whole batch (ideal 50 %) and waited {two['wait_s'] * 1e3:.1f} ms "
           "a step for the gradient buckets")
    # 1.25x: replayed, the 2-device step came out 1.33-2.22x quicker in 13 runs on this
    # 2-core machine: its work is measured while both cores compute (memory and clock
    # shared), one device's while one does
    return one / two["step_s"] >= 1.25, figures, why
