"""Lab 10 (labs/10_transformer.ipynb): a small GPT split by heads, by positions and by
chunks of the sequence; what its notebook runs, its lessons and its exercises."""
from __future__ import annotations

from ..launcher import LaunchResult, launch
from ..metrics import largest_difference
from . import lessons, replays
from .exercise import Exercise, check, register, run_on_ranks  # noqa: F401 (lab10.check)
from .lab10_exercises import check_merge, check_sp_mlp  # noqa: F401 (lab10.check_merge)
from .lab10_scale import plot_ring_at_scale, print_ring_at_scale, ring_at_scale  # noqa: F401
from .replays import replayed  # noqa: F401 (lab10.replayed: a run on dedicated devices)

LABELS = {"one device": "one device", "tp": "tensor parallel", "sp": "tensor + sequence parallel",
          "cp_contiguous": "context parallel, contiguous", "cp_zigzag": "context parallel, zig-zag",
          "library": "DTensor tensor parallel"}

BATCH, STEPS = 4, 3
TOL = 1e-5                  # float32: the same sums, added in another order
LEARN_STEPS = 150
BELOW_UNIGRAM = 0.5         # lesson 10.model_learns: held-out nats at least this far below
# lesson 10.zigzag_balances_the_ring: zig-zag's busiest / idlest rank at most BALANCED
# (even by construction; the CPU time of 4 ranks sharing 2 cores keeps some of their
# cache and frequency effects: measured 1.01-1.13 with and without busy loops beside),
# contiguous's at least UNBALANCED, and contiguous's busiest rank at least QUICKER
# times zig-zag's (a causal ring's busiest rank does (2n - 1)/n of the mean: 1.75x at n = 4)
BALANCED, UNBALANCED, QUICKER = 1.15, 2.0, 1.25


def library_plan() -> dict:
    """The split declared for ``torch.distributed.tensor.parallel``, layer by layer
    (``transformer_tp.library_plan``)."""
    from ..torch.transformer_tp import library_plan as plan
    return plan(config())


def config():
    """The lab's transformer: 2 blocks of width 128, 4 heads, 512 positions (long enough
    that a zig-zag ring's attention tiles outweigh their fixed costs), a vocabulary of
    256 (``transformer.GPTConfig``)."""
    from ..torch.transformer import GPTConfig
    return GPTConfig(vocab=256, seq_len=512, d_model=128, heads=4, layers=2)


def learn(steps: int = LEARN_STEPS) -> dict:
    """The model trained on the generated language on one device
    (``transformer.learn_language``)."""
    from ..torch.transformer import learn_language
    return learn_language(steps=steps)


def run_strategies(*, devices=None, cfg=None, batch_size: int = BATCH, steps: int = STEPS,
                   strategies=None, timeout: float = 240.0) -> LaunchResult:
    """Tensor, sequence and context parallelism (contiguous and zig-zag) and the
    library's tensor parallelism, one after the other in one launch of 4 ranks
    (``transformer_runs.train_all``), each trained from the same weights on the same
    batches."""
    from ..torch import transformer_runs
    n = devices.n if devices is not None else 4
    kwargs = dict(cfg=cfg or config(), batch_size=batch_size, steps=steps,
                  strategies=tuple(strategies or transformer_runs.STRATEGIES))
    return launch(transformer_runs.train_all, n, kwargs=kwargs, timeout=timeout, devices=devices)


def reference(cfg=None, batch_size: int = BATCH, steps: int = STEPS) -> dict:
    """The same steps on one device, the whole model (``transformer.train_reference``)."""
    from ..torch.transformer import train_reference
    return train_reference(cfg or config(), batch_size, steps)


def _settings(run: LaunchResult) -> dict:
    return run.results[0]["settings"]


