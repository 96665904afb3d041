"""The cost model: what a strategy would do on hardware you do not own (PREDICTIONS).

Everything here is predicted from a handful of numbers about a model and a cluster, and
labelled so wherever it is shown. Framework-free: no torch, no tensorflow. Modules:
``layers`` (one layer's numbers; linear, convolution, pooling, up-convolution, concat),
``network`` (a model as layers and skip connections), ``convnets`` (a U-Net, an
AmoebaNet-like network, torchgpipe's U-Net), ``imagenet`` (VGG-16, ResNet, Inception-v3,
AmoebaNet-D as their reference code builds them), ``blocks`` (GPT and Llama-style
transformer blocks), ``gemm``
(a matrix product's seconds by its shape), ``costs`` (a layer pass's seconds),
``links`` and ``collectives`` (alpha-beta links; rings inside a node, across nodes over
every card, NVLink SHARP), ``sharding`` (ZeRO 1-3 / FSDP in the step), ``stage`` (the
mesh, one stage's passes), ``engine`` (ranks' programs run on paper),
``program`` (what the strategy functions share: the mesh, a stage's passes, schedules
from ``parlab.pipeline`` and ``parlab.pipeline_orders``, every rank's step program),
``timelines`` (one function per strategy; ``servers``: lab 06's; ``strategies``: by
name), ``memory``, ``clusters`` (presets with their sources),
``published`` (checks against papers), ``published_runs`` (94 published runs, split into
a fitting and a held-out set; ``published_runs_sealed``: 27 more, sealed 2026-11-29),
``validate`` (the model's prediction of each), ``model``
(clusters, workloads), ``summary`` (the summary model), ``calibrate`` (fits to what a
lab measured), ``checks`` (every input checked where it enters), ``limits`` (the largest
timeline the engine draws: 64 ranks, 100,000 operations; networks of 10,000 layers),
``context`` (context parallelism next to tp and sp: a rank's activations and bytes),
``experts`` (expert parallelism: an MoE layer's FLOPs, all-to-all bytes and step per
rank; published MoE runs).

Inputs
    ``Network``     a model as layers: ``Network.mlp(sizes, optimizer="sgd")``,
                    ``Network.transformer(name, layers, hidden, heads, seq, vocab)``,
                    ``Network.unet(image, in_channels, classes, base, depth)``,
                    ``Network.amoebanet(image, cells, filters, classes)``; skip
                    connections recorded (``net.skips``), so a pipeline cut carries
                    every tensor crossing it: ``net.cut_bytes(at, batch)``;
                    ``Network.llama(name, layers, hidden, heads, seq, vocab, kv_heads=,
                    ffn=)`` (grouped-query attention, gated MLP, RMSNorm);
                    ``net.trained(recompute="selective" | "full", sequence_parallel=True)``
    ``Cluster``     devices (memory, matrix FLOP/s and memory bandwidth, a fixed cost
                    per layer pass, the wake-up of a blocked rank on a busy CPU; on GPUs a
                    ``matrix`` unit pricing each product by its shape) and their links
                    (``Link``: alpha-beta), intra- and inter-node (``nics_per_node``
                    cards; ``nvls``: NVLink SHARP). Presets:
                    ``t4_pcie()``, ``a100_nvlink()``, ``a100_pcie()``, ``h100_nvlink()``,
                    ``h200_nvlink()``, ``h100_infiniband(nodes)``, ``h100_nodes(nodes)``,
                    ``v100_dgx2h()``, ``gpu_presets()``; the published runs' machines
                    (``clusters.v100_dgx1``, ``a800_nodes``, ``a100_omnipath``,
                    ``a100_ethernet``, ``p100_pcie``, ``p100_roce``, ``p40_pcie``); this
                    machine: ``parlab.course.calibrate.measure_this_machine()`` (one launch:
                    lab 00's link sweep and lab 01's step), ``calibrate.this_machine(link,
                    flops=...)`` (what a lab measured) or ``calibrated(calibration, sizes)``
    costs           a layer pass's seconds: ``Roofline(net, cluster)`` (the default:
                    max(flops / rate, bytes / bandwidth) + a fixed cost) or ``Measured``
                    (``Measured.from_timeline({batch: single-device timeline}, net)``);
                    ``measure_this_machine`` gives two: lab 01's step back to back
                    ("costs") and timed between messages ("costs_between_messages",
                    1.3-1.7x slower here: a rank that has just blocked computes
                    slower), for the ranks of a distributed step, each with what a
                    pass's call costs whatever its layers (``Measured.call_s``: every
                    rank that runs a pass pays it); ``calibrate`` fits links and compute
                    rates to what a lab measured

Shared cores (this machine): a rank woken by a message resumes late, the later the
longer it blocked (``Cluster.wake_curve``, measured after a short block and a 20 ms
one; ``wake_latency_s``, the 20 ms figure, where no curve is given); with more runnable
threads than ``cores`` (ranks, plus DDP's communication thread where it runs beside its
rank's compute) it waits that × threads / cores for a core, and every step of a ring
collective (2(n - 1) of them, each a blocking receive in gloo) pays one more wake-up
(``engine.oversubscription``, ``engine.ring_wakeups_s``): why a message costs far more
among computing ranks than an idle ping-pong sweep measures. A message needs cores too
(gloo moves it on a thread at each end): one that starts while ranks compute shares the
cores with them, and an isend's thread must take its pinned rank's core from the rank's
compute, which it often does only when the rank next blocks (``Cluster.held_send_share``,
measured; ``shared_cores.held_s``). DDP's bucket all-reduce starts a little after its
last gradient and reaches its rank a little after it ends (``Cluster.handoff_s``,
measured on lab 05's hook), and DDP's wrapper adds its hooks to each step's forward and
backward (``Cluster.ddp_wrapper_s``, measured). A tensor-parallel collective inside a pass costs
its rank the autograd function that calls it and a cold resume after it
(``Cluster.tp_operator_s``, measured on lab 03's column-then-row pair). And a measured
machine's messages stray from their price (``Cluster.message_spread_s``,
``collective_spread_s``, from ``measure_this_machine``'s sweep): the engine adds one
measured stray, drawn at random, to every message, so the median of many predicted
steps reads as the median of many measured ones.

Predicted timelines: ``PredictedTimeline``, a ``parlab.trace.Timeline`` with
``predicted = True``, ``title``, ``step_s`` and ``notes``; the measured runs' span names
("forward", "backward", "update"; "F3"/"B3"), so ``plot.timeline`` (which draws it
dotted and titled "predicted") and ``summary()`` work as on a measurement. Every one
takes ``(net, cluster, batch, ..., steps=1, costs=None)``:
    ``single_device(micro_batches=1)``                     lab 01
    ``manual_split(devices=2, bounds=None)``               lab 02
    ``tensor_parallel(devices=2, scheme="column_row" | "naive", sequence_parallel=False)``
    ``pipeline(stages=2, micro_batches=4, schedule="gpipe" | "1f1b" | "interleaved" | "pipedream"
               | "zb-h1" | "dualpipev", chunks=2, bounds=None)``   lab 04, lab 12
               (zb-h1 and dualpipev split backwards into B, the input's gradient, and
               W, the weights', priced apart: ``Roofline.weight_grad_s``)
    ``data_parallel(devices=2, buckets=1 | n | "per_tensor", overlap=True, zero=0)``
    ``parameter_server(workers=2, mode="sync" | "async", slow={rank: factor})``  lab 06
    ``hybrid(dp=2, tp=1, pp=1, micro_batches=None, schedule=, chunks=2, zero=0,
             sequence_parallel=False, bounds=None, cp=1, ep=1)``   lab 07 (cp: ring
             attention's K/V passes on each rank's second lane; ep: two all-to-alls a
             mixture-of-experts block and pass; without a pipeline the same step as
             ``predict``'s, to rounding)
    and all but the parameter server ``recompute=None | "selective" | "full"``.
    ``timeline(name, net, cluster, batch, **options)`` dispatches by name (``STRATEGIES``).

Memory per device: ``memory(net, batch, dp=, tp=, pp=, micro_batches=, schedule=,
cluster=, zero=, recompute=, sequence_parallel=, cp=, ep=)`` -> the busiest device's ``Memory``
(params, grads, optimizer, activations, gathered-parameter buffers, capacity; ``fits``;
``check()`` raises ``DoesNotFit`` naming what to change); ``memory_per_device`` (one per
stage), ``parameter_server_memory``. Context parallelism (ring attention):
``split_transformer(net, batch, tp=, cp=, sequence_parallel=, layout=)`` -> a rank's
activation bytes and bytes per axis ("tp", "tp_grads", "cp", "cp_grads");
``context.choices(net, batch, node=, devices=, gpu_bytes=)`` and ``context.table`` (rows
for tp, tp + sp, cp and their mix; ``context.llama3_405b()`` at 128K tokens).
Expert parallelism: ``moe_layer(name, tokens, d_model, d_ff, experts, top_k, gated=,
act_bytes=, capacity_factor=)`` -> ``MoELayer`` (params, FLOPs, rows dispatched);
``expert_parallel(layer, ep, cluster=, dp=, layers=, stride=)`` -> a rank's "params",
"flops", "bytes" and "sent" ("all_to_all", "routing", "dp_grads"), "seconds", "step_s",
"memory"; ``experts.traced_all_to_all_bytes`` (the course's traced bytes for a routing,
exactly); ``experts.published_moe_rows()`` / ``experts.lines()`` (DeepSeek-V3, Mixtral
8x22B, Qwen2-57B-A14B); the all-to-all itself: ``collectives.all_to_all_s(nbytes, n,
link)`` (pairwise exchange) and ``collectives.all_to_all_time(cluster, nbytes, size)``.

Checked against papers: ``published.checks()`` / ``published.lines()`` (in-sample: GPipe
Table 2, Megatron-LM's 8-way weak scaling, nccl-tests' bus bandwidth); against 94
published runs split into a fitting and a held-out set before any prediction:
``validate.lines()`` (held out: 41 of 48 expressible within 15 %, median error 6.3 %; 41 of
47 when first predicted); a set sealed before the model's changes of 2026-11-29:
``published_runs_sealed.lines()`` (14 of 27 within 15 %); against this machine:
``python -m parlab bench --only sim``.

The replay (not a prediction: a measured run's own work on dedicated devices):
``replay(run.timeline, link)`` -> ``ReplayedTimeline`` (``replay``, ``replay_program``);
links: a ``Link``, ``TwoTier(inside, between, node_size)``, ``link_preset(name)``,
``ethernet(gbit_per_s)``.

The summary model (lab 07, and runs of thousands of GPUs): ``Workload``, ``Plan``,
``predict(w, cluster, plan, batch, overlap_dp=, zero=, sharding=, chunks=, bounds=,
overlap_tp=)`` -> ``Prediction``, ``plans``, ``calibrated``, ``with_links``, ``presets``
(language models), and the closed forms ``send_s``, ``all_reduce_s``, ``bubble``. A
``Plan(dp=, tp=, pp=, micro_batches=, cp=, ep=)`` may split sequences (context
parallelism) and experts (``Network.llama(..., experts=, top_k=)``); a network with
``fp8=True`` runs its products with weights at the cluster's ``fp8_matrix`` rate.
"""
from . import calibrate, clusters, context, experts, published
from .clusters import (a100_nvlink, a100_pcie, gpu_presets, h100_infiniband, h100_nodes,
                       h100_nvlink, h200_nvlink, t4_pcie, v100_dgx2h)
