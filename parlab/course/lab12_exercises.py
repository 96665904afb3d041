"""Lab 12's exercise: write ZB-H1's order. The check says what is wrong in words and
returns the function the lab goes on with: the learner's when it is right, the reference
otherwise; then the order runs for real on 4 ranks and is compared with one device."""
from __future__ import annotations

from .exercise import check_with

CASES = ((2, 4), (3, 6), (4, 8), (4, 5))


def zb_h1(stages: int, micro_batches: int):
    """The reference: ``pipeline_orders.zb_h1``, as per-stage lists of ("F" | "B" | "W", i)."""
    from ..pipeline_orders import zb_h1 as reference
    return [[op[:2] for op in ops] for ops in reference(stages, micro_batches)]


def _problem(fn) -> str | None:
    from .. import pipeline, pipeline_orders
    for p, m in CASES:
        ops = fn(p, m)
        where = f"for {p} stages and {m} micro-batches"
        try:
            pipeline.check(ops, p, m)
        except ValueError as exc:
            return f"{where}: {exc}"
        missing = [s for s, stage in enumerate(ops)
                   if sorted(i for kind, i, *_ in stage if kind == "W") != list(range(m))]
        if missing:
            return (f"{where}: stage {missing[0]} must run W of every micro-batch once: "
                    "ZB-H1 splits every backward into B and W.")
        peaks = pipeline.peak_in_flight(ops)
        if max(peaks) > min(p, m):
            return (f"{where}: the stages hold {peaks} micro-batches at their peak (F done, W "
                    f"not yet); ZB-H1 holds at most {min(p, m)}, 1F1B's peak. Run a W as soon "
                    "as a stage has deferred as many as its position in the pipeline.")
        mine = pipeline.bubble_share(pipeline.simulate(ops, p, m, 1.0, 2.0))
        want = pipeline_orders.bubble("zb-h1", p, m)
        if mine > want + 1e-9:
            return (f"{where}: on paper (F, B and W one unit each) the bubble is {mine:.1%}, "
                    f"ZB-H1's is {want:.1%}. Stage s warms up with p - s - 1 forwards, then "
                    "runs F, B and, once it has deferred s of them, the oldest W.")
    return None


def check_zb_h1(fn):
    """Check the learner's ZB-H1 order on four pipelines."""
    return check_with("zb-h1", fn, _problem, zb_h1,
                      f"on {len(CASES)} pipelines your order is complete, never deadlocks, "
                      "holds no more than 1F1B at its peak, and leaves ZB-H1's bubble.")


def run_order(fn, cfg, *, devices=None, micro_batches: int = 8, timeout: float = 120.0):
    """The learner's order (or the reference) trained for real on 4 ranks with ``cfg``
    (a ``SplitConfig``) beside one device: the largest difference in loss, gradients and
    weights."""
    from ..launcher import launch
    from ..metrics import largest_difference
    from ..torch import pipeline_chunks, split
    cfg, ops = pipeline_chunks.prepare(cfg, 4, micro_batches, fn(4, micro_batches))
    out = launch(pipeline_chunks.train_chunked, 4, devices=devices,
                 args=(cfg, micro_batches, ops), timeout=timeout).results
    ref = split.train_reference(cfg)
    grads = {k: v for r in out for k, v in r["first_grads"].items()}
    state = {k: v for r in out for k, v in r["state"].items()}
    losses = [x for r in out for x in r["losses"]]
    return max(largest_difference(zip(losses, ref["losses"])),
               largest_difference((grads[k], v) for k, v in ref["first_grads"].items()),
               largest_difference((state[k], v) for k, v in ref["state"].items()))


# ------------------------------------------------------------------ 12.2: B and W apart
def split_backward(x, dy, weight):
    """The reference: a linear layer y = x Aᵀ + b's backward in two: B gives the input's
    gradient dx = dy A; W gives the weights' gradients dA = dyᵀ x and db = Σ dy."""
    return dy @ weight, dy.T @ x, dy.sum(0)


def _split_problem(fn) -> str | None:
    import torch
    gen = torch.Generator().manual_seed(12)
    for rows, n_in, n_out in ((5, 3, 4), (16, 32, 8), (1, 7, 7)):
        x = torch.randn(rows, n_in, generator=gen, requires_grad=True)
        layer = torch.nn.Linear(n_in, n_out)
        dy = torch.randn(rows, n_out, generator=gen)
        layer(x).backward(dy)
        got = fn(x.detach(), dy, layer.weight.detach())
        if not (isinstance(got, tuple) and len(got) == 3):
            return "return three tensors: dx, dA and db."
        dx, dw, db = (torch.as_tensor(t) for t in got)
        size = f"for {rows} rows of {n_in} inputs and {n_out} outputs"
        for name, mine, want, how in (
                ("dx", dx, x.grad, "dy @ A: each input's gradient sums the outputs' through A"),
                ("dA", dw, layer.weight.grad, "dyᵀ @ x: one outer product per row, summed"),
                ("db", db, layer.bias.grad, "dy summed over the rows")):
            if tuple(mine.shape) != tuple(want.shape):
                return f"{size}: {name} has shape {tuple(mine.shape)}, want {tuple(want.shape)} ({how})."
            if not torch.allclose(mine, want, atol=1e-5):
                return f"{size}: {name} differs from autograd's by {float((mine - want).abs().max()):.2g} ({how})."
    return None


def check_split_backward(fn):
    """Check the learner's B and W of a linear layer against autograd on three layers."""
    return check_with("split backward", fn, _split_problem, split_backward,
                      "on three layers your dx, dA and db equal autograd's: B needs only the "
                      "weights and dy, W only x and dy, so W can wait.")
