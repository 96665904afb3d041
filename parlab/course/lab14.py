"""Lab 14: two nodes and a slow link. Four ranks in two nodes of two: a flat ring against
a hierarchical all-reduce, and local SGD, which averages across nodes every H steps,
against synchronous data parallel; each run real, replayed on dedicated devices with a
slow link between the nodes, and (where this machine allows it) run again on two network
namespaces joined by a link shaped with ``tc``."""
from __future__ import annotations

from statistics import median

from . import lessons, replays
from .. import nodes as node_math
from .lab14_exercises import check_outer_step, check_slow_link_bytes   # noqa: F401 - the lab's
from ..launcher import LaunchResult, launch
from ..metrics import largest_difference

DEVICES, NODE_SIZE = 4, 2
BATCH = 64
SYNC_STEPS = 8                  # flat and hierarchical: a few steps, each replayed
LOCAL_STEPS, H = 256, 16        # local SGD against synchronous data parallel
SIZES = None                    # the course's MLP: 116,618 parameters, 466 kB of gradients
BETWEEN_GBIT = 0.1              # the link between the nodes: 100 Mb/s Ethernet
BETWEEN = f"{BETWEEN_GBIT * 1000:.0f} Mb/s Ethernet"
INNER = dict(inner="momentum", lr=0.05)   # both methods' optimizer on every rank
TOL = 1e-5
HIERARCHICAL_GAIN = 1.5         # the hierarchical step at least this much quicker, replayed
LOSS_MARGIN = 0.25              # local SGD's loss within this share of synchronous DP's
LOCAL_GAIN = 3.0                # local SGD's run at least this much quicker, replayed
# the busiest rank's bytes over the slow link, flat ring over hierarchical (parlab.nodes)
BUSIEST_CUT = (node_math.bytes_per_rank("flat", 1.0, DEVICES, NODE_SIZE)
               / node_math.bytes_per_rank("hierarchical", 1.0, DEVICES, NODE_SIZE))


