"""Lab 05 (labs/05_mirrored.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

from ..launcher import LaunchResult, launch
from . import lessons
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
    that gives the chosen buckets (overlap), or lab 05's averaging by hand (no overlap:
    one all-reduce per tensor after the backward, whatever the buckets say).
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
        mode = "ddp" if overlap else "by_hand"
        run = launch(dp.train_data_parallel, n, kwargs=dict(
            mode=mode, global_batch=global_batch, steps=10, bucket_mb=BUCKET_CAP_MB[buckets]))
        labels = {r: f"rank {r}" for r in range(n)}
        labels.update({n + r: f"rank {r} buckets" for r in range(n)})
        tl = Timeline(run.timeline.spans, labels)
        done = run.results[0]["buckets_each_step"][-1] if overlap else "per_tensor"
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


def _union_within(spans, start: float, end: float) -> float:
    """Seconds of [start, end] covered by at least one of ``spans``."""
    cuts = sorted((max(s.start, start), min(s.end, end)) for s in spans
                  if s.end > start and s.start < end)
    total, reach = 0.0, start
    for a, b in cuts:
        total += max(0.0, b - max(a, reach))
        reach = max(reach, b)
    return total


def overlap_numbers(run: LaunchResult, skip: int = 2) -> dict:
    """What lesson 05.buckets_overlap_backward reads from ``run_ddp``: for every warm step
    (the first ``skip`` dropped: DDP rebuilds its buckets after the first) and rank, how
    long its backward computed, for how much of that a bucket all-reduce was transferring
    on its background lane, when and how early (before the backward's end) it handed
    over its first bucket, and how long the buckets waited for the other rank to join;
    and the ranks' share of time waiting for a core."""
    tl, n = run.timeline, len(run.results)
    steps = []
    for r in range(n):
        for step, (start, end) in enumerate(tl.step_windows("forward", rank=r)[skip:], skip):
            back = [s for s in tl.spans if s.rank == r and s.name == "backward"
                    and start <= s.start < end]
            lane = [s for s in tl.spans if s.rank == n + r and start <= s.start < end]
            if not back or not lane:
                continue
            b0, b1 = back[0].start, back[0].end
            handed = min(s.start for s in lane)
            steps.append({"rank": r, "step": step, "backward_s": b1 - b0,
                          "overlap_s": _union_within([s for s in lane if s.kind == "comm"], b0, b1),
                          "handed_at": handed, "lead_s": b1 - handed,
                          "bucket_wait_s": sum(s.duration for s in lane if s.kind == "wait")})
    return {"steps": steps, "ranks": n, "core_wait": lessons.core_wait_share(tl, range(n))}


def _overlap_experiment() -> dict:
    return overlap_numbers(run_ddp())


@lessons.lesson("05.buckets_overlap_backward",
                "with gradient buckets, DDP's all-reduces run while the backward pass is still "
                "computing: in at least half of the warm steps, the first bucket is "
                "transferring on the background lane before the backward ends on the rank "
                "that handed it over last (an all-reduce starts once every rank has handed "
                "its bucket over; a rank ahead of the other waits for it instead)",
                _overlap_experiment)
def buckets_overlap_backward(m: dict):
    import numpy as np
    rows = m["steps"]
    by_step: dict = {}
    for x in rows:
        by_step.setdefault(x["step"], []).append(x)
    last = [max(g, key=lambda x: x["handed_at"]) for g in by_step.values() if len(g) == m["ranks"]]
    if not last:
        return False, "no warm step with a backward pass and buckets", "the run recorded none"
    hits = sum(x["overlap_s"] > 0 for x in last)
    ranks = sorted({x["rank"] for x in rows})
    own = {r: sum(x["overlap_s"] > 0 for x in rows if x["rank"] == r) for r in ranks}
    ms = {k: float(np.median([x[k] for x in last])) * 1e3
          for k in ("overlap_s", "backward_s", "lead_s")}
    wait = float(np.median([x["bucket_wait_s"] for x in rows])) * 1e3
    figures = (f"overlap in {hits} of {len(last)} warm steps on the rank that handed its first "
               f"bucket over last (median {ms['overlap_s']:.2f} ms of a {ms['backward_s']:.2f} ms "
               "backward); counting every rank: "
               + ", ".join(f"{own[r]} of {len(by_step)} on rank {r}" for r in ranks))
    lead = ms["lead_s"]
    why = ((f"the later rank handed over its first bucket a median {lead:.2f} ms before its "
            "backward ended, " if lead > 0 else f"the later rank handed over its first bucket "
            f"only {-lead:.2f} ms after its backward ended (median), ")
           + f"and the buckets waited a median {wait:.2f} ms a step for the other "
           f"rank to join; the ranks spent {m['core_wait']:.0%} of their time waiting for a core "
           "(their main threads; the buckets' own threads are not counted)")
    return 2 * hits >= len(last), figures, why


SCALING_BATCH = 512     # images per global batch in the scaling runs


def scaling_runs(counts=(1, 2, 4), steps: int = 20, global_batch: int = SCALING_BATCH) -> dict:
    """Lab 02's convolution stack under DDP on each number of simulated (or real) devices
    in ``counts``: {n: LaunchResult}.

    Sizes from measured spreads (2 cores, 2026-11-25): one device's warm step moves by
    up to 15 % from one run to the next, seconds apart, and by 25 % from step to step;
    a global batch of 512 (45 ms a step on one device, against 2-5 ms of all-reduce and
    waiting for buckets) and 18 warm steps keep the 2-device speed-up at 1.36-1.65x
    (median 1.55x) run after run, and at 1.39-1.75x with two busy loops beside it."""
    from ..hardware import devices_alike
    from ..torch import data_parallel as dp
    # every count on one kind of device: one device on a GPU against two simulated on the
    # CPU would compare a GPU with the CPU
    return {n: launch(dp.train_data_parallel, n, devices=on, kwargs=dict(
        mode="ddp", model="conv_stack", global_batch=global_batch, steps=steps, lr=0.05))
        for n, on in devices_alike(counts).items()}


def scaling_numbers(runs: dict, skip: int = 2) -> dict:
    """What lesson 05.data_parallel_scales reads from ``scaling_runs``, per device count:
    the median warm step, rank 0's compute and wait for buckets per step, and the ranks'
    share of time waiting for a core; and this machine's cores and load average (the
    runnable processes over the last minute, other programs' included)."""
    import os

    import numpy as np
    out = {}
    for n, run in runs.items():
        tl = run.timeline
        warm = len(tl.step_windows("forward", rank=0)) - skip
        secs = tl.step(skip, count=warm, rank=0).seconds_by_kind(0)
        out[n] = {"step_s": float(np.median(run.results[0]["step_s"][skip:])),
                  "compute_s": secs["compute"] / warm, "wait_s": secs["wait"] / warm,
                  "core_wait": lessons.core_wait_share(tl, range(n))}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {"devices": out, "cores": cores or 1, "load": load}


def _scaling_experiment() -> dict:
    return scaling_numbers(scaling_runs())


@lessons.lesson("05.data_parallel_scales",
                "with a core for every device, data parallel on 2 devices takes a step at least "
                "1.25x faster than one device on the same global batch (the ideal is 2x; "
                "the all-reduce, the ranks' other threads and the machine's other work "
                "take part of it)",
                _scaling_experiment)
def data_parallel_scales(m: dict):
    d = m["devices"]
    one = d[1]["step_s"]
    figures = ", ".join(f"{n} device{'s' * (n > 1)} {one / x['step_s']:.2f}x"
                        for n, x in d.items() if n > 1) + " one device (median warm step)"
    two = d[2]
    share = two["compute_s"] / d[1]["compute_s"]
    why = (f"on 2 devices rank 0 computed its half batch in {share:.0%} of one device's "
           f"time for the whole batch (ideal 50 %), waited {two['wait_s'] * 1e3:.1f} ms a step "
           f"for the gradient buckets, and the ranks spent {two['core_wait']:.0%} of their time "
           "waiting for a core (their main threads); "
           f"the machine's load average was {m['load']:.1f} on {m['cores']} cores")
    if m["cores"] < 2:
        why = f"this machine has {m['cores']} core, not one per device; " + why
    return one / two["step_s"] >= 1.25, figures, why