def equivalence(run: LaunchResult, ref: dict) -> dict:
    """Per strategy, the largest difference to one device over every rank: in the losses,
    the first step's logits and gradients, and the weights after the last step (each
    rank against its own part of the whole model)."""
    from ..torch.transformer_tp import dense_part
    n, out = len(run.results), {}
    for name in run.results[0]:
        if name in ("seconds", "settings"):
            continue
        losses, logits, grads, weights = [], [], [], []
        for r, res in enumerate(run.results):
            got = res[name]
            if name.startswith("cp_"):
                logits.append((got["first_logits"], ref["first_logits"][:, got["positions"]]))
                part = lambda key, value: value                       # noqa: E731 (whole)
            else:
                v = ref["first_logits"].shape[-1] // n
                logits.append((got["first_logits"], ref["first_logits"][..., r * v:(r + 1) * v]))
                part = lambda key, value, r=r: dense_part(key, value, r, n)   # noqa: E731
            losses.append((got["losses"] if "losses" in got else [got["loss"]],
                           ref["losses"][:len(got.get("losses", [0]))]))
            grads += [(g, part(k, ref["first_grads"][k])) for k, g in got["first_grads"].items()]
            if "weights" in got:
                weights += [(w, part(k, ref["weights"][k])) for k, w in got["weights"].items()]
        out[name] = {"loss": largest_difference(losses), "logits": largest_difference(logits),
                     "gradients": largest_difference(grads),
                     "weights": largest_difference(weights) if weights else None}
    return out


def windows(tl, strategies) -> dict:
    """(start, end) of each strategy's part of a ``run_strategies`` timeline."""
    from ..torch.transformer_runs import variant_windows
    return variant_windows(tl, strategies)


def comm_rows(run: LaunchResult) -> dict:
    """Per strategy run by hand: the bytes rank 0 handed to communication per step,
    traced, the formula's (``expected_comm_bytes`` of each module), and what ring
    algorithms send for them (``parlab.zero.sent_bytes``; a ring pass once)."""
    from ..torch import transformer_cp, transformer_sp, transformer_tp, zero
    cfg, batch, n = _settings(run)["cfg"], _settings(run)["batch_size"], len(run.results)
    tl, rows = run.timeline, {}
    done = [s for s in _settings(run)["strategies"] if s != "library"]
    for name, window in windows(tl, done).items():
        part = tl.window(*window)
        traced = sum(s.bytes for s in part.spans if s.rank == 0 and s.kind == "comm"
                     and "between strategies" not in s.name)
        if name == "tp":
            formula = transformer_tp.expected_comm_bytes(cfg, batch)["total"]
        elif name == "sp":
            formula = transformer_sp.expected_comm_bytes(cfg, batch, n)["total"]
        else:
            formula = transformer_cp.expected_comm_bytes(cfg, batch, n)["total"]
        steps = _settings(run)["steps"]
        row = {"traced": traced / steps, "formula": formula,
               "sent": zero.bytes_per_step(tl, window, 0, n, steps)["sent"]}
        if name.startswith("cp_"):         # a ring pass is sent once, traced at both ends
            row["sent"] += sum(s.bytes for s in part.spans if s.rank == 0 and s.kind == "comm"
                               and s.name.startswith("isend")) / steps
        rows[name] = row
    return rows


def memory_rows(run: LaunchResult, ref: dict) -> dict:
    """Bytes saved for the backward pass, rank 0 against one device, per strategy
    (measured by ``saved_tensor_counter``), and the part sequence parallelism splits
    (``transformer_sp.split_activation_bytes``)."""
    from ..torch.transformer_sp import split_activation_bytes
    cfg, batch = _settings(run)["cfg"], _settings(run)["batch_size"]
    rows = {"one device": ref["saved_for_backward"]}
    rows.update({name: run.results[0][name]["saved_for_backward"]
                 for name in _settings(run)["strategies"] if name != "library"})
    return {"saved": rows, "norms_region": split_activation_bytes(cfg, batch),
            "devices": len(run.results)}


