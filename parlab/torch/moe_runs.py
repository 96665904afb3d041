"""Runs of the course's mixture of experts (``parlab.torch.moe``) that a lab can show.

* ``balance_over_training``: the classifier trained on one device with Adam, once per
  weight of Switch's balance loss (Fedus et al. 2021, eq. 4), recording per step how many
  assignments each expert took. Without the loss the router piles tokens onto a few
  experts (the self-reinforcing imbalance Shazeer et al. 2017 describe: favoured experts
  train faster and are chosen more); with it the histogram flattens.
* ``capacity_sweep``: one trained router, each capacity factor in turn (GShard, Lepikhin
  et al. 2020): the share of assignments dropped, the test loss and accuracy, and the
  step time.
* ``train_ep_dp``: expert parallelism × data parallelism on a mesh (``init_mesh(dp=, ep=)``),
  as DeepSpeed-MoE (Rajbhandari et al. 2022) and GShard lay it out: the experts sharded
  over each ep line and replicated over the dp lines, everything else replicated on every
  rank. ``expected_bytes_per_axis`` gives what each axis carries per step.
"""
from __future__ import annotations

import copy
import statistics
import time
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from .. import data as datasets
from . import runtime, training
from .groups import as_group
from .mesh import init_mesh
from .moe import (Classifier, MoEConfig, build, expected_all_to_all_bytes,
                  expert_parallel_model, replicated_parameters, train_steps)

F32, I64 = 4, 8                      # bytes of a float32 and of an int64

# Measured (docs/moe.md, seeds 0-2): with these, no balance loss leaves the busiest expert
# 2.4-4.0x the mean over the last 10 steps, a weight of 0.1 brings it to 1.4-1.5x.
# Switch's 0.01 is tuned for long runs over many tokens; in 100 steps here it barely acts.
BALANCE_CFG = MoEConfig()
BALANCE_WEIGHTS = (0.0, 0.1)


# ------------------------------------------------------------------ one device
def imbalance(per_expert) -> float:
    """The busiest expert's assignments over the mean: 1 is even; E / k at worst for
    top k of E (each token reaches an expert at most once, so at most all the tokens)."""
    counts = torch.as_tensor(per_expert, dtype=torch.float64)
    return (counts.max() / counts.mean()).item()


def _test_set():
    x, y = datasets.digits("test")
    return torch.as_tensor(x), torch.as_tensor(y)


