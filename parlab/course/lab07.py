"""Lab 07 (labs/07_hybrid.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

from ..launcher import LaunchResult, launch
from ..split import share
from ..steps import step_seconds
from .exercise import Exercise, check, register  # noqa: F401 (labNN.check)


HYBRID_SHAPES = ({"dp": 1, "tp": 4}, {"dp": 4, "tp": 1}, {"dp": 2, "tp": 2},
                 {"dp": 1, "pp": 4}, {"dp": 4, "pp": 1}, {"dp": 2, "pp": 2})


def check_hybrid(shape: dict, *, sizes=None, global_batch: int = 64, micro_batches: int = 4,
                 schedule="1f1b", steps: int = 5, lr: float = 0.1, devices=None):
    """Everything about a hybrid run that can be wrong, said before any rank starts.

    shape: {"dp": d, "tp": t} or {"dp": d, "pp": p} (or a ``parlab.mesh.HybridShape``), the last
    axis varying fastest. Refuses: axes other than these, a mesh whose size is not the
    number of devices, a global batch that does not split over the replicas, an MLP
    whose widths do not split over tp, a pipeline that ``pipeline.prepare`` refuses.
    Returns the ``HybridShape`` and, for dp × pp, the replica's prepared config and
    schedule (for dp × tp: None, None): what the ranks are handed.
    """
    from ..mesh import HybridShape
    hs = HybridShape.of(shape)
    if devices is not None:
        hs.grid.check_world(devices.n)
    share(global_batch, hs.dp, f"dp={hs.dp} replicas")
    from ..torch import hybrid, models, pipeline
    from ..torch import tensor_parallel as tp
    sizes = tuple(sizes or hybrid.SIZES)
    if hs.axis == "tp":
        if hs.tp > 1:
            try:   # build this rank's slices of the real model, as rank 0 of tp would
                tp.slice_mlp(models.mlp(sizes), "column_row", tp.layout(hs.tp))
            except ValueError as exc:
                raise ValueError(f"the MLP {sizes} does not split over tp={hs.tp}: "
                                 f"{exc}") from None
        return hs, None, None
    from ..split import SplitConfig
    cfg = hybrid.replica_config(SplitConfig(sizes=sizes, batch_size=global_batch, steps=steps,
                                            lr=lr), hs.dp)
    cfg, ops = pipeline.prepare(cfg, hs.pp, hs.micro_batches(micro_batches), schedule)
    return hs, cfg, ops


def _mesh_labelled(res: LaunchResult) -> LaunchResult:
    """The launch with its timeline's lanes named by mesh coordinates (mesh.labels())."""
    from dataclasses import replace

    from ..trace import Timeline
    labels = res.results[0]["labels"]
    return replace(res, timeline=Timeline(res.timeline.spans, labels, res.timeline.ranks))


def run_hybrid(shape: dict, *, sizes=None, global_batch: int = 64, steps: int = 5,
               lr: float = 0.1, micro_batches: int = 4, schedule="1f1b", bucket: bool = True,
               timeout: float = 120.0, devices=None) -> LaunchResult:
    """Train the MLP on a dp × tp or dp × pp mesh by hand: validated, then launched.

    dp × tp: ``hybrid.train_dp_tp``; dp × pp: ``hybrid.train_dp_pp`` with the replica's
    pipeline (``micro_batches``, ``schedule``). The timeline's lanes carry the ranks'
    mesh coordinates. See ``check_hybrid`` for what is refused before any rank starts.
    """
    from ..torch import hybrid
    hs, cfg, ops = check_hybrid(shape, sizes=sizes, global_batch=global_batch,
                                micro_batches=micro_batches, schedule=schedule, steps=steps,
                                lr=lr, devices=devices)
    sizes = tuple(sizes or hybrid.SIZES)
    if hs.axis == "tp":
        res = launch(hybrid.train_dp_tp, hs.world_size,
                     args=(hs.dp, hs.tp, sizes, global_batch, steps, lr, 0, bucket),
                     timeout=timeout, devices=devices)
    else:
        res = launch(hybrid.train_dp_pp, hs.world_size,
                     args=(cfg, hs.micro_batches(micro_batches), ops, hs.dp, hs.pp, bucket),
                     timeout=timeout, devices=devices)
    return _mesh_labelled(res)