def attention_work(tl, run: LaunchResult) -> dict:
    """Per layout of context parallelism: each rank's seconds of attention tiles
    (forward and backward) in a step, read from ``tl`` (a replay: the CPU time each
    block took; the measurement: its wall time). A rank runs the same blocks in every
    step; each counts with its least disturbed duration over the steps (nothing makes a
    block quicker than its work, while a busy machine makes any of them slower)."""
    from ..torch.transformer_cp import ATTENTION, ATTENTION_BACKWARD
    layouts = [s for s in _settings(run)["strategies"] if s.startswith("cp_")]
    out = {}
    for name, window in windows(tl, layouts).items():
        part = tl.window(*window)
        work = []
        for r in sorted(part.ranks):
            steps = [[s.duration for s in part.window(a, b).spans if s.rank == r
                      and s.name in (ATTENTION, ATTENTION_BACKWARD)]
                     for a, b in part.step_windows("forward", r)]
            blocks = min(len(step) for step in steps)
            work.append(sum(min(step[i] for step in steps) for i in range(blocks)))
        out[name[3:]] = work
    return out


def _collective(span_name: str) -> str | None:
    from ..zero import op_of
    return op_of(span_name) or ("ring pass" if "(ring)" in span_name else None)


def plot_steps(run: LaunchResult, *, rank: int = 0, measured: bool = False):
    """One lane per split: ``rank``'s quickest step of each, replayed on dedicated devices
    (``measured``: as this machine ran it), transfers coloured by their collective."""
    from .. import plot
    tl = run.timeline if measured else replays.replayed(run)
    done = [s for s in _settings(run)["strategies"] if s != "library"]
    shown = replays.quickest_steps(tl, windows(tl, done), {s: LABELS[s] for s in done},
                                   rank=rank, axis_of=_collective)
    how = "measured on this machine" if measured else "replayed on dedicated devices"
    return plot.timeline(shown, color_by="axis", names=False,
                         title=f"rank {rank}, the quickest step of each split ({how})")


def plot_ring(run: LaunchResult, *, measured: bool = False):
    """Context parallelism's last step, contiguous above and zig-zag below, one lane per
    rank, replayed on dedicated devices (``measured``: as this machine ran it); the
    attention tiles in their own colour."""
    from .. import plot
    from ..sim import ReplayedTimeline
    from ..steps import quickest_step
    from ..trace import Span, Timeline
    tl = run.timeline if measured else replays.replayed(run)
    spans, labels, lane = [], {}, 0
    n = len(run.results)
    for name, window in windows(tl, ("cp_contiguous", "cp_zigzag")).items():
        step = quickest_step(tl.window(*window), skip=1)
        for r in range(n):
            spans += [Span(lane, s.kind, s.name.replace(" (backward)", ""), s.start - step.start,
                           s.end - step.start, s.bytes) for s in step.spans if s.rank == r]
            labels[lane] = f"rank {r} · {name[3:]}"
            lane += 1
    how = "measured on this machine" if measured else "replayed on dedicated devices"
    built = Timeline(spans) if measured else ReplayedTimeline(spans, notes=tl.notes)
    return plot.timeline(replays.lanes_named(built, labels), color_by="name", names=False,
                         order=("attention tile", "forward", "backward", "update"),
                         title=f"context parallelism, the quickest step of each split ({how})")


def network(cfg=None):
    """The lab's transformer as the cost model sees it (``sim.Network.decoder``): float32,
    no dropout, LayerNorm and a GELU MLP, an untied head. The sim's decoder has no
    learned position embedding: 1 % of this model's parameters."""
    from .. import sim
    cfg = cfg or config()
    return sim.Network.decoder("the lab's GPT", cfg.layers, cfg.d_model, cfg.heads, cfg.seq_len,
                               cfg.vocab, tied=False, dropout=False, act_bytes=4)


PLANS = {"one device": {}, "tp": {"tp": True}, "sp": {"tp": True, "sequence_parallel": True},
         "cp_zigzag": {"cp": True}}


def _predicted(name: str, n: int, cfg, batch: int) -> dict:
    from ..sim import split_transformer
    plan = {k: (n if v is True and k in ("tp", "cp") else v) for k, v in PLANS[name].items()}
    return split_transformer(network(cfg), batch, **plan)


