"""Lab 11's exercises: the dispatch's permutation and its inverse, and an expert's
capacity. Each check says what is wrong in words and returns the function the lab goes
on with: the learner's when it is right, the reference otherwise."""
from __future__ import annotations

from .exercise import check_with


def _cases():
    """(name, experts_of (tokens, k), experts): a random routing, a router that sends
    everything to one expert, and one token."""
    import torch
    gen = torch.Generator().manual_seed(11)
    random = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(40)])
    hot = torch.stack([torch.tensor([3, e]) for e in (0, 1, 2, 4, 5, 6, 7, 0, 1, 2)])
    return [("a random routing", random, 8), ("one hot expert", hot, 8),
            ("one token", torch.tensor([[5, 2]]), 8)]


# ------------------------------------------------------------------ 11.1: the dispatch
def dispatch(experts_of, experts: int):
    """The reference: (order, counts, inverse). ``order`` lists the flattened
    assignments (token · k + choice) grouped by expert, each group in token order;
    ``counts`` the assignments per expert (what the all-to-all's sizes come from);
    ``inverse`` puts the rows back: rows[order][inverse] == rows."""
    import torch
    flat = experts_of.reshape(-1)
    order = torch.argsort(flat, stable=True)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order))
    return order, torch.bincount(flat, minlength=experts), inverse


def _dispatch_problem(fn) -> str | None:
    import torch
    for name, experts_of, experts in _cases():
        got = fn(experts_of.clone(), experts)
        if not (isinstance(got, tuple) and len(got) == 3):
            return "return three things: order, counts and inverse."
        order, counts, inverse = (torch.as_tensor(t) for t in got)
        flat = experts_of.reshape(-1)
        if sorted(order.tolist()) != list(range(len(flat))):
            return (f"{name}: order is not a permutation of the {len(flat)} assignments "
                    "(token · k + choice): each must appear once.")
        if not torch.equal(flat[order], flat.sort(stable=True).values):
            return (f"{name}: after order, the assignments are not grouped by expert; "
                    "sort the flattened experts_of (torch.argsort).")
        if not torch.equal(order, torch.argsort(flat, stable=True)):
            return (f"{name}: within an expert, keep the assignments in token order "
                    "(argsort(..., stable=True)), as the combine expects them back.")
        if counts.tolist() != torch.bincount(flat, minlength=experts).tolist():
            return (f"{name}: counts must hold, for each of the {experts} experts, how "
                    "many assignments it takes (torch.bincount with minlength), zeros included.")
        rows = torch.arange(len(flat)) * 10
        if not torch.equal(rows[order][inverse], rows):
            return (f"{name}: inverse does not undo order: set inverse[order] = "
                    "arange(len(order)).")
    return None


def check_dispatch(fn):
    """Check the learner's dispatch on three routings."""
    return check_with("dispatch", fn, _dispatch_problem, dispatch,
                      "on a random routing, a hot expert and one token, your order groups the "
                      "assignments by expert in token order, your counts size the all-to-all, "
                      "and your inverse puts the rows back.")


# ------------------------------------------------------------------ 11.2: capacity
def kept(experts_of, experts: int, capacity: int):
    """The reference: which (token, choice) assignments the experts take, at most
    ``capacity`` each, every token's first choice before any second one, then in token
    order (GShard's priority)."""
    from ..torch.moe import kept_assignments
    return kept_assignments(experts_of, experts, capacity)


def _capacity_problem(fn) -> str | None:
    import torch
    for name, experts_of, experts in _cases():
        for capacity in (1, 2, 5):
            got = torch.as_tensor(fn(experts_of.clone(), experts, capacity)).bool()
            want = kept(experts_of, experts, capacity)
            if got.shape != want.shape:
                return (f"{name}: return a mask of experts_of's shape {tuple(want.shape)} "
                        f"(token, choice), got {tuple(got.shape)}.")
            if torch.equal(got, want):
                continue
            taken = torch.bincount(experts_of[got], minlength=experts)
            if int(taken.max()) > capacity:
                return (f"{name}, capacity {capacity}: an expert takes {int(taken.max())} "
                        "assignments; none may take more than the capacity.")
            if int(got.sum()) < int(want.sum()):
                return (f"{name}, capacity {capacity}: {int(want.sum() - got.sum())} "
                        "assignments dropped that fit: keep every one until its expert is full.")
            return (f"{name}, capacity {capacity}: the right number kept, but not the right "
                    "ones: first choices go before any second choice, then in token order "
                    "(walk experts_of column by column).")
    return None


def check_capacity(fn):
    """Check the learner's capacity mask on three routings and three capacities."""
    return check_with("kept", fn, _capacity_problem, kept,
                      "on three routings and capacities 1, 2 and 5 your experts take first "
                      "choices before second ones, in token order, never past their capacity.")
