"""Lab 15's choice: the cost model (``parlab.sim``) on the course's U-Net.

``sim.Network.unet`` describes the same U-Net as ``parlab.torch.models.UNet`` layer by
layer (convolutions, poolings, up-convolutions, concats), with its skip connections, so
that a pipeline cut carries what the torch stages send. Calibrated on what this lab
measured earlier (the single-device steps, the transfers of the equivalence runs), it
predicts each plan's step and memory per device, with its reasons; the lab then measures
the plans and sets the two side by side. Everything the model says is a PREDICTION.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .. import sim
from ..split import UNetConfig
from .exercise import fallback

DEPTH = 2                      # parlab.torch.models.UNet: two levels below the top
DEVICES = 4
# Where each of the torch U-Net's block boundaries (UNet.BLOCKS: after e1, e2, b, d2, d1)
# lies among the cost model's layers: the pooling or up-convolution that starts the next
# block (the torch blocks pool on the receiving side, as these layers do).
CUT_LAYER = {1: "enc0.pool", 2: "enc1.pool", 3: "dec1.up", 4: "dec0.up", 5: "head"}
PLANS = {"dp": {"dp": DEVICES}, "pp": {"dp": 1, "pp": 2}, "dp_pp": {"dp": 2, "pp": 2}}
PLAN_NAMES = {"dp": "dp 4", "pp": "pp 2 (encoder | decoder)", "dp_pp": "dp 2 × pp 2"}


def network(cfg: UNetConfig) -> "sim.Network":
    """The lab's U-Net as the cost model sees it: one input channel, 3 classes, Adam in
    float32 (4 + 4 + 8 bytes per parameter)."""
    return sim.Network.unet(image=cfg.size, in_channels=1, classes=3, base=cfg.base,
                            depth=DEPTH)


def layer_of_cut(net, cut: int) -> int:
    """The cost model's layer index where the torch U-Net's block cut ``cut`` lies."""
    names = [layer.name for layer in net.layers]
    return names.index(CUT_LAYER[cut])


def plan_options(plan: str, cfg: UNetConfig, net) -> dict:
    """``sim.hybrid`` / ``sim.memory_per_device`` settings of one of ``PLANS``."""
    kw = dict(PLANS[plan])
    if kw.get("pp", 1) > 1:
        kw.update(micro_batches=cfg.micro_batches, schedule=cfg.schedule,
                  bounds=[layer_of_cut(net, c) for c in cfg.cuts])
    return kw


# ------------------------------------------------------------------ the formulas
def expected_bytes(plan: str, cfg: UNetConfig, net=None) -> dict:
    """Bytes per rank per step on each mesh axis, {rank: {axis: bytes}}, as the traced
    layer counts them (what each rank hands to its sends, receives and collectives).

    pp: at the cut, every micro-batch's tensors forward (``net.cut_bytes``: the
    bottleneck's activation and the skips) and as many bytes of gradients back; a stage
    sends one way and receives the other: 2 × cut bytes × m per step.
    dp: one all-reduce of the gradients of the parameters the rank holds, 4 bytes each.
    """
    net = net or network(cfg)
    kw = plan_options(plan, cfg, net)
    dp, pp = kw.get("dp", 1), kw.get("pp", 1)
    edges = [0, *kw.get("bounds", []), len(net)]
    micro = cfg.global_batch // dp // kw.get("micro_batches", 1)
    out = {}
    for r in range(dp * pp):
        stage = r % pp
        axes = {}
        if pp > 1:
            axes["pp"] = 2 * net.cut_bytes(edges[1], micro) * kw["micro_batches"]
        if dp > 1:
            axes["dp"] = 4 * sum(layer.params for layer in net.layers[edges[stage]:edges[stage + 1]])
        out[r] = axes
    return out


# ------------------------------------------------------------------ calibration and prediction
def calibrate(single_timelines: dict, runs: dict, cfg: UNetConfig, *, simulated: bool = True,
              cores: int | None = None, replayed: bool = False) -> dict:
    """The cost model for this machine, from two measurements this lab made earlier.

    single_timelines: {batch: the U-Net's single-device step timeline} (forward, backward,
        update): per-layer costs (``sim.Measured.from_timeline``: a straight line through
        the batch sizes gives each pass a fixed part and a part per image).
    runs: the equivalence runs (``lab15.run_plans``). The link: fitted to the pipeline's
        traced transfers (alpha + S / beta, ``sim.calibrate.link_from_transfers``). And
        how much slower a rank computes between messages than one device back to back
        (its caches and the core it wakes on are no longer warm): the data-parallel
        replicas' forward + backward against one device's on the same images, a factor
        applied to every layer's costs.
    simulated: devices that are processes sharing this CPU's ``cores`` (default: all of
        them): the model lets ranks that compute at once share them.
    replayed: a model to set beside the runs replayed on dedicated devices: the
        replicas' compute read on the replay, the replay's link, a processor per device.
    """
    import os

    from ..steps import median_phase
    net = network(cfg)
    alone = sim.Measured.from_timeline(single_timelines, net, skip=1)
    replica = cfg.global_batch // DEVICES
    dp = runs["dp"]["replayed" if replayed else "timeline"]
    between = sorted(median_phase(dp, "forward", r) + median_phase(dp, "backward", r)
                     for r in runs["dp"]["ranks"])[len(runs["dp"]["ranks"]) // 2]
    one = sum(median_phase(single_timelines[replica], p, single_timelines[replica].ranks[0])
              for p in ("forward", "backward"))
    slower = between / one
    costs = replace(alone, forward=tuple(t * slower for t in alone.forward),
                    backward=tuple(t * slower for t in alone.backward),
                    fixed_s=alone.fixed_s * slower,
                    source=f"{alone.source}; times {slower:.2f}, a replica's forward and "
                           f"backward between messages over one device's back to back")
    if replayed:
        from .replays import idle_link
        link = idle_link()
    else:
        link = sim.calibrate.link_from_transfers(runs["pp"]["timeline"],
                                                 ranks=runs["pp"]["ranks"])
    flops = sim.calibrate.compute_rate(net, costs)
    cluster = sim.calibrate.this_machine(link, flops=flops, layer_overhead_s=costs.fixed_s,
                                         devices=DEVICES)
    cluster = replace(cluster, cores=(cores or os.cpu_count() or 1)
                      if simulated and not replayed else 0)
    return {"cluster": cluster, "costs": costs, "link": link, "net": net,
            "between_messages": slower}


@dataclass
class Choice:
    """One plan as the cost model sees it (PREDICTED)."""

    plan: str
    timeline: object            # sim.PredictedTimeline of one step
    memory: list                # sim.Memory per pipeline stage
    devices_used: int

    @property
    def step_s(self) -> float:
        return self.timeline.step_s

    @property
    def fits(self) -> bool:
        return all(m.fits for m in self.memory)

    @property
    def parts(self) -> dict:
        """The busiest rank's step: compute, sends (pp), all-reduce (dp), idle or waiting
        (the bubble and the waits for a peer), for ``plot.plot_step_parts``."""
        tl = self.timeline
        best = {}
        for r in tl.ranks:
            kinds = tl.seconds_by_kind(r)
            by_axis = {a: sum(s.duration for s in tl.spans if s.rank == r and s.kind == "comm"
                              and s.axis == a) for a in ("pp", "dp")}
            parts = {"compute": kinds["compute"], "pp": by_axis["pp"], "dp": by_axis["dp"]}
            parts["bubble"] = max(tl.duration - sum(parts.values()), 0.0)
            if parts["compute"] >= best.get("compute", -1):
                best = parts
        return best


def predict(cal: dict, cfg: UNetConfig) -> dict:
    """Each of ``PLANS`` on the calibrated cluster: {plan: ``Choice``} (PREDICTED)."""
    net, cluster, costs = cal["net"], cal["cluster"], cal["costs"]
    out = {}
    for plan in PLANS:
        kw = plan_options(plan, cfg, net)
        tl = sim.hybrid(net, cluster, cfg.global_batch, costs=costs, **kw)
        mem = sim.memory_per_device(net, cfg.global_batch, cluster=cluster, costs=costs, **kw)
        out[plan] = Choice(plan, tl, mem, kw.get("dp", 1) * kw.get("pp", 1))
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def reasons(choice: Choice, cfg: UNetConfig, net) -> str:
    """Why the model predicts what it predicts for one plan, in words and its numbers."""
    p = choice.parts
    kw = plan_options(choice.plan, cfg, net)
    dp, pp, m = kw.get("dp", 1), kw.get("pp", 1), kw.get("micro_batches", 1)
    mem = max(choice.memory, key=lambda x: x.total)
    moved = expected_bytes(choice.plan, cfg, net)[0]
    said = [f"computing {_ms(p['compute'])}"]
    if dp > 1:
        said.append(f"one all-reduce of {moved['dp'] / 1e3:,.0f} kB of gradients "
                    f"({_ms(p['dp'])})")
    if pp > 1:
        said.append(f"the cut's tensors forward and back for each of {m} micro-batches, "
                    f"{moved['pp'] / 1e3:,.0f} kB in all ({_ms(p['pp'])}), idle or waiting "
                    f"{_ms(p['bubble'])} (the bubble: "
                    f"(p - 1)/(m + p - 1) = {(pp - 1) / (m + pp - 1):.0%} of the slots)")
    share = (f"{cfg.global_batch // dp} images per replica" if pp == 1 else
             f"micro-batches of {cfg.global_batch // dp // m} images")
    used = "" if choice.devices_used == DEVICES else (
        f"; uses {choice.devices_used} of the {DEVICES} devices")
    return (f"{PLAN_NAMES[choice.plan]:<26} PREDICTED {_ms(choice.step_s):>9} a step, "
            f"{mem.total / 1e6:.1f} MB on the fullest device ({'fits' if mem.fits else 'DOES NOT FIT'})"
            f"\n    {share}; on the busiest device: {', '.join(said)}{used}")


def pick(choices: dict, devices: int = DEVICES) -> str:
    """The model's pick: the quickest predicted step that fits, among the plans that use
    all ``devices`` (a plan that leaves devices idle is not a way to use them)."""
    ok = [c for c in choices.values() if c.fits and c.devices_used == devices]
    return min(ok, key=lambda c: c.step_s).plan


# ------------------------------------------------------------------ exercise: choose for a cluster
@dataclass(frozen=True)
class Scenario:
    """A cluster, a U-Net and its batch: what exercise 15.2 asks a plan for."""

    cluster: str = "8 × A100 80 GB (NVLink)"
    image: int = 1024
    base: int = 64
    depth: int = 4
    global_batch: int = 128

    def network(self):
        return sim.Network.unet(image=self.image, in_channels=1, classes=3, base=self.base,
                                depth=self.depth)

    def the_cluster(self):
        return sim.gpu_presets()[self.cluster]


SCENARIO = Scenario()


def plan_cost(scenario: Scenario, plan: dict) -> dict:
    """What the cost model says of ``plan`` ({"dp", "pp", "micro_batches"}) in
    ``scenario``: the step (PREDICTED), the fullest device's memory, whether it fits.
    A plan that cannot run is refused with a ValueError that says why."""
    c, net = scenario.the_cluster(), scenario.network()
    dp, pp = int(plan.get("dp", 1)), int(plan.get("pp", 1))
    m = int(plan.get("micro_batches", 1)) if pp > 1 else 1
    if dp < 1 or pp < 1 or m < 1:
        raise ValueError(f"dp, pp and micro_batches are whole numbers >= 1, got {plan}")
    if dp * pp != c.devices:
        raise ValueError(f"dp × pp = {dp * pp}, but {c.name} has {c.devices} devices: use them all")
    if scenario.global_batch % (dp * m):
        raise ValueError(f"a global batch of {scenario.global_batch} does not split into "
                         f"{dp} replicas of {m} micro-batches")
    mem = sim.memory(net, scenario.global_batch, dp=dp, pp=pp, micro_batches=m, cluster=c)
    tl = sim.hybrid(net, c, scenario.global_batch, dp=dp, pp=pp, micro_batches=m)
    return {"plan": {"dp": dp, "pp": pp, "micro_batches": m}, "step_s": tl.step_s,
            "memory": mem.total, "fits": mem.fits, "capacity": mem.capacity}


def candidates(scenario: Scenario) -> list[dict]:
    """Every plan of dp × pp devices, pipelines with 2 .. batch micro-batches."""
    c = scenario.the_cluster()
    out = []
    for pp in (d for d in range(1, c.devices + 1) if c.devices % d == 0):
        dp = c.devices // pp
        for m in ([1] if pp == 1 else [2 ** k for k in range(1, 8)]):
            if scenario.global_batch % (dp * m) == 0:
                out.append({"dp": dp, "pp": pp, "micro_batches": m})
    return out


def best_plan(scenario: Scenario) -> dict:
    """The quickest PREDICTED plan that fits (the exercise's reference answer)."""
    costs = [plan_cost(scenario, p) for p in candidates(scenario)]
    return min((x for x in costs if x["fits"]), key=lambda x: x["step_s"])["plan"]


def plan_text(plan: dict) -> str:
    if plan["pp"] == 1:
        return f"dp {plan['dp']}"
    return f"dp {plan['dp']} × pp {plan['pp']}, m = {plan.get('micro_batches', 1)}"


def cost_text(cost: dict) -> str:
    fits = "fits" if cost["fits"] else f"DOES NOT FIT in {cost['capacity'] / 1e9:.0f} GB"
    return (f"{plan_text(cost['plan'])}: {cost['step_s'] * 1e3:,.0f} ms a step, "
            f"{cost['memory'] / 1e9:.1f} GB on the fullest GPU ({fits})")


# ------------------------------------------------------------------ exercise 15.2: a plan for a cluster
def the_best_plan() -> dict:
    """Exercise 15.2's reference: the best plan for ``SCENARIO`` (a search)."""
    return best_plan(SCENARIO)


def check_plan(fn):
    """Exercise 15.2: the learner's ``fn()`` returns a plan {"dp", "pp", "micro_batches"}
    for ``SCENARIO``; the cost model says what it costs against the best
    plan that fits. Right when it fits and is within 10 % of the best. Returns the
    function to use next (a plan maker)."""
    scenario, best = SCENARIO, best_plan(SCENARIO)
    best_cost = plan_cost(scenario, best)
    reference = fallback(the_best_plan)
    try:
        plan = fn()
        cost = plan_cost(scenario, plan)
    except NotImplementedError:
        print("[plan] not attempted yet: the lab goes on with the best plan the cost model "
              f"finds ({plan_text(best)}).")
        return reference
    except (ValueError, KeyError, TypeError) as exc:
        print(f"[plan] the cost model cannot run your plan: {exc}. The lab goes on with the "
              "best plan it finds.")
        return reference
    ratio = cost["step_s"] / best_cost["step_s"]
    print(f"[plan] PREDICTED for yours, {cost_text(cost)}\n"
          f"       the best that fits, {cost_text(best_cost)}\n"
          f"       yours costs {ratio:.2f}x the best's step")
    if not cost["fits"]:
        print("[plan] not yet: your plan does not fit in memory (a replica's activations "
              "grow with the images it computes at once). The lab goes on with the best plan.")
        return reference
    if ratio > 1.1:
        print("[plan] it fits, but more than 10 % slower than the best: what does the "
              "bubble cost with so few micro-batches, or the messages with so many stages? "
              "The lab goes on with the best plan.")
        return reference
    print("[plan] right: it fits and is within 10 % of the best.")
    return fn