def paper_block_bytes(cfg=None, batch: int = BATCH, t: int = 4) -> dict:
    """What one block keeps for the backward pass by Korthikanti et al. (2022, table 2),
    in 16-bit numbers with dropout: s·b·h·(34 + 5·a·s/h) on one device; with tensor
    parallelism over t, s·b·h·(10 + 24/t + 5·a·s/(h·t)); with sequence parallelism too,
    all of it divided by t."""
    cfg = cfg or config()
    sbh, attention = cfg.seq_len * batch * cfg.d_model, 5 * cfg.heads * cfg.seq_len / cfg.d_model
    return {"one device": sbh * (34 + attention), "tp": sbh * (10 + 24 / t + attention / t),
            "sp": sbh * (34 + attention) / t}


def memory_table(run: LaunchResult, ref: dict, plans=tuple(PLANS)) -> dict:
    """Per plan (one device, tensor, tensor + sequence, context parallel): the bytes rank 0
    saved for the backward pass (measured) and what the cost model predicts
    (``sim.split_transformer``, Korthikanti et al. 2022's count for this block; its whole
    prediction under "prediction")."""
    mem = memory_rows(run, ref)
    cfg, batch, n = _settings(run)["cfg"], _settings(run)["batch_size"], len(run.results)
    rows = {name: {"label": LABELS[name], "measured": mem["saved"][name],
                   "prediction": _predicted(name, n, cfg, batch)} for name in plans}
    for row in rows.values():
        row["predicted"] = row["prediction"]["activation_bytes"]
    return rows


def plot_memory(rows: dict):
    """Bytes saved for the backward pass per plan: measured (solid) beside predicted
    (dotted, the course's style for the cost model)."""
    from .. import plot
    plt = plot.pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.4))
    names = list(rows)
    x = range(len(names))
    color = plot.COLORS["compute"]
    ax.bar([i - 0.2 for i in x], [rows[n]["measured"] / 1e6 for n in names], 0.4,
           color=color, label="measured here")
    ax.bar([i + 0.2 for i in x], [rows[n]["predicted"] / 1e6 for n in names], 0.4,
           facecolor="white", edgecolor=color, hatch=plot.HATCHES[plot.PREDICTED],
           label="PREDICTED (parlab.sim)")
    ax.set_xticks(list(x))
    ax.set_xticklabels([rows[n]["label"].replace(", ", ",\n").replace(" + ", " +\n")
                        for n in names], fontsize=plot.FONT - 2)
    ax.set_ylabel("MB, rank 0", fontsize=plot.FONT)
    ax.set_title("saved for the backward pass: each split keeps less", fontsize=plot.FONT + 1)
    ax.legend(fontsize=plot.FONT - 2, bbox_to_anchor=(1.02, 1), loc="upper left", frameon=False)
    ax.tick_params(labelsize=plot.FONT - 2)
    fig.tight_layout()
    return plot.finish(fig)


def print_choices(run: LaunchResult, ref: dict) -> None:
    """Per split: the weights rank 0 holds, the activations it keeps for the backward
    pass and the bytes it sends per step (ring algorithms), measured on this run and
    predicted by the cost model (float32 weights)."""
    rows, comm = memory_table(run, ref), comm_rows(run)
    cfg, n = _settings(run)["cfg"], len(run.results)
    print(f"{'':<28}{'weights':>9}{'pred.':>7}{'kept':>8}{'pred.':>7}{'sent':>8}{'pred.':>7}"
          f"   MB, rank 0 of {n}: measured, and PREDICTED by parlab.sim (pred.)")
    for name in ("tp", "sp", "cp_zigzag"):
        predicted = rows[name]["prediction"]
        held = sum(w.nbytes for w in run.results[0][name]["weights"].values())
        print(f"{LABELS[name]:<28}{held / 1e6:>9.2f}{4 * predicted['params_per_rank'] / 1e6:>7.2f}"
              f"{rows[name]['measured'] / 1e6:>8.2f}{rows[name]['predicted'] / 1e6:>7.2f}"
              f"{comm[name]['sent'] / 1e6:>8.2f}{sum(predicted['sent'].values()) / 1e6:>7.2f}")
    embedding = cfg.seq_len * cfg.d_model * 4
    print(f"the cost model's GPT has no learned position embedding: {embedding / 1e6:.2f} MB "
          "of weights whole on every rank here, and their gradients")


