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


# ------------------------------------------------------------------ closed forms and options
# Before: all_gather_s and bubble returned NaN, the asynchronous parameter server ran a NaN
# slow factor, bounds=[1.5] was cut to [1] unasked, predict took chunks=nan without a
# pipeline; bounds=[nan] failed as "cannot convert float NaN to integer", calibrated and
# measured_link with a bare KeyError or LAPACK's "SVD did not converge".
@pytest.mark.parametrize("call,match", [
    (lambda: sim.all_gather_s(NAN, 4, LINK), r"all_gather_s: nbytes must"),
    (lambda: sim.all_gather_s(1e6, NAN, LINK), r"all_gather_s: n \(ranks\) must be a whole"),
    (lambda: sim.all_gather_s(1e6, 0, LINK), r"all_gather_s: n \(ranks\) must be a whole number"),
    (lambda: sim.bubble(NAN, 4), r"bubble: stages must be a whole number >= 1, got nan"),
    (lambda: sim.bubble(4, NAN), r"bubble: micro_batches must be a whole number >= 1, got nan"),
    (lambda: sim.bubble(1.5, 4), r"bubble: stages must be a whole number"),
])
def test_closed_forms_refuse_nan_by_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("factor", [NAN, math.inf, 0.5, "2"])
def test_a_slow_factor_is_checked_alike_in_both_parameter_server_modes(mode, factor):
    net = sim.Network.mlp((64, 256, 10))
    with pytest.raises(ValueError,
                       match=r"parameter_server: slow\[1\] must be a finite number >= 1"):
        sim.parameter_server(net, _cluster(), 64, workers=2, mode=mode, slow={1: factor})


@pytest.mark.parametrize("bad", [[1.5], [NAN], [math.inf], ["2"]])
def test_split_points_must_be_whole_layer_indices(bad):
    net, c = sim.Network.mlp((64, 256, 256, 10)), _cluster()
    match = r"bounds: split points are layer indices, whole numbers, got"
    for call in (lambda: sim.manual_split(net, c, 64, bounds=bad),
                 lambda: sim.pipeline(net, c, 64, bounds=bad),
                 lambda: sim.predict(sim.Workload.of(net), c, sim.Plan(pp=2), 64, bounds=bad)):
        with pytest.raises(ValueError, match=match):
            call()
    assert sim.manual_split(net, c, 64, bounds=[2.0]).step_s > 0   # a whole float still cuts


@pytest.mark.parametrize("pp", [1, 2])
def test_predict_checks_chunks_with_or_without_a_pipeline(pp):
    w = sim.Workload.mlp((64, 256, 10))
    with pytest.raises(ValueError, match=r"predict: chunks must be a whole number >= 1, got nan"):
        sim.predict(w, _cluster(), sim.Plan(pp=pp), 64, chunks=NAN)


MEASURED = {"compute": {32: 0.01, 64: 0.02}, "send": {1e3: 1e-4, 1e5: 1e-3},
            "all_reduce": {2: {1e3: 3e-4, 1e5: 3e-3}}}


@pytest.mark.parametrize("change,match", [
    (lambda m: m.pop("send"), r"calibrated: measured needs 'compute' .*'send'"),
    (lambda m: m["all_reduce"].pop(2), r"calibrated: measured\['all_reduce'\] needs .* key 2"),
    (lambda m: m["send"].update({1e3: NAN}), r"calibrated: measured\['send'\]\[1000.0\] must"),
    (lambda m: m["compute"].update({64: -1.0}), r"calibrated: measured\['compute'\]\[64\] must"),
    (lambda m: m["all_reduce"][2].update({1e3: NAN}),
     r"calibrated: measured\['all_reduce'\]\[2\]\[1000.0\] must"),
    (lambda m: m.update(send={1e3: 1e-4}),
     r"calibrated: measured\['send'\] must be a dict .* at least 2"),
])
def test_a_calibration_names_the_measurement_that_is_missing_or_not_a_number(change, match):
    import copy
    measured = copy.deepcopy(MEASURED)
    change(measured)
    with pytest.raises(ValueError, match=match):
        sim.calibrated(measured, (64, 256, 10))


@pytest.mark.parametrize("sends,pairs,match", [
    ({1e3: NAN, 1e5: 1e-3}, {1e3: 3e-4}, r"measured_link: sends\[1000.0\] must"),
    ({NAN: 1e-4, 1e5: 1e-3}, {1e3: 3e-4}, r"measured_link: each key of sends must"),
    ({1e3: 1e-4, 1e5: 1e-3}, {1e3: NAN}, r"measured_link: pair_all_reduces\[1000.0\] must"),
    ({1e3: 1e-4, 1e5: 1e-3}, {}, r"measured_link: pair_all_reduces must be a dict"),
    (NAN, {1e3: 3e-4}, r"measured_link: sends must be a dict"),
])
def test_measured_link_names_the_time_that_is_not_a_number(sends, pairs, match):
    with pytest.raises(ValueError, match=match):
        sim.measured_link(sends, pairs)


def test_a_gpu_presets_flops_cannot_be_changed_apart_from_its_matrix_unit():
    """The matrix unit prices every matrix product, so flops alone changed no prediction."""
    from dataclasses import replace
    h100 = sim.h100_nvlink()
    with pytest.raises(ValueError, match=r"flops=1e\+15 but its matrix unit's rate is 7\.945e\+14"
                                         r".*matrix=replace\(cluster\.matrix, rate=R\)"):
        replace(h100, flops=1e15)
    net = sim.Network.mlp((1024, 4096, 1024))
    faster = replace(h100, flops=2 * h100.flops, matrix=replace(h100.matrix, rate=2 * h100.flops))
    assert sim.single_device(net, faster, 4096).step_s < sim.single_device(net, h100, 4096).step_s
    assert replace(h100, flops=1e9, matrix=None).flops == 1e9
