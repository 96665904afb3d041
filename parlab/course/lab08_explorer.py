"""Lab 08's second explorer (re-exported by ``parlab.course.lab08``): a real model's memory
per device under each ZeRO stage and its PREDICTED step under each kind of activation
recomputation, from the cost model (``parlab.sim``)."""
from __future__ import annotations

import math

GB = 1e9
RECOMPUTE = {"none": None, "selective": "selective", "full": "full"}


def models() -> dict:
    """Language models with their published shapes (sequence length in the name)."""
    from .. import sim
    return {
        "GPT-2 XL (1.5 B), 1024 tokens": lambda: sim.Network.transformer(
            "GPT-2 XL", 48, 1600, 25, 1024, 50257),
        "Llama 2 7B, 4096 tokens": lambda: sim.Network.llama(
            "Llama 2 7B", 32, 4096, 32, 4096, 32000, ffn=11008),
        "Llama 2 13B, 4096 tokens": lambda: sim.Network.llama(
            "Llama 2 13B", 40, 5120, 40, 4096, 32000, ffn=13824),
    }


def gpus() -> dict:
    """Devices N -> a cluster of N GPUs, 8 a node (``sim.clusters``: datasheets, cited)."""
    from .. import sim
    return {"A100 80 GB, 8 a node": lambda n: sim.a100_nvlink(max(n, 8)),
            "H100 80 GB, 8 a node": lambda n: sim.h100_nodes(math.ceil(n / 8))}


def step_parts(tl) -> dict:
    """Rank 0's PREDICTED step cut into what it did: forward and backward, recomputation,
    waiting for exchanges (transfers and waits on its own lane), the update, idle."""
    kinds = tl.seconds_by_kind(0)             # segments: a compute span's enclosed waits apart
    named = {name: sum(s.duration for s in tl if s.rank == 0 and s.kind == "compute"
                       and s.name == name) for name in ("recompute", "update")}
    return {"forward and backward": kinds["compute"] - named["recompute"] - named["update"],
            "recomputation": named["recompute"], "exchanges": kinds["comm"] + kinds["wait"],
            "update": named["update"], "idle": kinds["idle"]}


def predicted(net, cluster, devices: int, per_device: int, zero: int, recompute) -> tuple:
    """(memory per device, PREDICTED timeline) of data parallel (sharded by ``zero``) over
    ``devices``, ``per_device`` sequences each, DDP-like buckets overlapped."""
    from .. import sim
    batch = devices * per_device
    mem = sim.memory(net, batch, dp=devices, zero=zero, recompute=recompute, cluster=cluster)
    if devices == 1:
        tl = sim.single_device(net, cluster, batch, recompute=recompute)
    else:
        tl = sim.data_parallel(net, cluster, batch, devices=devices, zero=zero,
                               recompute=recompute, buckets=min(len(net), 8), overlap=True)
    return mem, tl