def print_llama_choices(gpu_bytes: float = 80e9) -> None:
    """PREDICTED: Llama 3 405B on one 128K-token sequence, split 8 ways by tensor
    parallelism within a node and by context parallelism across nodes
    (``sim.context.choices``), and the split its authors published."""
    from ..sim import context
    from ..sim.published_runs_lm import llama3_2024
    print(context.table(context.choices(context.llama3_405b(), gpu_bytes=gpu_bytes),
                        title="Llama 3 405B, one 131,072-token sequence, bf16, flash attention; "
                              f"GB per GPU and step; acts fit: within {gpu_bytes / 1e9:g} GB"))
    p = next(r.setup.parallel for r in llama3_2024() if r.setup.parallel.cp > 1)
    print(f"published (Dubey et al., 2024): {p.gpus:,} GPUs as tp {p.tp} x cp {p.cp} x "
          f"pp {p.pp} x dp {p.dp}")


def plot_causal_split(n: int = 4):
    """Which rank computes each tile of causal attention (a query chunk's row against a
    key chunk's column; above the diagonal the mask leaves nothing to compute), with the
    sequence in 2n chunks: contiguous (rank r holds chunks 2r and 2r + 1) and zig-zag
    (``transformer_cp.chunks_of``). Computed, not measured."""
    import numpy as np

    from .. import plot
    from ..torch.transformer_cp import chunks_of
    plt = plot.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    colors = plt.get_cmap("viridis", n)
    for ax, layout in zip(axes, ("contiguous", "zigzag")):
        owner = np.full((2 * n, 2 * n), np.nan)
        for r in range(n):
            mine = ((2 * r, 2 * r + 1) if layout == "contiguous" else chunks_of(r, n, layout))
            for q in mine:
                owner[q, :q + 1] = r
        ax.imshow(owner, cmap=colors, vmin=-0.5, vmax=n - 0.5)
        for r in range(n):
            tiles = int(np.sum(owner == r)) - 2        # the two diagonal tiles are half masked
            ax.text(2 * n - 0.2, [q for q in range(2 * n) if owner[q, 0] == r][-1],
                    f"rank {r}: {tiles + 1}", ha="left", va="center", clip_on=False,
                    fontsize=plot.FONT - 3)
        ax.set_title(layout.replace("zigzag", "zig-zag"), fontsize=plot.FONT)
        ax.set_xlabel("key chunk", fontsize=plot.FONT - 2)
        ax.set_ylabel("query chunk", fontsize=plot.FONT - 2)
        ax.tick_params(labelsize=plot.FONT - 3)
    fig.suptitle(f"causal attention in {2 * n} chunks: the tiles each rank computes "
                 f"(a diagonal one counts half)", fontsize=plot.FONT)
    fig.tight_layout(w_pad=6)
    return plot.finish(fig)


def plot_attention_work(work: dict):
    """Each rank's attention work per step, one bar per rank and split, replayed."""
    from .. import plot
    values = {f"rank {r}\n{layout.replace('zigzag', 'zig-zag')}": t * 1e3
              for layout, seconds in work.items() for r, t in enumerate(seconds)}
    return plot.bars(values, ylabel="attention, ms a step", highlight=[
        k for k in values if "contiguous" in k],
        title="zig-zag chunks even out the ranks' attention (replayed)")


# ------------------------------------------------------------------ lessons
def learn_numbers(out: dict) -> dict:
    return {k: out[k] for k in ("held_out", "unigram", "uniform")}


@lessons.lesson("10.model_learns",
                "trained for 150 steps on one device, the transformer predicts held-out text "
                f"at least {BELOW_UNIGRAM} nats a word better than counting words does",
                lambda: learn_numbers(learn()))
def model_learns(m: dict):
    figures = (f"held-out {m['held_out']:.2f} nats a word, counting words {m['unigram']:.2f}, "
               f"guessing {m['uniform']:.2f}")
    return (m["held_out"] <= m["unigram"] - BELOW_UNIGRAM, figures,
            "the model did not learn past the words' frequencies")