def run_hybrid_library(shape: dict | None = None, *, sizes=None, global_batch: int = 64,
                       steps: int = 5, lr: float = 0.1,
                       data=("fsdp", "ddp", "ddp_process_group"), timeout: float = 180.0,
                       devices=None) -> LaunchResult:
    """DTensor tensor parallel × PyTorch data parallel (``hybrid.library_dp_tp``)."""
    from ..torch import hybrid
    hs, _, _ = check_hybrid(shape or {"dp": 2, "tp": 2}, sizes=sizes, global_batch=global_batch,
                            devices=devices)
    if hs.axis != "tp":
        raise ValueError("the library version combines tensor parallel and data parallel: "
                         "give {'dp': d, 'tp': t}")
    sizes = tuple(sizes or hybrid.SIZES)
    res = launch(hybrid.library_dp_tp, hs.world_size,
                 args=(hs.dp, hs.tp, sizes, global_batch, steps, lr, 0, tuple(data)),
                 timeout=timeout, devices=devices)
    return _mesh_labelled(res)


def survey_hybrid(shapes=HYBRID_SHAPES, *, sizes=None, global_batch: int = 64, steps: int = 8,
                  micro_batches: int = 4, schedule="1f1b", timeout: float = 240.0,
                  devices=None) -> dict:
    """Calibrate the cost model here, then measure every mesh shape, in one launch.

    Returns {"cluster": the calibrated ``sim.Cluster``, "calibration": the raw costs,
    "rows": per shape its measured step time, its PREDICTED one (``sim.predict``) and
    bytes per rank per step on each axis, measured and from the formula,
    "timeline": every shape's steps, lanes by global rank}.
    """
    import numpy as np

    from .. import sim
    from ..torch import hybrid
    sizes = tuple(sizes or hybrid.SIZES)
    prepared = [check_hybrid(shape, sizes=sizes, global_batch=global_batch,
                             micro_batches=micro_batches, schedule=schedule, steps=steps,
                             devices=devices) for shape in shapes]
    worlds = {hs.world_size for hs, _, _ in prepared}
    if len(worlds) != 1:
        raise ValueError(f"every shape must cover the same ranks; these need {sorted(worlds)}")
    world = worlds.pop()
    res = launch(hybrid.survey, world, args=(prepared, sizes, global_batch, steps,
                                             micro_batches),
                 timeout=timeout, devices=devices)
    cal = res.results[0]["calibration"]
    cluster = sim.calibrated(cal, sizes, devices=world)
    workload = sim.Workload.mlp(sizes)
    rows = []
    for (hs, cfg, _), entry in zip(prepared, res.results[0]["shapes"]):
        window = res.timeline.window(*entry["window"])
        marker = "forward" if hs.axis == "tp" else "F0"
        plan = sim.Plan(dp=hs.dp, tp=hs.tp, pp=hs.pp, micro_batches=hs.micro_batches(micro_batches))
        n_steps = len(window.step_windows(marker))
        measured_bytes = {a: float(np.mean([window.comm_bytes(r, a) for r in window.ranks]))
                          / n_steps for a in ("dp", hs.axis)}
        if hs.axis == "tp":
            expected = hybrid.expected_dp_tp(sizes, global_batch, hs.dp, hs.tp)
        else:
            per_stage = hybrid.expected_dp_pp(cfg, hs.dp)
            expected = {a: float(np.mean([per_stage[r % hs.pp][a] for r in range(world)]))
                        for a in ("dp", "pp")}
        shape = hs.as_dict()
        rows.append({"shape": shape, "label": " × ".join(f"{a} {n}" for a, n in shape.items()),
                     "measured_s": step_seconds(window, marker),
                     "predicted": sim.predict(workload, cluster, plan, global_batch),
                     "bytes": measured_bytes, "expected_bytes": expected})
    return {"cluster": cluster, "calibration": cal, "rows": rows, "timeline": res.timeline}


