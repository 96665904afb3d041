"""Lab 07's strategy explorer (re-exported by ``parlab.course.lab07``): the cost model's
PREDICTED step and memory for a model, a cluster and a mesh shape, measured here on request."""
from __future__ import annotations

from ..steps import step_seconds


def strategy_explorer(here=None, *, global_batches=None, run_shape=None):
    """Choose a model, a cluster and a mesh shape: the PREDICTED step and memory at once.

    here: the cluster calibrated on this machine (``survey_hybrid(...)["cluster"]``); with
    it, "measure it here" runs the chosen dp × tp or dp × pp shape of the lab's MLP on
    this machine's 4 devices with ``run_shape(shape, global_batch=, steps=, micro_batches=)``
    (``lab07.run_hybrid``). Every other number is the cost model's (``parlab.sim``).
    """
    from .. import sim
    from ..missing import widgets
    from ..plot.steps import plot_step_parts
    from .explorer import about_text, explorer_box, show_in
    w = widgets()           # without ipywidgets: inert stand-ins, the default view drawn static
    workloads = sim.presets()
    clusters = {}
    if here is not None:
        clusters[f"{here.name} ({here.devices} devices, calibrated)"] = here
    # hardware the learner does not own: the cost model's presets (sim.clusters, datasheets)
    for c in (sim.t4_pcie(2), sim.a100_nvlink(8), sim.h100_nodes(1), sim.h100_nodes(2),
              sim.h100_nodes(16)):
        clusters[c.name] = c
    eight = sim.a100_nvlink(64)             # 8 DGX A100 nodes, 8 cards of 200 Gb/s each
    clusters[f"8 nodes × 8 A100 (NVLink, 8 InfiniBand HDR cards a node)"] = eight
    batches = global_batches or {"lab MLP 64-256-256-128-10": 64, "GPT-2 XL (1.5 B)": 512,
                                 "GPT-3 (175 B)": 1536}
    model = w.Dropdown(options=list(workloads), description="model")
    cluster = w.Dropdown(options=list(clusters), description="cluster")
    tp = w.SelectionSlider(options=[1], description="tp", continuous_update=False)
    pp = w.SelectionSlider(options=[1], description="pp", continuous_update=False)
    # -4: the lab's setting, 4 micro-batches per replica in a pipeline, the whole batch otherwise
    micro = w.Dropdown(options=[("whole batch", 0), ("m = 4 in a pipeline", -4)]
                       + [(f"{k} samples", k) for k in (1, 2, 4, 8, 16, 32, 64)],
                       value=0, description="micro-batch")
    inner = w.ToggleButtons(options=["tp innermost", "dp innermost"], description="order")
    overlap = w.Checkbox(value=False, description="dp overlaps backward (DDP)")
    sharp = w.Checkbox(value=True, description="NVLink SHARP (H100 nodes)",
                       tooltip="the NVSwitch adds the GPUs' contributions: NCCL's default on H100")
    measure = w.Button(description="measure it here", tooltip="4 ranks on this machine")
    out, text = w.Output(), w.HTML()

    def divisors(n):
        return [d for d in range(1, n + 1) if n % d == 0]

    def plan_of(dp_, tp_, pp_, batch):
        b = batch // dp_
        if micro.value < 0:
            m = -micro.value if pp_ > 1 and b % -micro.value == 0 else 1
        else:
            m = max(b // micro.value, 1) if micro.value and b % micro.value == 0 else 1
        order = AXES_INNER[inner.value]
        return sim.Plan(dp=dp_, tp=tp_, pp=pp_, micro_batches=m, order=order)

    busy = []          # set while the choices are being rebuilt: draw once, at the end

    def refresh_pp(*_):
        n, layers = clusters[cluster.value].devices, workloads[model.value].layers
        keep = pp.value
        busy.append(1)
        pp.options = [d for d in divisors(n // tp.value) if d <= layers]
        pp.value = keep if keep in pp.options else 1
        busy.pop()
        draw()

    def refresh_choices(*_):
        n = clusters[cluster.value].devices
        busy.append(1)
        tp.options = divisors(n)
        tp.value = 2 if n % 2 == 0 else 1
        # language models: a few sequences per micro-batch, or the activations never fit
        # (GPT-3 fits nowhere with 4: at 80 GB per H100, one sequence per micro-batch
        # needs 16 nodes of 8; the lab MLP: m = 4 in a pipeline, as measured in the lab)
        micro.value = (-4 if model.value.startswith("lab")
                       else 1 if model.value.startswith("GPT-3") else 4)
        busy.pop()
        refresh_pp()

    def draw(*_):
        if busy or tp.value is None or pp.value is None:
            return
        wl, cl, batch = workloads[model.value], clusters[cluster.value], batches[model.value]
        if cl.nvls and not sharp.value:
            from dataclasses import replace
            cl = replace(cl, nvls=False)
        n = cl.devices
        if n % (tp.value * pp.value):
            text.value = f"<b>tp × pp = {tp.value * pp.value} does not divide {n} devices</b>"
            return
        chosen = (n // (tp.value * pp.value), tp.value, pp.value)
        shapes = sorted({(n // t, t, 1) for t in divisors(n)} | {(n // p, 1, p) for p in divisors(n)
                        if p <= wl.layers} | {chosen}, key=lambda s: (s[2] > 1, -s[0], s[2]))
        entries, picked = [], None
        for dp_, tp_, pp_ in shapes:
            if batch % dp_:
                continue
            try:
                pred = sim.predict(wl, cl, plan_of(dp_, tp_, pp_, batch), batch,
                                   overlap_dp=overlap.value)
            except ValueError:
                continue
            label = pred.plan.label().replace(" × ", "\n× ")
            entries.append(("▶ " + label if (dp_, tp_, pp_) == chosen else label, pred, None))
            if (dp_, tp_, pp_) == chosen:
                picked = pred
        unit = "s" if max(e[1].step_s for e in entries) >= 1 else "ms"
        show_in(out, plot_step_parts(entries, unit=unit, title=f"PREDICTED: {wl.name}, global "
                                                               f"batch {batch}, on {cl.name}"))
        if picked is None:
            text.value = "<b>the chosen shape does not split this batch</b>"
            return
        mem, gb = picked.memory, 1e9
        scale, unit = next((f, u) for f, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B"))
                           if mem["total"] >= f or f == 1)
        links = "; ".join(f"{a} {path}" for a, path in picked.paths.items()) or "no communication"
        step = (f"{picked.step_s:,.2f} s" if picked.step_s >= 1 else f"{picked.step_s * 1e3:,.2f} ms")
        text.value = (f"<b>PREDICTED for {picked.plan.label()}</b> (m = {picked.plan.micro_batches} "
                      f"micro-batches per replica): step {step}; memory per "
                      f"device {mem['total'] / scale:,.1f} {unit} of {cl.memory_bytes / gb:,.0f} GB "
                      f"(states {mem['states'] / scale:,.1f} {unit}, activations "
                      f"{mem['activations'] / scale:,.1f} {unit}): "
                      f"{'fits' if picked.fits else '<b>does not fit</b>'}; {links}.")

    def run_here(_):
        with out:
            if (here is None or run_shape is None or clusters[cluster.value] is not here
                    or not model.value.startswith("lab")):
                print("measuring needs this machine's cluster and the lab MLP")
                return
            from ..mesh import HybridShape
            shape = HybridShape.of({"dp": here.devices // tp.value, "tp": tp.value}
                                   if pp.value == 1
                                   else {"dp": here.devices // pp.value, "pp": pp.value})
            if tp.value > 1 and pp.value > 1:
                print("measured here: dp × tp or dp × pp (not both model axes at once)")
                return
            batch = batches[model.value]
            plan = plan_of(shape.dp, tp.value, pp.value, batch)
            if pp.value == 1:       # dp × tp runs the replica's batch whole
                plan = sim.Plan(dp=plan.dp, tp=plan.tp, order=plan.order)
            print(f"measuring {shape.as_dict()} on {here.devices} ranks ...")
            res = run_shape(shape, global_batch=batch, steps=8,
                            micro_batches=plan.micro_batches)
            marker = "forward" if shape.axis == "tp" else "F0"
            pred = sim.predict(workloads[model.value], here, plan, batch)
            print(f"{plan.label()}, m = {plan.micro_batches}: measured here "
                  f"{step_seconds(res.timeline, marker) * 1e3:.2f} ms per step, "
                  f"PREDICTED {pred.step_s * 1e3:.2f} ms")

    for widget in (model, cluster):
        widget.observe(refresh_choices, names="value")
    tp.observe(lambda change: None if busy else refresh_pp(), names="value")
    for widget in (pp, micro, inner, overlap, sharp):
        widget.observe(draw, names="value")
    measure.on_click(run_here)
    refresh_choices()
    controls = [model, cluster, tp, pp, micro, inner, overlap, sharp]
    return explorer_box([w.HBox([model, cluster]), w.HBox([tp, pp, micro]),
                         w.HBox([inner, overlap, sharp]), measure, text, out],
                        about_text(controls, True, text.value))


AXES_INNER = {"tp innermost": ("dp", "pp", "tp"), "dp innermost": ("tp", "pp", "dp")}