def _strategies_experiment() -> dict:
    return strategy_numbers(run_strategies(), reference())


def strategy_numbers(run: LaunchResult, ref: dict, replay=None) -> dict:
    """What lab 10's lessons on the strategies read from a run and its reference."""
    return {"equivalence": equivalence(run, ref), "comm": comm_rows(run),
            "memory": memory_rows(run, ref),
            "work": attention_work(replay if replay is not None else replays.replayed(run), run),
            "devices": len(run.results)}


@lessons.lesson("10.strategies_equal_one_device",
                f"tensor, sequence and context parallelism train exactly as one device: "
                f"losses, gradients and weights within {TOL:g}",
                _strategies_experiment)
def strategies_equal_one_device(m: dict):
    worst = {name: max(v for v in d.values() if v is not None)
             for name, d in m["equivalence"].items()}
    figures = ", ".join(f"{name} {v:.1e}" for name, v in worst.items()) + " (largest difference)"
    off = [name for name, v in worst.items() if v > TOL]
    return not off, figures, f"{', '.join(off)} differ from one device by more than {TOL:g}"


@lessons.lesson("10.bytes_match_formulas",
                "each split hands to communication exactly the bytes its formula counts: "
                "tensor parallelism two all-reduces of the activations per block and "
                "direction, sequence parallelism reduce-scatters and all-gathers, context "
                "parallelism keys and values passed n - 1 times per block",
                _strategies_experiment)
def bytes_match_formulas(m: dict):
    rows = m["comm"]
    figures = ", ".join(f"{name} {r['traced'] / 1e6:.3f} MB ({r['formula'] / 1e6:.3f})"
                        for name, r in rows.items()) + " per step on rank 0, traced (formula)"
    off = [name for name, r in rows.items() if abs(r["traced"] - r["formula"]) > 0.5]
    return not off, figures, f"{', '.join(off)} off the formula"


@lessons.lesson("10.sp_cuts_activation_memory",
                "sequence parallelism keeps fewer bytes for the backward pass than tensor "
                "parallelism, fewer by exactly 1 - 1/n of the norms' region",
                _strategies_experiment)
def sp_cuts_activation_memory(m: dict):
    mem = m["memory"]
    saved, n = mem["saved"], mem["devices"]
    cut = saved["tp"] - saved["sp"]
    want = mem["norms_region"] * (1 - 1 / n)
    figures = (f"per rank {saved['tp']:,} bytes tensor parallel, {saved['sp']:,} with sequence "
               f"parallel: {cut:,} fewer; (1 - 1/{n}) of the norms' region "
               f"{mem['norms_region']:,} is {want:,.0f} (one device {saved['one device']:,})")
    return abs(cut - want) <= 0.01 * want, figures, "the cut is not the norms' region"


@lessons.lesson("10.zigzag_balances_the_ring",
                f"under a causal mask, zig-zag chunks keep the ranks' attention work within "
                f"{BALANCED:.2f}x of each other where contiguous chunks differ {UNBALANCED:g}x "
                f"or more, and the busiest rank does {QUICKER:g}x less",
                _strategies_experiment)
def zigzag_balances_the_ring(m: dict):
    work = m["work"]
    if any(min(v) <= 0 for v in work.values()):
        return False, f"attention work per rank {work}", "a rank ran no attention tile"
    ratio = {k: max(v) / min(v) for k, v in work.items()}
    quicker = max(work["contiguous"]) / max(work["zigzag"])
    figures = ("busiest/idlest rank's attention: " + ", ".join(
        f"{k} {ratio[k]:.2f}x ({', '.join(f'{t * 1e3:.1f}' for t in work[k])} ms)"
        for k in ratio) + f"; the busiest rank {quicker:.2f}x less with zig-zag")
    shown = ratio["zigzag"] <= BALANCED and ratio["contiguous"] >= UNBALANCED and quicker >= QUICKER
    return (shown, figures, "the split's imbalance is not what the causal mask makes it",
            f"replayed on {m['devices']} dedicated devices, each tile's CPU time")