MESH_CASES = ({"dp": 2, "tp": 2}, {"dp": 3, "tp": 2}, {"dp": 2, "pp": 2, "tp": 2},
              {"dp": 2, "pp": 3, "tp": 2})


def mesh_groups_reference(shape: dict) -> dict:
    """Every line of the mesh along each axis: ``parlab.mesh.Grid(**shape).lines(axis)``."""
    from ..mesh import Grid
    grid = Grid(**shape)
    return {a: grid.lines(a) for a in grid.axes}


def _as_groups(groups):
    return [[int(r) for r in g] for g in groups]


def _mesh_problems(groups: dict, shape: dict) -> list[str]:
    """What is wrong with a learner's groups for one mesh shape, in words (none: [])."""
    from ..mesh import Grid
    grid = Grid(**shape)
    world, want = grid.world_size, mesh_groups_reference(shape)
    name = grid.describe()
    if not isinstance(groups, dict) or set(groups) != set(grid.axes):
        got = sorted(groups) if isinstance(groups, dict) else type(groups).__name__
        return [f"for {name}: return a dict with one list of groups per axis "
                f"{list(grid.axes)}; got {got}"]
    problems = []
    for axis in grid.axes:
        try:
            mine = _as_groups(groups[axis])
        except (TypeError, ValueError):
            problems.append(f"for {name}: {axis} must be a list of groups, each a list of "
                            f"ranks, e.g. {want[axis][0]}")
            continue
        if sorted(map(sorted, mine)) == sorted(map(sorted, want[axis])):
            unordered = [g for g in mine if g != sorted(g)]
            if unordered:
                problems.append(
                    f"for {name}: the {axis} group {unordered[0]} holds the right ranks in the "
                    f"wrong order: position i of a line is coordinate i along {axis} (a "
                    f"pipeline's stage i, a slice's index), so list it as {sorted(unordered[0])}")
            continue
        flat = [r for g in mine for r in g]
        outside = sorted({r for r in flat if not 0 <= r < world})
        missing = sorted(set(range(world)) - set(flat))
        twice = sorted({r for r in flat if flat.count(r) > 1})
        sizes = sorted({len(g) for g in mine})
        if outside:
            problems.append(f"for {name}: ranks {outside} do not exist; the mesh has ranks "
                            f"0 .. {world - 1}")
        elif missing or twice:
            what = [f"{missing} in no group" if missing else "",
                    f"{twice} in more than one" if twice else ""]
            problems.append(f"for {name}: the {axis} groups must share out all {world} ranks, "
                            f"each in exactly one group; yours have "
                            f"{' and '.join(w for w in what if w)}")
        elif sizes != [grid.shape[axis]]:
            problems.append(f"for {name}: each {axis} group has {axis} = {grid.shape[axis]} "
                            f"ranks, one per coordinate along {axis}; yours have {sizes}")
        else:
            same_as = [o for o in grid.axes if o != axis
                       and sorted(map(sorted, mine)) == sorted(map(sorted, want[o]))]
            if same_as:
                last = grid.axes[-1]
                problems.append(
                    f"for {name}: your {axis} groups are the {same_as[0]} groups: the last axis "
                    f"({last}) varies fastest, so neighbouring ranks differ in {last} "
                    f"(stride 1), and each axis before it strides over all the axes after it. "
                    f"The {axis} groups are {want[axis]}")
            else:
                problems.append(f"for {name}: {mine} are not lines along {axis}: a line varies "
                                f"the {axis} coordinate and keeps every other; expected "
                                f"{want[axis]}")
    return problems


def _mesh_group_ranks(rank: int, world_size: int, groups: dict) -> dict:
    """On each rank: build the learner's groups as process groups, all-reduce the rank."""
    import torch
    import torch.distributed as dist

    from ..torch import comm
    sums = {}
    for axis, lines in groups.items():
        mine = None
        for line in lines:              # collective: every rank builds every group, in order
            pg = dist.new_group(line)
            if rank in line:
                mine = (line, pg)
        x = torch.tensor([float(rank)])
        comm.all_reduce(x, group=mine[1], name=f"{axis} all_reduce")
        sums[axis] = {"group": mine[0], "sum": float(x)}
    return sums