from .context import split_transformer
from .experts import MoELayer, expert_parallel, moe_layer
from .costs import Measured, Roofline
from .layers import Gemm, Layer
from .network import Network
from .engine import Deadlock, PredictedTimeline
from .memory import DoesNotFit, Memory, memory, memory_per_device, parameter_server_memory
from .model import (AXES, Cluster, Link, Plan, Prediction, Workload, all_reduce_s, bubble,
                    calibrated, measured_link, plans, predict, presets, send_s, with_links)
from .replay import ReplayedTimeline, ReplayStuck, TwoTier, ethernet, link_preset, replay
from .servers import parameter_server
from .strategies import STRATEGIES, timeline
from .timelines import (all_gather_s, data_parallel, hybrid, manual_split, pipeline,
                        single_device, tensor_parallel)

__all__ = [
    "AXES", "Cluster", "Deadlock", "DoesNotFit", "Gemm", "Layer", "Link", "Measured", "Memory",
    "Network", "Plan", "PredictedTimeline", "Prediction", "Roofline", "STRATEGIES", "Workload",
    "a100_nvlink", "a100_pcie", "all_gather_s", "all_reduce_s", "bubble", "calibrate",
    "calibrated", "clusters", "data_parallel", "gpu_presets", "h100_infiniband", "h100_nodes",
    "h100_nvlink", "h200_nvlink", "hybrid",
    "manual_split", "measured_link", "memory", "memory_per_device", "parameter_server",
    "parameter_server_memory", "pipeline", "plans", "predict", "presets", "published", "send_s",
    "single_device", "t4_pcie", "tensor_parallel", "timeline", "v100_dgx2h",
    "with_links", "replay", "ReplayedTimeline", "ReplayStuck", "TwoTier", "ethernet", "link_preset",
    "context", "split_transformer", "experts", "MoELayer", "expert_parallel", "moe_layer",
]
