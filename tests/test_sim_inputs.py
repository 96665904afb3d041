"""The cost model refuses impossible inputs where they enter, naming the field and value.

Before these checks a NaN in a cluster's field made the event engine loop forever (a
notebook cell that never returns), a negative bandwidth predicted a faster step, and a
zero bandwidth or ``Plan(dp=0)`` ended in a bare ZeroDivisionError.
"""
import math
import re

import pytest

from parlab import sim

LINK = sim.Link(1e-5, 1e10)
NAN = float("nan")


def _cluster(**kw):
    base = dict(name="toy", devices=4, memory_bytes=1e12, flops=1e12, layer_overhead_s=0.0,
                devices_per_node=4, intra=LINK, inter=LINK)
    base.update(kw)
    return sim.Cluster(**base)


@pytest.mark.parametrize("field,value", [
    ("flops", NAN), ("flops", -1e12), ("flops", 0.0),
    ("memory_bandwidth_Bps", NAN), ("memory_bandwidth_Bps", -5.0),
    ("layer_overhead_s", NAN), ("layer_overhead_s", -1.0), ("layer_overhead_s", math.inf),
    ("wake_latency_s", NAN), ("collective_overhead_s", NAN), ("collective_overhead_s", -1e-3),
    ("cores", -1), ("cores", 1.5), ("devices", 0), ("devices", True), ("devices_per_node", 0),
    ("memory_bytes", NAN), ("memory_bytes", -1.0), ("intra", (1e-5, 1e10)),
])
def test_a_cluster_field_out_of_range_is_named(field, value):
    with pytest.raises(ValueError, match=rf"Cluster .toy.: {field} must .* got {re.escape(repr(value))}"):
        _cluster(**{field: value})


@pytest.mark.parametrize("latency,bandwidth,field", [
    (NAN, 1e9, "latency_s"), (-1e-6, 1e9, "latency_s"), (math.inf, 1e9, "latency_s"),
    (1e-6, NAN, "bandwidth_Bps"), (1e-6, -1e9, "bandwidth_Bps"), (1e-6, 0.0, "bandwidth_Bps"),
])
def test_a_link_out_of_range_is_named(latency, bandwidth, field):
    with pytest.raises(ValueError, match=rf"Link: {field} must"):
        sim.Link(latency, bandwidth)


def test_an_unlimited_link_is_still_allowed():
    assert sim.send_s(1e9, sim.Link(0.0, math.inf)) == 0.0


def test_message_sizes_and_rank_counts_are_checked():
    with pytest.raises(ValueError, match="send_s: nbytes must"):
        sim.send_s(-1, LINK)
    with pytest.raises(ValueError, match=r"all_reduce_s: n \(ranks\) must be a whole number >= 1"):
        sim.all_reduce_s(10, 0, LINK)


@pytest.mark.parametrize("field", ["dp", "tp", "pp", "micro_batches"])
@pytest.mark.parametrize("value", [0, -2, 1.5])
def test_a_plan_needs_whole_positive_degrees(field, value):
    with pytest.raises(ValueError, match=rf"Plan: {field} must be a whole number >= 1, got {value!r}"):
        sim.Plan(**{field: value})


def test_a_plan_order_names_each_axis_once():
    with pytest.raises(ValueError, match="order must name each of"):
        sim.Plan(order=("dp", "dp", "tp"))


@pytest.mark.parametrize("field,value", [("params", NAN), ("flops_per_sample", -1.0),
                                         ("layers", 0), ("dp_messages", 0), ("tp_bytes", NAN)])
def test_a_workload_field_out_of_range_is_named(field, value):
    w = sim.Workload.mlp((8, 8))
    kw = {f: getattr(w, f) for f in w.__dataclass_fields__}
    kw[field] = value
    with pytest.raises(ValueError, match=rf"Workload .*: {field} must"):
        sim.Workload(**kw)


def test_layers_and_networks_check_their_numbers():
    with pytest.raises(ValueError, match=r"Layer 'x': flops must"):
        sim.Layer("x", 10, NAN, 4, 4)
    with pytest.raises(ValueError, match=r"Layer 'x': params must"):
        sim.Layer("x", -10, 1.0, 4, 4)
    good = sim.Network.mlp((8, 8))
    with pytest.raises(ValueError, match=r"Network 'n': layers must be a non-empty tuple"):
        sim.Network("n", (), 8)
    with pytest.raises(ValueError, match=r"Network 'n': act_bytes must"):
        sim.Network("n", good.layers, 8, act_bytes=0)
    with pytest.raises(ValueError, match=r"Network 'n': state\['optimizer'\] must"):
        sim.Network("n", good.layers, 8, state={"params": 4, "grads": 4, "optimizer": NAN})


@pytest.mark.parametrize("preset,arg", [
    (sim.h100_infiniband, "nodes"), (sim.h100_nodes, "nodes"), (sim.t4_pcie, "devices"),
    (sim.a100_nvlink, "devices"), (sim.h100_nvlink, "devices"), (sim.v100_dgx2h, "devices"),
])
@pytest.mark.parametrize("value", [-1, 0, 2.5])
def test_presets_refuse_impossible_sizes_by_their_own_argument(preset, arg, value):
    with pytest.raises(ValueError, match=rf"{preset.__name__}: {arg} must be a whole number >= 1"):
        preset(value)


def test_a_nan_duration_never_reaches_the_engine():
    """The engine's clock cannot pass a NaN: it is refused when the operation is made."""
    from parlab.sim.engine import Collective, Compute, Send
    with pytest.raises(ValueError, match="Compute 'forward': seconds must"):
        Compute("forward", NAN)
    with pytest.raises(ValueError, match="Send 'send': seconds must"):
        Send(1, 100, NAN)
    with pytest.raises(ValueError, match="Collective 'all-reduce': nbytes must"):
        Collective((0, 1), -1, 0.1)


def test_valid_inputs_still_predict():
    net = sim.Network.mlp((64, 256, 10))
    tl = sim.data_parallel(net, _cluster(), 64, devices=2)
    assert tl.step_s > 0 and math.isfinite(tl.step_s)