def check_mesh_groups(fn, cases=MESH_CASES):
    """Check a learner's ``fn(shape) -> {axis: [[ranks], ...]}`` against ``parlab.mesh``.

    First the arithmetic, for every shape of ``cases`` (2-D and 3-D meshes), in words.
    Then the first shape's groups are built as process groups on real ranks (when they
    share out the ranks), and an all-reduce of each rank's number on each group is
    compared with the sum over the rank's true line. Returns the function to use next.
    """
    from ..mesh import Grid
    problems, wrong_shapes = [], []
    for shape in cases:
        try:
            groups = fn(dict(shape))
        except NotImplementedError:
            print("[mesh_groups] not attempted yet: the lab goes on with the reference "
                  "(parlab.mesh). Fill in the function and run this cell again.")
            return mesh_groups_reference
        except Exception as exc:  # noqa: BLE001 - reported to the learner in words
            found = [f"for {Grid(**shape).describe()}: {type(exc).__name__}: {exc}"]
        else:
            found = _mesh_problems(groups, shape)
        if found and not problems:
            problems = found                    # the first wrong mesh, every axis of it
        elif found:
            wrong_shapes.append(Grid(**shape).describe())
    if wrong_shapes:
        problems.append(f"also wrong for {', '.join(wrong_shapes)}")
    first, grid = cases[0], Grid(**cases[0])
    want = mesh_groups_reference(first)
    try:
        groups = {a: _as_groups(g) for a, g in fn(dict(first)).items()}
        runnable = all(sorted(r for g in groups[a] for r in g) == list(grid)
                       for a in grid.axes)
        same_sets = all(sorted(map(sorted, groups[a])) == sorted(map(sorted, want[a]))
                        for a in grid.axes)
    except Exception:  # noqa: BLE001 - already reported above
        runnable = same_sets = False
    if runnable and same_sets and problems:
        pass        # only the order within a group is wrong: sums cannot show that
    elif runnable:
        from ..launcher import launch
        results = launch(_mesh_group_ranks, grid.world_size, args=(groups,), timeout=60).results
        for axis in grid.axes:        # the first rank whose sum is wrong, per axis
            for rank, res in enumerate(results):
                line = grid.line(rank, axis)
                if res[axis]["sum"] != sum(line):
                    problems.append(
                        f"on real ranks ({grid.describe()}): rank {rank}'s {axis} all-reduce "
                        f"summed ranks {res[axis]['group']} = {res[axis]['sum']:.0f}; its {axis} "
                        f"line {line} gives {sum(line)}")
                    break
    else:
        problems.append(f"not run on real ranks: the groups for {grid.describe()} do not share "
                        "out the ranks, so they cannot all be built")
    if problems:
        shown = "\n  ".join(problems)
        print(f"[mesh_groups] not yet right:\n  {shown}\n"
              "The lab goes on with the reference (parlab.mesh).")
        return mesh_groups_reference
    print(f"[mesh_groups] correct for {len(cases)} meshes, "
          f"{', '.join(Grid(**c).describe() for c in cases)}; on {grid.world_size} real ranks "
          f"every all-reduce on your {grid.describe()} groups summed its rank's true line.")
    return fn


def _allreduce_seconds(nbytes, n, latency_s, bandwidth_Bps):
    from ..sim import Link, all_reduce_s
    return all_reduce_s(nbytes, n, Link(latency_s, bandwidth_Bps))


register(Exercise(
    name="allreduce_seconds",
    reference=_allreduce_seconds,
    cases=[(s, n, a, b) for s in (4, 2**20, 2**30) for n in (1, 2, 4, 8)
           for a, b in ((5e-6, 25e9), (50e-6, 1.5e9))],
    hint="a ring all-reduce is a reduce-scatter then an all-gather. In each phase every rank "
         "sends n-1 messages in turn, each a chunk of 1/n of the buffer, and every message "
         "pays the link's latency once before its bytes flow at its bandwidth. One rank has "
         "nobody to talk to.",
))