def memory_figure(model: str, gpu: str, devices: int, per_device: int, zero: int,
                  recompute: str):
    """Left: memory per device at ZeRO 0-3 with the chosen recomputation, the GPU's
    capacity across. Right: the PREDICTED step at the chosen ZeRO stage for each kind of
    recomputation. Returns (figure, a line of text)."""
    from .. import plot
    plt = plot.pyplot()
    net, cluster = models()[model](), gpus()[gpu](devices)
    mems = {z: predicted(net, cluster, devices, per_device, z, RECOMPUTE[recompute])[0]
            if z != zero else None for z in range(4)}
    steps = {}
    for name, how in RECOMPUTE.items():
        mem, tl = predicted(net, cluster, devices, per_device, zero, how)
        steps[name] = (mem, step_parts(tl))
        if how == RECOMPUTE[recompute]:
            mems[zero] = mem
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.4))
    labels = ["plain DP" if z == 0 else f"ZeRO-{z}" for z in range(4)]
    parts = ["parameters", "gradients", "optimizer state", "activations", "gathered parameters"]
    extra: dict = {}
    bottom = [0.0] * 4
    for part in parts:
        vals = [mems[z].parts().get(part, 0.0) / GB for z in range(4)]
        if not any(vals):
            continue
        color = plot.memory_color(part, extra)
        left.bar(labels, vals, bottom=bottom, label=part, color=color,
                 hatch=plot.HATCHES[plot.PREDICTED], edgecolor="white", linewidth=0.6)
        bottom = [b + v for b, v in zip(bottom, vals)]
    left.axhline(cluster.memory_bytes / GB, color="black", ls="--", lw=1)
    left.text(3.45, cluster.memory_bytes / GB, f"{cluster.memory_bytes / GB:.0f} GB",
              va="bottom", ha="right", fontsize=plot.FONT - 3)
    left.set_ylabel("GB per device", fontsize=plot.FONT - 1)
    left.set_title(f"memory, recomputation: {recompute}", fontsize=plot.FONT - 1)
    left.legend(fontsize=plot.FONT - 4, loc="upper center", bbox_to_anchor=(0.5, -0.1),
                ncol=3, frameon=False)
    left.tick_params(labelsize=plot.FONT - 3)
    names = list(RECOMPUTE)
    colors = {"forward and backward": plot.COLORS["compute"],
              "recomputation": plot.EXTRA_COLORS[2], "exchanges": plot.AXIS_COLORS["dp"],
              "update": plot.PHASES["update"], "idle": plot.COLORS["idle"]}
    base = [0.0] * len(names)
    for key, color in colors.items():
        vals = [steps[n][1][key] for n in names]
        right.bar(names, vals, bottom=base, label=key, color=color,
                  hatch=plot.HATCHES[plot.PREDICTED], edgecolor="white", linewidth=0.6)
        base = [b + v for b, v in zip(base, vals)]
    for i, n in enumerate(names):
        if not steps[n][0].fits:
            right.text(i, base[i], "does not fit", ha="center", va="bottom",
                       fontsize=plot.FONT - 4)
    stage = "plain DP" if zero == 0 else f"ZeRO-{zero}"
    right.set_ylabel("seconds per step", fontsize=plot.FONT - 1)
    right.set_title(f"step at {stage}, by recomputation", fontsize=plot.FONT - 1)
    right.legend(fontsize=plot.FONT - 4, loc="upper center", bbox_to_anchor=(0.5, -0.1),
                 ncol=2, frameon=False)
    right.tick_params(labelsize=plot.FONT - 3)
    fig.suptitle(f"PREDICTED: {net.name} on {devices} × {gpu.split(',')[0]}, "
                 f"{per_device} sequence(s) per device", fontsize=plot.FONT)
    fig.tight_layout()
    plt.close(fig)
    chosen = mems[zero]
    line = (f"<b>PREDICTED</b> at {stage} with {recompute} recomputation: "
            f"{chosen.total / GB:,.1f} GB per device of {cluster.memory_bytes / GB:.0f} "
            f"({'fits' if chosen.fits else '<b>does not fit</b>'}); a step "
            f"{sum(steps[recompute][1].values()):,.2f} s")
    return fig, line


def memory_explorer():
    """Choose a language model, a GPU, the data-parallel devices, the sequences per
    device, a ZeRO stage and a kind of recomputation: its memory per device and its step,
    PREDICTED at once (``memory_figure``)."""
    from .explorer import choice, explorer, slider
    controls = {"model": choice("model", list(models()), width="380px"),
                "gpu": choice("GPU", list(gpus())),
                "devices": slider("devices N", [1, 2, 4, 8, 16], 8),
                "per_device": slider("sequences per device", [1, 2, 4, 8], 1),
                "zero": choice("step at", {"plain DP": 0, "ZeRO-1": 1, "ZeRO-2": 2,
                                           "ZeRO-3 (FSDP)": 3}, 1),
                "recompute": choice("recomputation", list(RECOMPUTE), "selective")}

    def predict(**v):
        fig, line = memory_figure(**v)
        return fig, line
    return explorer(predict, controls)
