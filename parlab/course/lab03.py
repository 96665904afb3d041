"""Lab 03 (labs/03_vertical_slicing.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

from .exercise import Exercise, check, register, run_on_ranks  # noqa: F401 (labNN.check)
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
