"""Lab 10's exercises: the online-softmax merge of ring attention, and where sequence
parallelism's all-gather and reduce-scatter go in the MLP. Each check says what is
wrong in words and returns the function the lab goes on with: the learner's when it is
right, the reference otherwise."""
from __future__ import annotations

from .exercise import check_with, fallback, run_on_ranks


# ------------------------------------------------------------------ 10.1: the merge
def merge_partials(out_a, lse_a, out_b, lse_b):
    """The reference: attention over keys A and B from attention over each alone
    (outputs (..., t, d), log-sum-exps of the scores (..., t)). Each part's softmax
    divided by its own sum; the whole one divides by both sums, so each output is
    reweighted by its share exp(lse_part - lse_whole) (Milakov and Gimelshein 2018)."""
    import torch
    lse = torch.logaddexp(lse_a, lse_b)
    return (torch.exp(lse_a - lse).unsqueeze(-1) * out_a
            + torch.exp(lse_b - lse).unsqueeze(-1) * out_b), lse


def _partial(q, k, v):
    """Attention of q over k, v alone, and the log-sum-exp of its scores."""
    import torch
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse


def _merge_cases():
    """(name, q, k, v, where the keys split): ordinary scores; scores so large that
    exp(lse) overflows float32; and a causal first block, whose queries see none of
    the second part's keys (its lse is -inf)."""
    import torch
    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(2, 4, 8, 16, generator=gen) for _ in range(3))
    return [("ordinary scores", q, k, v, None), ("large scores", 40 * q, 40 * k, v, None),
            ("a causal first block", q, k, v, "causal")]


def _merge_problem(fn) -> str | None:
    import torch
    for name, q, k, v, how in _merge_cases():
        half = k.shape[-2] // 2
        a = _partial(q, k[..., :half, :], v[..., :half, :])
        if how == "causal":          # no query of this block sees the later keys
            b = (torch.zeros_like(a[0]), torch.full_like(a[1], float("-inf")))
            want = a
        else:
            b = _partial(q, k[..., half:, :], v[..., half:, :])
            want = _partial(q, k, v)
        got = fn(a[0], a[1], b[0], b[1])
        if not (isinstance(got, tuple) and len(got) == 2):
            return "return two things: the merged output and the merged log-sum-exp."
        out, lse = got
        if not torch.isfinite(out).all():
            return (f"{name}: the output has inf or NaN. exp of a log-sum-exp overflows "
                    "float32 past about 88: subtract the larger one first (torch.logaddexp "
                    "does), and let exp(-inf) give 0.")
        if torch.allclose(out, (a[0] + b[0]) / 2, atol=1e-5) and how is None:
            return ("you averaged the two outputs. Each part's softmax divided by its own "
                    "sum; weight each output by its share, exp(lse_part - lse_whole).")
        if not torch.allclose(lse, want[1], atol=1e-4):
            return (f"{name}: the log-sum-exp is wrong. The whole sum of exponentials is "
                    "the sum of the two parts' sums: lse = log(exp(lse_a) + exp(lse_b)).")
        if not torch.allclose(out, want[0], atol=1e-5):
            return (f"{name}: the output differs from attention over all the keys by "
                    f"{(out - want[0]).abs().max():.2e}: weight out_a by exp(lse_a - lse), "
                    "out_b by exp(lse_b - lse).")
    return None


def check_merge(fn):
    """Check the learner's merge on three cases against attention over every key."""
    return check_with("merge_partials", fn, _merge_problem, merge_partials,
                      "on ordinary scores, on scores whose exponentials overflow float32, and "
                      "on a causal block that sees nothing of the second part, your merge "
                      "equals attention over all the keys.")


