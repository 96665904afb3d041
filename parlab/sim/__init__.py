"""The cost model: what a strategy would do on hardware you do not own (PREDICTIONS).

Everything here is predicted from a handful of numbers about a model and a cluster, and
labelled so wherever it is shown. Framework-free: no torch, no tensorflow. Modules:
``layers`` (one layer's numbers; linear, convolution, pooling, up-convolution, concat),
``network`` (a model as layers and skip connections), ``convnets`` (a U-Net, an
AmoebaNet-like network), ``costs`` (a layer pass's seconds), ``engine`` (ranks' programs run on paper),
``program`` (what the strategy functions share: the mesh, a stage's passes, schedules,
every rank's step program), ``timelines`` (one function per strategy; ``servers``: lab
06's; ``strategies``: by name), ``memory``, ``clusters`` (presets with their sources),
``published`` (checks against papers), ``model`` (the summary model), ``calibrate``
(fits to what a lab measured), ``checks`` (every input checked where it enters).

Inputs
    ``Network``     a model as layers: ``Network.mlp(sizes, optimizer="sgd")``,
                    ``Network.transformer(name, layers, hidden, heads, seq, vocab)``,
                    ``Network.unet(image, in_channels, classes, base, depth)``,
                    ``Network.amoebanet(image, cells, filters, classes)``; skip
                    connections recorded (``net.skips``), so a pipeline cut carries
                    every tensor crossing it: ``net.cut_bytes(at, batch)``
    ``Cluster``     devices (memory, sustained FLOP/s and memory bandwidth, a fixed cost
                    per layer pass, the wake-up of a blocked rank on a busy CPU) and their
                    links (``Link``: alpha-beta), intra- and inter-node. Presets:
                    ``t4_pcie()``, ``a100_nvlink()``, ``h100_nvlink()``,
                    ``h100_infiniband(nodes)``, ``h100_nodes(nodes)`` (one of the two),
                    ``v100_dgx2h()``, ``gpu_presets()``; this
                    machine: ``parlab.course.calibrate.measure_this_machine()`` (one launch:
                    lab 00's link sweep and lab 01's step), ``calibrate.this_machine(link,
                    flops=...)`` (what a lab measured) or ``calibrated(calibration, sizes)``
    costs           a layer pass's seconds: ``Roofline(net, cluster)`` (the default:
                    max(flops / rate, bytes / bandwidth) + a fixed cost) or ``Measured``
                    (``Measured.from_timeline({batch: single-device timeline}, net)``);
                    ``measure_this_machine`` gives two: lab 01's step back to back
                    ("costs") and timed between messages ("costs_between_messages",
                    1.3-1.7x slower here: a rank that has just blocked computes
                    slower), for the ranks of a distributed step; ``calibrate`` fits
                    links and compute rates to what a lab measured

Shared cores (this machine): with more runnable threads than ``cores`` (ranks, plus
DDP's communication thread), a rank woken by a message waits ``wake_latency_s × threads
/ cores`` for a core, and every step of a ring collective (2(n - 1) of them, each a
blocking receive in gloo) pays one more wake-up (``engine.oversubscription``,
``engine.ring_wakeups_s``): why a message costs far more among computing ranks than an
idle ping-pong sweep measures.

Predicted timelines: ``PredictedTimeline``, a ``parlab.trace.Timeline`` with
``predicted = True``, ``title``, ``step_s`` and ``notes``; the measured runs' span names
("forward", "backward", "update"; "F3"/"B3"), so ``plot.timeline`` (which draws it
dotted and titled "predicted") and ``summary()`` work as on a measurement. Every one
takes ``(net, cluster, batch, ..., steps=1, costs=None)``:
    ``single_device``                                      lab 01
    ``manual_split(devices=2, bounds=None)``               lab 02
    ``tensor_parallel(devices=2, scheme="column_row" | "naive")``   lab 03
    ``pipeline(stages=2, micro_batches=4, schedule="gpipe" | "1f1b" | "interleaved",
               chunks=2)``                                 lab 04
    ``data_parallel(devices=2, buckets=1 | n | "per_tensor", overlap=True)``   lab 05
    ``parameter_server(workers=2, mode="sync" | "async", slow={rank: factor})``  lab 06
    ``hybrid(dp=2, tp=1, pp=1, micro_batches=4)``          lab 07
    ``timeline(name, net, cluster, batch, **options)`` dispatches by name (``STRATEGIES``).

Memory per device (no ZeRO): ``memory(net, batch, dp=, tp=, pp=, micro_batches=,
schedule=, cluster=)`` -> the busiest device's ``Memory`` (params, grads, optimizer,
activations, capacity; ``fits``; ``check()`` raises ``DoesNotFit`` naming what to change);
``memory_per_device`` (one per stage), ``parameter_server_memory``.

Checked against papers: ``published.checks()`` / ``published.lines()`` (GPipe Table 2,
Megatron-LM's 8-way weak scaling, nccl-tests' bus bandwidth); against this machine:
``python -m parlab bench --only sim``.

The summary model of lab 07 stays: ``Workload``, ``Plan``, ``predict`` -> ``Prediction``,
``plans``, ``calibrated``, ``with_links``, ``presets`` (language models), and the closed
forms ``send_s``, ``all_reduce_s``, ``bubble``.
"""
from . import calibrate, clusters, published
from .clusters import (a100_nvlink, gpu_presets, h100_infiniband, h100_nodes, h100_nvlink,
                       t4_pcie, v100_dgx2h)
from .costs import Measured, Roofline
from .layers import Gemm, Layer
from .network import Network
from .engine import Deadlock, PredictedTimeline
from .memory import DoesNotFit, Memory, memory, memory_per_device, parameter_server_memory
from .model import (AXES, Cluster, Link, Plan, Prediction, Workload, all_reduce_s, bubble,
                    calibrated, measured_link, plans, predict, presets, send_s, with_links)
from .servers import parameter_server
from .strategies import STRATEGIES, timeline
from .timelines import (all_gather_s, data_parallel, hybrid, manual_split, pipeline,
                        single_device, tensor_parallel)

__all__ = [
    "AXES", "Cluster", "Deadlock", "DoesNotFit", "Gemm", "Layer", "Link", "Measured", "Memory",
    "Network", "Plan", "PredictedTimeline", "Prediction", "Roofline", "STRATEGIES", "Workload",
    "a100_nvlink", "all_gather_s", "all_reduce_s", "bubble", "calibrate", "calibrated", "clusters",
    "data_parallel", "gpu_presets", "h100_infiniband", "h100_nodes", "h100_nvlink", "hybrid",
    "manual_split", "measured_link", "memory", "memory_per_device", "parameter_server",
    "parameter_server_memory", "pipeline", "plans", "predict", "presets", "published", "send_s",
    "single_device", "t4_pcie", "tensor_parallel", "timeline", "v100_dgx2h",
    "with_links",
]
