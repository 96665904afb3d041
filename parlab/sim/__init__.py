"""The cost model: what a strategy would do on hardware you do not own (PREDICTIONS).

Everything here is predicted from a handful of numbers about a model and a cluster, and
labelled so wherever it is shown. Framework-free: no torch, no tensorflow.

Inputs
    ``Network``     a model as layers: ``Network.mlp(sizes)``, ``Network.transformer(...)``
    ``Cluster``     devices (memory, sustained FLOP/s and memory bandwidth, a fixed cost
                    per layer pass) and their links (``Link``: alpha-beta); presets in
                    ``clusters``: ``this_machine(...)``, ``t4_pcie()``, ``a100_nvlink()``,
                    ``h100_nvlink()``, ``h100_infiniband(nodes)``; ``calibrated(...)``
    costs           a layer pass's seconds: ``Roofline(net, cluster)`` (default) or
                    ``Measured`` (``Measured.from_timeline({batch: timeline}, net)``)

Predicted timelines (``parlab.trace.Timeline`` subclass ``PredictedTimeline``, with
``predicted = True``, ``step_s``, ``notes``; ``plot.timeline`` draws them dotted):
    ``single_device``, ``manual_split``, ``tensor_parallel`` (naive / column_row),
    ``pipeline`` (gpipe / 1f1b / interleaved), ``data_parallel`` (buckets, overlap),
    ``parameter_server`` (sync / async, slow workers), ``hybrid`` (dp × tp, dp × pp);
    ``timeline(name, net, cluster, batch, **options)`` dispatches by name.

Memory per device (no ZeRO): ``memory(net, batch, dp=, tp=, pp=, micro_batches=,
schedule=, cluster=)`` -> the busiest device's ``Memory`` (params, grads, optimizer,
activations, capacity; ``fits``; ``check()`` raises ``DoesNotFit`` naming what to change);
``memory_per_device`` (one per stage), ``parameter_server_memory``.

Checked against papers: ``published.checks()`` (GPipe, Megatron-LM, nccl-tests).

The older summary model stays: ``Workload``, ``Plan``, ``predict`` -> ``Prediction``,
``plans``, ``calibrated``, ``with_links``, ``h100_nodes``, ``presets`` (lab 07), and the
closed forms ``send_s``, ``all_reduce_s``, ``bubble``.
"""
from . import clusters, published
from .clusters import (a100_nvlink, gpu_presets, h100_infiniband, h100_nvlink, t4_pcie,
                       this_machine)
from .costs import Layer, Measured, Network, Roofline
from .engine import Deadlock, PredictedTimeline
from .model import (AXES, Cluster, Link, Plan, Prediction, Workload, all_reduce_s, bubble,
                    calibrated, h100_nodes, plans, predict, presets, send_s, with_links)
from .memory import DoesNotFit, Memory, memory, memory_per_device, parameter_server_memory
from .timelines import (STRATEGIES, all_gather_s, data_parallel, hybrid, manual_split,
                        parameter_server, pipeline, single_device, tensor_parallel, timeline)

__all__ = sorted([
    "AXES", "Cluster", "Deadlock", "DoesNotFit", "Layer", "Memory", "a100_nvlink", "clusters",
    "gpu_presets", "h100_infiniband", "h100_nvlink", "memory", "memory_per_device",
    "parameter_server_memory", "published", "t4_pcie", "this_machine", "Link", "Measured", "Network", "Plan",
    "PredictedTimeline", "Prediction", "Roofline", "STRATEGIES", "Workload", "all_gather_s",
    "all_reduce_s", "bubble", "calibrated", "data_parallel", "h100_nodes", "hybrid",
    "manual_split", "parameter_server", "pipeline", "plans", "predict", "presets", "send_s",
    "single_device", "tensor_parallel", "timeline", "with_links",
])