def strategy_explorer(here=None, *, global_batches=None):
    """Choose a model, a cluster and a mesh shape: the PREDICTED step and memory at once.

    here: the cluster calibrated on this machine (``survey_hybrid(...)["cluster"]``); with
    it, "measure it here" runs the chosen dp × tp or dp × pp shape of the lab's MLP on
    this machine's 4 devices. Every other number is the cost model's (``parlab.sim``).
    """
    import ipywidgets as w
    from IPython.display import display

    from .. import sim
    from ..plot.steps import plot_step_parts
    workloads = sim.presets()
    clusters = {}
    if here is not None:
        clusters[f"{here.name} ({here.devices} devices, calibrated)"] = here
    # hardware the learner does not own: the cost model's presets (sim.clusters, datasheets)
    for c in (sim.t4_pcie(2), sim.a100_nvlink(8), sim.h100_nodes(1), sim.h100_nodes(2),
              sim.h100_nodes(16)):
        clusters[c.name] = c
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
        # (the lab MLP: m = 4 in a pipeline, as measured in the lab)
        micro.value = -4 if model.value.startswith("lab") else 4
        busy.pop()
        refresh_pp()

    def draw(*_):
        if busy or tp.value is None or pp.value is None:
            return
        wl, cl, batch = workloads[model.value], clusters[cluster.value], batches[model.value]
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
        with out:
            out.clear_output(wait=True)
            unit = "s" if max(e[1].step_s for e in entries) >= 1 else "ms"
            display(plot_step_parts(entries, unit=unit, title=f"PREDICTED: {wl.name}, global "
                                                              f"batch {batch}, on {cl.name}"))
        if picked is None:
            text.value = "<b>the chosen shape does not split this batch</b>"
            return
        mem, gb = picked.memory, 1e9
        scale, unit = next((f, u) for f, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B"))
                           if mem["total"] >= f or f == 1)
        links = ", ".join(f"{a} over the {'fast (inside a node)' if k == 'intra' else 'slow (between nodes)'} link"
                          for a, k in picked.links.items()) or "no communication"
        step = (f"{picked.step_s:,.2f} s" if picked.step_s >= 1 else f"{picked.step_s * 1e3:,.2f} ms")
        text.value = (f"<b>PREDICTED for {picked.plan.label()}</b> (m = {picked.plan.micro_batches} "
                      f"micro-batches per replica): step {step}; memory per "
                      f"device {mem['total'] / scale:,.1f} {unit} of {cl.memory_bytes / gb:,.0f} GB "
                      f"(states {mem['states'] / scale:,.1f} {unit}, activations "
                      f"{mem['activations'] / scale:,.1f} {unit}): "
                      f"{'fits' if picked.fits else '<b>does not fit</b>'}; {links}.")

    def run_here(_):
        with out:
            if here is None or clusters[cluster.value] is not here or not model.value.startswith("lab"):
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
            res = run_hybrid(shape, global_batch=batch, steps=8,
                             micro_batches=plan.micro_batches)
            marker = "forward" if shape.axis == "tp" else "F0"
            pred = sim.predict(workloads[model.value], here, plan, batch)
            print(f"{plan.label()}, m = {plan.micro_batches}: measured here "
                  f"{step_seconds(res.timeline, marker) * 1e3:.2f} ms per step, "
                  f"PREDICTED {pred.step_s * 1e3:.2f} ms")

    for widget in (model, cluster):
        widget.observe(refresh_choices, names="value")
    tp.observe(lambda change: None if busy else refresh_pp(), names="value")
    for widget in (pp, micro, inner, overlap):
        widget.observe(draw, names="value")
    measure.on_click(run_here)
    refresh_choices()
    return w.VBox([w.HBox([model, cluster]), w.HBox([tp, pp, micro]), w.HBox([inner, overlap]),
                   measure, text, out])


AXES_INNER = {"tp innermost": ("dp", "pp", "tp"), "dp innermost": ("tp", "pp", "dp")}
