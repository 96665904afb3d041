"""Lab 05 (labs/05_mirrored.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

from ..launcher import LaunchResult, launch
from .exercise import Exercise, check, register, run_on_ranks  # noqa: F401 (labNN.check)
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
