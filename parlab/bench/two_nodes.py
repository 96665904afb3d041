"""Two nodes on one machine (lab 14): the cost model and the replay against a measured slow
link. Needs Linux and root (``parlab.two_nodes.available``); elsewhere it says why not.

Two network namespaces joined by a cable shaped to 100 Mb/s run the lab's flat ring and
hierarchical all-reduce under torchrun: each collective over the slow link, measured
there, against the replay of this machine's run (a port per device) and the cost model
(one card a node). Then synchronous data parallel against local SGD over the same cable:
their wall times measured there and replayed here, and their losses.
"""
from __future__ import annotations

from statistics import median

from .registry import benchmark


@benchmark("two_nodes")
def two_nodes(quick: bool = False) -> list[str]:
    from parlab.course import lab14, replays
    from parlab.torch.two_tier import dataset_loss
    from parlab.two_nodes import available
    ok, why = available()
    if not ok:
        return [f"not run here: {why}"]
    out, repeats = [], 1 if quick else 3
    runs = lab14.sync_runs()
    ratios = {}
    for _ in range(repeats):
        for r in lab14.two_node_rows(lab14.on_two_nodes(), runs):
            ratios.setdefault(r["name"], []).append(
                (r["measured_s"], r["replayed_s"] / r["measured_s"],
                 r["predicted_s"] / r["measured_s"]))
    for name, got in ratios.items():
        out.append(f"{name:<24} measured {median(g[0] for g in got) * 1e3:5.1f} ms; replayed / "
                   f"measured {_span(g[1] for g in got)}; PREDICTED / measured "
                   f"{_span(g[2] for g in got)} ({repeats} runs)")
    local = lab14.local_runs()
    real = lab14.on_two_nodes(local=True)
    parts = replays.between_barriers(real.timeline, "part", 2)
    seconds = {}
    for (how, label), (start, end), results in zip(lab14.LABELS.items(), parts, real.results[0]):
        state_loss = dataset_loss(results["state"], sizes=lab14.SIZES)
        seconds[how] = end - start, lab14.curves(local[how])["total_s"]
        out.append(f"{label:<34} {lab14.LOCAL_STEPS} steps: measured on the shaped cable "
                   f"{seconds[how][0]:5.2f} s, replayed {seconds[how][1]:5.2f} s; loss "
                   f"{state_loss:.3f}")
    sync, local_sgd = seconds["hierarchical"], seconds["local_sgd"]
    out.append(f"synchronous / local SGD: {sync[0] / local_sgd[0]:.1f}x measured on the cable "
               f"(this machine's 2 cores shared by 4 ranks), {sync[1] / local_sgd[1]:.1f}x replayed")
    return out


def _span(values) -> str:
    values = sorted(values)
    return f"{values[0]:.2f}-{values[-1]:.2f}x" if len(values) > 1 else f"{values[0]:.2f}x"