def devices():
    """4 ranks in 2 nodes of 2; between the nodes 100 Mb/s Ethernet (``sim.ethernet``)."""
    from ..hardware import devices as pick
    from ..sim import ethernet
    return pick(DEVICES, nodes=DEVICES // NODE_SIZE, between=ethernet(BETWEEN_GBIT))


def train(how: str, devs, **kw) -> LaunchResult:
    """One method (``two_tier.train_two_tier``'s settings) on the lab's 4 ranks in 2 nodes."""
    from ..torch import two_tier
    args = dict(how=how, node_size=NODE_SIZE, global_batch=BATCH, sizes=SIZES, **kw)
    two_tier.check_two_tier(DEVICES, how, NODE_SIZE, kw.get("H", H), BATCH,
                            kw.get("inner", "sgd"))
    return launch(two_tier.train_two_tier, DEVICES, kwargs=args, devices=devs, timeout=240)


def param_bytes(run: LaunchResult) -> int:
    """S: the bytes of every gradient (4-byte floats) of the run's model."""
    return sum(v.size for v in run.results[0]["state"].values()) * 4


# ------------------------------------------------------------------ flat and hierarchical
def sync_runs(devs=None) -> dict:
    """Flat ring and hierarchical all-reduce, SYNC_STEPS steps each on 4 ranks in 2 nodes,
    beside one device on the whole batch."""
    from ..torch import data_parallel
    devs = devs or devices()
    runs = {how: train(how, devs, steps=SYNC_STEPS) for how in ("flat", "hierarchical")}
    one = data_parallel.train_single(global_batch=BATCH, steps=SYNC_STEPS, lr=0.1, sizes=SIZES)
    runs["differences"] = {how: max(largest_difference((r["state"][k], v)
                                                       for k, v in one["state"].items())
                                    for r in runs[how].results)
                           for how in ("flat", "hierarchical")}
    return runs


def handed_across(run: LaunchResult, steps: int, rank: int = 0) -> float:
    """Bytes one rank hands per step to collectives whose group spans both nodes: the
    world's ring (flat), the ``across`` line (hierarchical, local SGD)."""
    spans = [s for s in run.timeline.spans if s.rank == rank and s.kind == "comm"
             and (s.axis == "across" or (s.axis is None and s.name.startswith("all_reduce")))]
    return sum(s.bytes for s in spans) / steps


def bytes_rows(runs: dict, steps: int = SYNC_STEPS, local_H: int = 1) -> list[dict]:
    """Per method: S handed across by a rank a step (measured), and the bytes that cross
    nodes a step, over all ranks and for the busiest rank (``parlab.nodes``' formulas on
    what was handed)."""
    rows = []
    for how, run in runs.items():
        if not isinstance(run, LaunchResult):
            continue
        S = param_bytes(run)
        every = local_H if how == "local_sgd" else 1
        handed = handed_across(run, steps)
        want = S if how == "flat" else S / NODE_SIZE / every
        rows.append({"how": how, "S": S, "handed": handed, "handed_formula": want,
                     "crossing": node_math.slow_link_bytes(how, S, DEVICES, NODE_SIZE, every),
                     "busiest": node_math.bytes_per_rank(how, S, DEVICES, NODE_SIZE, every)})
    return rows


def step_seconds(run: LaunchResult) -> float:
    """The median step of the run replayed on dedicated devices, 2 nodes, slow link between."""
    from ..steps import step_seconds as seconds
    return seconds(replays.replayed(run), "forward", skip=1)


def sync_numbers(runs: dict) -> dict:
    return {"differences": runs["differences"], "bytes": bytes_rows(runs),
            "replayed_s": {how: step_seconds(runs[how]) for how in ("flat", "hierarchical")},
            "between": BETWEEN}


def quickest_steps(runs: dict):
    """Each method's quickest replayed step, its 4 ranks one above the other."""
    from ..sim import ReplayedTimeline
    from ..steps import quickest_step
    from ..trace import Span
    spans, labels, lane = [], {}, 0
    for how in ("flat", "hierarchical"):
        step = quickest_step(replays.replayed(runs[how]), "forward", skip=1)
        for r in range(DEVICES):
            labels[lane] = f"{how} · rank {r} · node {r // NODE_SIZE} · replayed"
            spans += [Span(lane, s.kind, s.name, s.start - step.start, s.end - step.start,
                           s.bytes, axis=_tier(s)) for s in step.spans if s.rank == r]
            lane += 1
    return ReplayedTimeline(spans, labels, range(lane), notes=step.notes)


def _tier(s) -> str | None:
    if s.kind != "comm":
        return None
    return s.axis if s.axis in ("inside", "across") else "across"    # the flat ring spans both


# ------------------------------------------------------------------ local SGD
def local_runs(devs=None, steps: int = LOCAL_STEPS) -> dict:
    """Synchronous data parallel (hierarchical, every step) against local SGD (inside each
    node every step, across every H steps, the models averaged), the same optimizer on
    every rank, ``steps`` steps of BATCH samples."""
    devs = devs or devices()
    return {"hierarchical": train("hierarchical", devs, steps=steps, **INNER),
            "local_sgd": train("local_sgd", devs, steps=steps, H=H, outer_lr=1.0,
                                outer_momentum=0.0, **INNER)}


def curves(run: LaunchResult, window: int = 16) -> dict:
    """Loss (the ranks' batch losses averaged, then a running mean over ``window`` steps)
    against samples and against the replayed seconds at each step's end."""
    import numpy as np
    losses = np.mean([r["losses"] for r in run.results], axis=0)
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    rp = replays.replayed(run)
    starts = sorted(s.start for s in rp.spans if s.rank == 0 and s.name == "forward")
    ends = starts[1:] + [max(s.end for s in rp.spans)]
    t = np.array(ends) - min(s.start for s in rp.spans)
    samples = np.arange(1, len(losses) + 1) * BATCH
    return {"samples": samples[window - 1:], "seconds": t[window - 1:], "loss": smooth,
            "total_s": float(t[-1])}


def local_numbers(runs: dict) -> dict:
    from ..torch.two_tier import dataset_loss
    steps = len(runs["local_sgd"].results[0]["losses"])
    out = {"bytes": bytes_rows(runs, steps, H), "H": H, "samples": steps * BATCH,
           "between": BETWEEN}
    for how, run in runs.items():
        out[how] = {"loss": median(dataset_loss(r["state"], sizes=SIZES) for r in run.results),
                    "seconds": curves(run)["total_s"]}
    return out


LABELS = {"hierarchical": "synchronous (every step)", "local_sgd": f"local SGD (across every {H} steps)"}


def plot_curves(runs: dict):
    """Loss against samples (left) and against the replayed seconds (right)."""
    import matplotlib.pyplot as plt
    fig, (by_samples, by_time) = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for how, style in (("hierarchical", "-"), ("local_sgd", "--")):
        c = curves(runs[how])
        by_samples.plot(c["samples"], c["loss"], style, lw=2, label=LABELS[how])
        by_time.plot(c["seconds"], c["loss"], style, lw=2, label=LABELS[how])
    by_samples.set_xlabel("samples seen")
    by_samples.set_ylabel("training loss (16-step mean)")
    by_samples.set_title("against samples: local SGD a little above")
    by_time.set_xlabel(f"seconds, replayed ({BETWEEN} between nodes)")
    by_time.set_title("against time: local SGD done first")
    from matplotlib.ticker import FuncFormatter
    for ax in (by_samples, by_time):
        ax.grid(alpha=0.3)
        ax.set_yscale("log")
        # plain tick labels: the default 10^k ones need math fonts this machine may lack
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    by_time.legend()
    fig.tight_layout()
    plt.close(fig)
    return fig


# ------------------------------------------------------------------ lessons
def _experiment() -> dict:
    devs = devices()
    return {"sync": sync_numbers(sync_runs(devs)), "local": local_numbers(local_runs(devs))}


def _part(m: dict, name: str) -> dict:
    """A lesson's numbers: the experiment's part ``name``, or that part passed alone."""
    return m.get(name, m)


def _replayed_on(numbers: dict) -> str:
    """What a lesson about time read (its verdict says so)."""
    return (f"replayed on {DEVICES} dedicated devices in {DEVICES // NODE_SIZE} nodes, "
            f"{numbers['between']} between them")


def _row(rows, how):
    return next(r for r in rows if r["how"] == how)


@lessons.lesson("14.hierarchical_equals_one_device_and_sends_less_across",
                f"a flat ring and a hierarchical all-reduce on 2 nodes both train as one device "
                f"(within {TOL:g}); the hierarchical one hands 1/{NODE_SIZE} of the gradients "
                f"across nodes, so its busiest rank sends {BUSIEST_CUT:g}x fewer bytes "
                f"over the slow link",
                _experiment)
def hierarchical_equals_one_device(m: dict):
    s = _part(m, "sync")
    flat, hier = _row(s["bytes"], "flat"), _row(s["bytes"], "hierarchical")
    exact = all(r["handed"] == r["handed_formula"] for r in (flat, hier))
    worst = max(s["differences"].values())
    cut = flat["busiest"] / hier["busiest"]
    figures = (f"from one device: flat {s['differences']['flat']:.1e}, hierarchical "
               f"{s['differences']['hierarchical']:.1e}; handed across a step by rank 0: "
               f"{flat['handed']:,.0f} and {hier['handed']:,.0f} bytes (formulas "
               f"{flat['handed_formula']:,.0f}, {hier['handed_formula']:,.0f}); busiest rank "
               f"over the slow link {flat['busiest']:,.0f} against {hier['busiest']:,.0f} ({cut:.1f}x)")
    return worst <= TOL and exact and abs(cut - BUSIEST_CUT) < 1e-9, figures, \
        "a method changed the training or moved other bytes across"


@lessons.lesson("14.hierarchical_quicker_over_a_slow_link",
                f"over a slow link between nodes, a step with the hierarchical all-reduce is at "
                f"least {HIERARCHICAL_GAIN:g}x quicker than with a flat ring",
                _experiment)
def hierarchical_quicker(m: dict):
    t = _part(m, "sync")["replayed_s"]
    ratio = t["flat"] / t["hierarchical"]
    figures = (f"median step {t['flat'] * 1e3:.1f} ms flat, {t['hierarchical'] * 1e3:.1f} ms "
               f"hierarchical ({ratio:.1f}x)")
    return ratio >= HIERARCHICAL_GAIN, figures, "the hierarchical step was not quicker", \
        _replayed_on(_part(m, "sync"))


@lessons.lesson("14.local_sgd_sends_H_times_fewer_bytes",
                f"local SGD, averaging across nodes every {H} steps, sends {H}x fewer bytes over "
                f"the slow link than synchronous data parallel",
                _experiment)
def local_sgd_fewer_bytes(m: dict):
    rows = _part(m, "local")["bytes"]
    sync, local = _row(rows, "hierarchical"), _row(rows, "local_sgd")
    ratio = sync["handed"] / local["handed"] if local["handed"] else float("inf")
    figures = (f"handed across a step by rank 0: {sync['handed']:,.0f} against "
               f"{local['handed']:,.0f} bytes ({ratio:.1f}x)")
    return abs(ratio - H) < 1e-9, figures, "local SGD did not send H times fewer bytes"


@lessons.lesson("14.local_sgd_loss_close_to_synchronous",
                f"after the same samples, local SGD's loss on the whole training set is within "
                f"{LOSS_MARGIN:.0%} of synchronous data parallel's",
                _experiment)
def local_sgd_loss_close(m: dict):
    n = _part(m, "local")
    sync, local = n["hierarchical"]["loss"], n["local_sgd"]["loss"]
    off = local / sync - 1
    figures = (f"after {n['samples']:,} samples: {local:.3f} against {sync:.3f} "
               f"({off:+.0%})")
    return off <= LOSS_MARGIN, figures, "local SGD fell behind"


@lessons.lesson("14.local_sgd_quicker_over_a_slow_link",
                f"over a slow link, local SGD sees the same samples at least {LOCAL_GAIN:g}x "
                f"quicker than synchronous data parallel",
                _experiment)
def local_sgd_quicker(m: dict):
    n = _part(m, "local")
    sync, local = n["hierarchical"]["seconds"], n["local_sgd"]["seconds"]
    ratio = sync / local
    figures = f"{n['samples']:,} samples in {sync:.2f} s against {local:.2f} s ({ratio:.1f}x)"
    return ratio >= LOCAL_GAIN, figures, "local SGD was not quicker", \
        _replayed_on(n)


# ------------------------------------------------------------------ two real nodes
SPANS = {"flat": ("all_reduce (gradients)",), "hierarchical": ("all_reduce (across)",)}


def on_two_nodes(between_mbit: float = BETWEEN_GBIT * 1000, timeout_s: float = 300,
                 local: bool = False):
    """The flat and the hierarchical runs again (``local``: synchronous and local SGD), on
    two network namespaces joined by a cable shaped to ``between_mbit``
    (``parlab.two_nodes``), torchrun in each. Returns the run (``TwoNodesRun``), or the
    reason it cannot run here."""
    from ..two_nodes import TwoNodes, available
    ok, why = available()
    if not ok:
        return why
    same = dict(node_size=NODE_SIZE, global_batch=BATCH, sizes=SIZES)
    if local:
        runs = [dict(how="hierarchical", steps=LOCAL_STEPS, **INNER, **same),
                dict(how="local_sgd", steps=LOCAL_STEPS, H=H, outer_lr=1.0, outer_momentum=0.0,
                     **INNER, **same)]
    else:
        runs = [dict(how=how, steps=SYNC_STEPS, **same) for how in ("flat", "hierarchical")]
    with TwoNodes(between_mbit=between_mbit, inside_mbit=None, nproc_per_node=NODE_SIZE) as two:
        return two.run("parlab.torch.two_tier:train_each", [runs], timeout_s=timeout_s)


def cluster_of_two_nodes(between_mbit: float = BETWEEN_GBIT * 1000):
    """The cost model's view of the two namespaces: 2 nodes of 2 devices, one network card
    a node (the veth pair), this machine's idle link inside, Ethernet of ``between_mbit``
    between. Compute does not enter the collectives' prices."""
    from .. import sim
    return sim.Cluster(name="two namespaces", devices=DEVICES, memory_bytes=1e9, flops=1e9,
                       layer_overhead_s=0.0, devices_per_node=NODE_SIZE,
                       intra=replays.idle_link(), inter=sim.ethernet(between_mbit / 1000),
                       nics_per_node=1)


def _predicted_s(cluster, name: str, nbytes: float) -> float:
    """The cost model's all-reduce: the flat ring over all 4 ranks, or one across pair
    (stride 2: one rank a node, the node's one card shared with its other pair)."""
    from ..sim.collectives import all_reduce_time
    if name == "all_reduce (across)":
        return all_reduce_time(cluster, nbytes, DEVICES // NODE_SIZE, stride=NODE_SIZE)
    return all_reduce_time(cluster, nbytes, DEVICES)


def _phase_s(timeline, window, name: str) -> float | None:
    """The median time of collective ``name`` from its last rank's arrival to its last
    rank's exit, over all ranks (a rank that arrives early pushes its data into its
    peers' socket buffers, so one rank's transfer alone reads too short)."""
    tl = timeline.window(*window) if window else timeline
    by_rank = {}
    for r in tl.ranks:
        mine = sorted((s for s in tl.spans if s.rank == r and s.name == name), key=lambda s: s.start)
        starts, ends = [], []
        for s in mine:
            if s.kind == "comm":
                before = [w for w in mine if w.kind == "wait" and abs(w.end - s.start) < 1e-6]
                starts.append(before[0].start if before else s.start)
                ends.append(s.end)
        by_rank[r] = (starts, ends)
    count = min(len(v[0]) for v in by_rank.values())
    if not count:
        return None
    phases = [max(v[1][i] for v in by_rank.values()) - max(v[0][i] for v in by_rank.values())
              for i in range(count)]
    return median(phases[1:] or phases)


def two_node_rows(run, runs: dict) -> list[dict]:
    """Each collective over the slow link in the two-node run ``run`` (``_phase_s``): measured there;
    replayed from this machine's runs of the same settings (``runs``, ``sync_runs``), with
    a port per device; PREDICTED by the cost model, one card a node shared by its ranks."""
    parts = replays.between_barriers(run.timeline, "part", 2)
    cluster = cluster_of_two_nodes()
    rows = []
    for (how, names), window in zip(SPANS.items(), parts):
        replayed = replays.replayed(runs[how])
        for name in names:
            got = [s for s in run.timeline.window(*window).spans
                   if s.rank == 0 and s.kind == "comm" and s.name == name]
            if not got:
                continue
            rows.append({"how": how, "name": name, "bytes": got[0].bytes,
                         "measured_s": _phase_s(run.timeline, window, name),
                         "replayed_s": _phase_s(replayed, None, name),
                         "predicted_s": _predicted_s(cluster, name, got[0].bytes)})
    return rows