# ------------------------------------------------------------------ 10.2: SP's MLP
def sp_mlp(x_part, fc1, fc2, group=None):
    """The reference: the MLP of a sequence-parallel block. ``x_part``: this rank's
    positions (seq/n, batch, d); fc1 holds this rank's columns (d -> 4d/n), fc2 its rows
    (4d/n -> d, no bias). Returns this rank's positions of the output."""
    import torch
    import torch.nn.functional as F

    from ..torch import comm
    whole = torch.cat(comm.all_gather(x_part.contiguous(), group=group), dim=0)
    partial = fc2(F.gelu(fc1(whole)))          # every position, this rank's hidden units
    return comm.reduce_scatter(partial.contiguous(), group=group)


SEQ, BATCH, WIDTH = 16, 2, 32


def _mlp_ranks(rank: int, world_size: int, fn) -> dict:
    import torch
    from torch import nn

    from ..trace import COMM, recorder
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(SEQ, BATCH, WIDTH, generator=gen)
    dense1, dense2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH, bias=False)
    with torch.no_grad():
        for p in (*dense1.parameters(), dense2.weight):
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        want = dense2(torch.nn.functional.gelu(dense1(x)))
        h, s = 4 * WIDTH // world_size, SEQ // world_size
        fc1, fc2 = nn.Linear(WIDTH, h), nn.Linear(h, WIDTH, bias=False)
        fc1.weight.copy_(dense1.weight[rank * h:(rank + 1) * h])
        fc1.bias.copy_(dense1.bias[rank * h:(rank + 1) * h])
        fc2.weight.copy_(dense2.weight[:, rank * h:(rank + 1) * h])
        rec = recorder()
        before = len(rec.spans())
        got = fn(x[rank * s:(rank + 1) * s].clone(), fc1, fc2)
    ops = [sp.name for sp in rec.spans()[before:] if sp.kind == COMM]
    return {"got": None if got is None else got.numpy().copy(), "ops": ops,
            "want": want[rank * s:(rank + 1) * s].numpy(), "whole": want.numpy()}


def _mlp_problem(results) -> str | None:
    import numpy as np
    first = results[0]
    if first["got"] is None:
        return "the function returned nothing: return this rank's positions of the output."
    ops = " ".join(first["ops"])
    if first["got"].shape == first["whole"].shape:
        return ("every rank returned every position. In sequence parallelism a rank keeps "
                "only its positions: reduce-scatter the partial sums instead of all-reducing "
                "them.")
    if "all_gather" not in ops:
        return ("no all-gather. This rank holds a quarter of the hidden units, and the "
                "others need them for its positions too: gather every position first.")
    if "reduce_scatter" not in ops:
        return ("no reduce-scatter. fc2's outputs are partial sums over this rank's hidden "
                "units: add them across the ranks, each rank keeping its positions.")
    if ops.index("all_gather") > ops.index("reduce_scatter"):
        return "the all-gather comes before fc1, the reduce-scatter after fc2."
    if any(not np.allclose(r["got"], r["want"], atol=1e-5) for r in results):
        return ("the output differs from the whole MLP at this rank's positions: gather "
                "along dim 0 (the sequence) in rank order, and apply gelu between fc1 and fc2.")
    return None


def check_sp_mlp(fn, world_size: int = 4):
    """Run the learner's ``sp_mlp`` on ``world_size`` real ranks against the whole MLP;
    say which collective is missing or misplaced."""
    import torch
    try:                       # an unfilled exercise is found without starting any rank
        fn(torch.zeros(1, 1, 1), None, None)
    except NotImplementedError:
        print("[sp_mlp] not attempted yet: the lab goes on with the reference solution.")
        return fallback(sp_mlp)
    except Exception:  # noqa: BLE001 - it needs the ranks: run it there
        pass
    results = run_on_ranks("sp_mlp", _mlp_ranks, fn, world_size)
    if results is None:
        return fallback(sp_mlp)
    problem = _mlp_problem(results)
    if problem:
        print(f"[sp_mlp] not yet right: {problem}\nThe lab goes on with the reference.")
        return fallback(sp_mlp)
    print(f"[sp_mlp] correct: on {world_size} real ranks each rank's output equals the whole "
          f"MLP at its positions, with {', '.join(results[0]['ops'])}.")
    return fn