def _evaluate(model: Classifier, batch_size: int) -> dict:
    """Test loss, accuracy and the share of assignments dropped, in batches of
    ``batch_size`` (capacity is counted per batch, as in training)."""
    x, y = _test_set()
    loss = correct = dropped = 0.0
    k = model.moe.cfg.top_k
    with torch.no_grad():
        for start in range(0, len(y), batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            logits, _, per_expert = model(xb)
            loss += F.cross_entropy(logits, yb, reduction="sum").item()
            correct += (logits.argmax(-1) == yb).sum().item()
            dropped += len(yb) * k - per_expert.sum().item()
    return {"test_loss": loss / len(y), "test_accuracy": correct / len(y),
            "dropped_share": dropped / (len(y) * k)}


def baseline_accuracy() -> float:
    """The trivial classifier's test accuracy: always the training set's commonest digit."""
    _, y_train = datasets.digits("train")
    _, y = _test_set()
    return (y == int(np.bincount(y_train).argmax())).float().mean().item()


def _train_adam(model: Classifier, cfg: MoEConfig, steps: int, batch_size: int, lr: float,
                record: dict | None = None) -> list[float]:
    """Adam on the digits for ``steps``; per step into ``record`` (if given): the
    assignments per expert, their imbalance, the task and balance losses. Returns each
    step's wall-clock seconds."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    batches = training.digit_batches("mlp", batch_size)
    seconds = []
    for _ in range(steps):
        x, y = training.on_device(*next(batches), "cpu")
        start = time.perf_counter()
        opt.zero_grad()
        logits, aux, per_expert = model(x)
        task = F.cross_entropy(logits, y)
        (task + cfg.aux_weight * aux).backward()
        opt.step()
        seconds.append(time.perf_counter() - start)
        if record is not None:
            record["per_expert"].append(per_expert.tolist())
            record["imbalance"].append(imbalance(per_expert))
            record["task_loss"].append(task.item())
            record["balance_loss"].append(aux.item())
    return seconds


def _routing_weights(model: Classifier) -> dict:
    """What decides where a token goes: the layer in and the router (numpy, by name)."""
    return {k: v for k, v in training.state_numpy(model).items()
            if k.startswith(("inp.", "moe.router."))}


def balance_over_training(cfg: MoEConfig = BALANCE_CFG, steps: int = 100,
                          batch_size: int = 64, balance_weights=BALANCE_WEIGHTS,
                          seed: int = 0, lr: float = 3e-3) -> dict:
    """The classifier trained with Adam on one device once per balance-loss weight, from
    the same initial weights and batches.

    Returns {weight: run} and "baseline" (the commonest digit's test accuracy), each run
    with, per step: "per_expert" (assignments each expert took), "imbalance" (their
    max / mean), "task_loss" (cross-entropy), "balance_loss" (Switch's, 1 when even);
    at the end "test_accuracy", "test_loss" and "router" (the layer in's and the router's
    weights, which decide the routing). ``cfg.aux_weight`` is replaced by each weight. About 2.5 s a run on 2 cores.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be at least 1, got {steps} and "
                         f"{batch_size}")
    out = {"baseline": baseline_accuracy()}
    for weight in balance_weights:
        if weight < 0:
            raise ValueError(f"balance_weights must not be negative, got {weight}")
        run_cfg = replace(cfg, aux_weight=weight)
        model = build(run_cfg, seed)
        record = {"per_expert": [], "imbalance": [], "task_loss": [], "balance_loss": []}
        _train_adam(model, run_cfg, steps, batch_size, lr, record)
        evaluated = _evaluate(model, batch_size)
        record.update(test_accuracy=evaluated["test_accuracy"],
                      test_loss=evaluated["test_loss"], router=_routing_weights(model))
        out[weight] = record
    return out


def capacity_sweep(cfg: MoEConfig = replace(BALANCE_CFG, aux_weight=0.0),
                   factors=(None, 2.0, 1.5, 1.25, 1.0, 0.75, 0.5), *, train_steps: int = 100,
                   batch_size: int = 64, timed_steps: int = 10, seed: int = 0,
                   lr: float = 3e-3) -> list[dict]:
    """One router trained without a capacity limit (``cfg``'s balance weight, by default
    none, so that it is uneven), then every capacity factor applied to it in turn.

    One dict per factor: "capacity_factor", "capacity" (assignments an expert may take
    from a batch of ``batch_size``; None: no limit), "dropped_share" (of the test set's
    assignments), "test_loss" and "test_accuracy" of the fixed trained model under that
    capacity, and "step_s": the median of ``timed_steps`` further training steps of a copy
    with that capacity, after one warm-up step. The step times are wall-clock timings on
    a shared CPU: a benchmark-style reading, noisy, never asserted in tests.
    """
    for f in factors:
        if f is not None and not f > 0:
            raise ValueError(f"capacity factors must be positive or None (no limit), got {f}")
    if timed_steps < 1:
        raise ValueError(f"timed_steps must be at least 1, got {timed_steps}")
    trained = build(replace(cfg, capacity_factor=None), seed)
    _train_adam(trained, trained.moe.cfg, train_steps, batch_size, lr)
    out = []
    for factor in factors:
        model = copy.deepcopy(trained)
        model.moe.cfg = replace(cfg, capacity_factor=factor)
        row = {"capacity_factor": factor, "capacity": model.moe.capacity(batch_size)}
        row.update(_evaluate(model, batch_size))
        seconds = _train_adam(model, model.moe.cfg, timed_steps + 1, batch_size, lr)
        row["step_s"] = statistics.median(seconds[1:])
        out.append(row)
    return out


# ------------------------------------------------------------------ ep × dp on a mesh
def check_ep_dp(cfg: MoEConfig, world_size: int, batch_size: int, ep: int, dp: int) -> None:
    """A ValueError saying what to change, before any group is built."""
    if ep < 1 or dp < 1 or ep * dp != world_size:
        raise ValueError(f"ep × dp must equal the number of ranks: ep={ep} × dp={dp} = "
                         f"{ep * dp}, but {world_size} ranks run; launch {ep * dp} ranks or "
                         f"choose ep and dp whose product is {world_size}")
    if cfg.experts % ep:
        fits = [d for d in range(1, cfg.experts + 1) if cfg.experts % d == 0]
        raise ValueError(f"{cfg.experts} experts do not split over ep={ep} ranks: use ep in "
                         f"{fits} or a multiple of {ep} experts")
    if batch_size % world_size:
        raise ValueError(f"a batch of {batch_size} does not split over {world_size} ranks: "
                         f"use a multiple of {world_size}")
    if cfg.capacity_factor is not None:
        raise ValueError("expert parallelism here applies no capacity: set "
                         "MoEConfig(capacity_factor=None)")


def _count_own_assignments(model: Classifier, into: list) -> None:
    """Record, each forward, the assignments per expert of this rank's own tokens (the
    routing the all-to-alls carry), computed as ``moe.route`` does, with no message."""
    k, experts = model.moe.cfg.top_k, model.moe.cfg.experts

    def hook(router, inputs, logits):
        chosen = logits.detach().softmax(-1).topk(k, dim=-1).indices
        into.append(torch.bincount(chosen.reshape(-1), minlength=experts).tolist())

    model.moe.router.register_forward_hook(hook)


def train_ep_dp(rank: int, world_size: int, cfg: MoEConfig = MoEConfig(),
                batch_size: int = 64, steps: int = 3, lr: float = 0.1, seed: int = 0,
                ep: int = 2, dp: int = 2) -> dict:
    """Rank function: ``moe.train_reference``'s training on an ep × dp mesh.

    The ep axis is last, so its ranks are neighbours (the all-to-alls talk most). Each
    rank takes its own rows of every batch (its dp line's share, then its ep line's
    share of that), holds E / ep experts, and runs the all-to-alls within its ep line.
    The balance loss and the counts are the whole batch's (over every rank). After the
    backward pass the expert weights' gradients are summed over the dp line (the replicas
    of the same experts), the replicated weights' over every rank (each computed a share
    of them), as DeepSpeed-MoE sums expert and non-expert gradients over different groups.

    Returns "losses" (the whole batch's), "per_expert" (assignments each expert took of
    the whole batch), "routing" (those of this rank's tokens), per step; "first_grads" and
    "weights" of what the rank holds, named as in the dense model; "coords".
    """
    check_ep_dp(cfg, world_size, batch_size, ep, dp)
    mesh = init_mesh(dp=dp, ep=ep)
    ep_line, dp_line, everyone = mesh.line("ep"), mesh.line("dp"), as_group(None)
    device = runtime.rank_device()
    model = expert_parallel_model(cfg, seed, ep_line, balance_group=everyone).to(device)
    experts = list(model.moe.experts.parameters())
    replica = dp_line.rows(batch_size, "global batch")
    mine = ep_line.rows(batch_size // dp, "replica's batch")
    rows = slice(replica.start + mine.start, replica.start + mine.stop)
    out = {"routing": [], "coords": {a: mesh.coord(a) for a in mesh.axes}}
    _count_own_assignments(model, out["routing"])

    def sync(model):
        training.all_reduce_gradients(replicated_parameters(model), everyone,
                                      name="all_reduce (replicated gradients)")
        if dp > 1:
            for p in experts:     # an expert no token of this line reached: its share
                if p.grad is None:   # is zero, but its replica may have one to add
                    p.grad = torch.zeros_like(p)
            training.all_reduce_gradients(experts, dp_line,
                                          name="dp all_reduce (expert gradients)")

    return train_steps(model, cfg, batch_size, steps, lr, rows, sync, everyone, out)


def replicated_parameter_count(cfg: MoEConfig) -> int:
    """Parameters every rank holds whole: the layer in, the router, the layer out."""
    return ((cfg.d_in + 1) * cfg.d_model + cfg.d_model * cfg.experts
            + (cfg.d_model + 1) * cfg.classes)


def expert_parameter_count(cfg: MoEConfig) -> int:
    """Parameters of one expert: its two layers, with biases."""
    return (cfg.d_model + 1) * cfg.d_ff + (cfg.d_ff + 1) * cfg.d_model


def expected_bytes_per_axis(cfg: MoEConfig, routing, rank: int, ep: int = 2,
                            dp: int = 2) -> dict[str, int]:
    """Bytes ``rank`` hands to collectives in one step of ``train_ep_dp``, per mesh axis,
    counted as ``comm`` counts them (each call by its input).

    routing: for every global rank in order, the assignments per expert of its own tokens
    that step (``train_ep_dp``'s "routing").

    * "ep": the all-to-alls within the rank's ep line, as for plain expert parallelism
      (``moe.expected_all_to_all_bytes``, counts included), from the routing of the
      line's ranks only: the rank's experts receive only its line's tokens.
    * "dp": the sum of its E / ep experts' gradients over its dp line (none when dp = 1).
    * "world" (every rank, no mesh axis): the replicated weights' gradients, the balance
      loss's counts (int64) and probability sums (float32) per expert, and the loss
      reported.
    """
    if len(routing) != ep * dp:
        raise ValueError(f"routing must give {ep * dp} ranks' counts (ep={ep} × dp={dp}), "
                         f"got {len(routing)}")
    line = range(rank - rank % ep, rank - rank % ep + ep)      # ep varies fastest
    group_counts = [sum(routing[r][e] for r in line) for e in range(cfg.experts)]
    tokens_here = sum(routing[rank]) // cfg.top_k
    ep_bytes = expected_all_to_all_bytes(cfg, tokens_here, group_counts, rank % ep, ep)
    local = cfg.experts // ep
    dp_bytes = 0 if dp == 1 else local * expert_parameter_count(cfg) * F32
    world = (replicated_parameter_count(cfg) * F32 + cfg.experts * I64 + cfg.experts * F32
             + F32)
    return {"ep": ep_bytes, "dp": dp_bytes, "world": world}
