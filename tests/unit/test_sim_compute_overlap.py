"""thinwire.sim: layer tables, the compute model, DDP buckets and the overlap timeline."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thinwire.bench.optim import resnet50_shapes
from thinwire.sim import compute
from thinwire.sim.collectives import AlgorithmConfig, Cluster
from thinwire.sim.compute import Layer, TimedLayer
from thinwire.sim.iteration import simulate
from thinwire.sim.network import Link, Network, network
from thinwire.sim.overlap import FIRST_BUCKET_BYTES, buckets, iteration_time, ready_times


def test_resnet50_table():
    table = compute.resnet50()
    params = sum(l.params for l in table)
    assert params == 25_557_032 == sum(math.prod(s) for _, s in resnet50_shapes())
    # torchvision's figure: 4.09 G multiply-adds per 224x224 image
    assert sum(l.flops for l in table) / 2 == pytest.approx(4.09e9, rel=0.005)


def test_bert_base_table():
    table = compute.bert_base(seq_len=128)
    assert sum(l.params for l in table) == 109_482_240  # bert-base-uncased with pooler
    h, L = 768, 128
    per_layer = 2 * L * (4 * h * h + 2 * h * 4 * h) + 4 * L * L * h
    assert sum(l.flops for l in table) == pytest.approx(12 * per_layer + 2 * h * h)


def test_layers_from_module_counts_linear_and_conv():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(4 * 5 * 5, 10))
    table = compute.layers_from_module(net, torch.zeros(2, 3, 5, 5))
    assert [l.params for l in table] == [4 * 3 * 9 + 4, 100 * 10 + 10]
    assert table[0].flops == 2 * (4 * 5 * 5) * 3 * 9  # per sample
    assert table[1].flops == 2 * 100 * 10
    assert table[0].name == "0" and table[1].name == "3"


def test_timed_uses_the_device_rate_and_twice_for_backward():
    layers = compute.timed([Layer("a", 10, 1e9)], 1e12, batch=4)
    assert layers[0].forward_s == pytest.approx(4e-3)
    assert layers[0].backward_s == pytest.approx(8e-3)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        compute.timed([Layer("a", 10, 1e9)], 1e12, batch=0)


def test_presets_errors():
    assert compute.device("V100").flops == 28e12
    with pytest.raises(ValueError, match=r"device must be one of v100, a100, h100, got 'p100'"):
        compute.device("p100")
    with pytest.raises(ValueError, match=r"model must be one of resnet50, bert-base.*got 'vgg'"):
        compute.model("vgg")


def test_read_layer_table(tmp_path):
    path = tmp_path / "layers.json"
    path.write_text(json.dumps({"layers": [{"name": "x", "params": 5, "forward_ms": 2,
                                            "backward_s": 0.004}]}))
    assert compute.read_layer_table(path) == [TimedLayer("x", 5, 0.002, 0.004)]
    path.write_text(json.dumps([{"params": 5}]))
    with pytest.raises(ValueError, match="layer 0 needs params, forward_s"):
        compute.read_layer_table(path)


def _layers(sizes, fwd=1.0, bwd=2.0):
    return [TimedLayer(f"l{i}", s, fwd, bwd) for i, s in enumerate(sizes)]


def test_buckets_follow_ddp():
    # 4-byte elements: 1 MiB first bucket holds 262,144 elements; a bucket closes once it
    # reaches its cap, with the layer that crossed it inside (DDP's rule)
    layers = _layers([100_000, 0, 200_000, 200_000, 150_000])
    groups = buckets(layers, bucket_bytes=1_999_999)
    assert groups == [[4, 3], [2, 0]]  # reverse order; the parameter-free layer in none
    assert sum(layers[i].params for i in groups[0][:-1]) * 4 < FIRST_BUCKET_BYTES
    huge = buckets(_layers([10_000_000]))
    assert huge == [[0]]  # one layer may exceed the cap


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 3_000_000), min_size=1, max_size=10),
       st.integers(100_000, 8_000_000))
def test_buckets_match_pytorchs_assignment(sizes, cap):
    """The reference: DDP's own bucket assignment (one tensor per layer, in backward order)."""
    import torch
    import torch.distributed as dist

    layers = _layers(sizes)
    tensors = [torch.empty(s) for s in reversed(sizes)]  # the order gradients become ready
    expected, _ = dist._compute_bucket_assignment_by_size(tensors, [FIRST_BUCKET_BYTES, cap])
    got = buckets(layers, bucket_bytes=cap)
    assert got == [[len(sizes) - 1 - j for j in group] for group in expected]


def test_timeline_by_hand():
    layers = _layers([10, 10, 10], fwd=1.0, bwd=2.0)  # forward 3, backward 6
    groups = [[2], [1, 0]]
    assert ready_times(layers, groups) == [2.0, 6.0]
    assert iteration_time(layers, groups, [3.0, 1.0]) == 3 + 7  # bucket 1 starts at 6, ends 7
    assert iteration_time(layers, groups, [5.0, 1.0]) == 3 + 8  # bucket 1 waits until 7
    assert iteration_time(layers, groups, [5.0, 1.0], overlap=False) == 3 + 6 + 6
    with pytest.raises(ValueError, match="one entry per bucket"):
        iteration_time(layers, groups, [1.0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5_000_000), st.floats(0, 1), st.floats(0, 1)),
                min_size=1, max_size=12),
       st.lists(st.floats(0, 2), min_size=12, max_size=12))
def test_overlap_lies_between_max_and_sum(spec, cost_pool):
    layers = [TimedLayer(f"l{i}", p, f, b) for i, (p, f, b) in enumerate(spec)]
    groups = buckets(layers, bucket_bytes=4_000_000)
    costs = cost_pool[:len(groups)]
    fwd = sum(l.forward_s for l in layers)
    bwd = sum(l.backward_s for l in layers)
    t = iteration_time(layers, groups, costs)
    assert fwd + max(bwd, sum(costs)) - 1e-9 <= t <= fwd + bwd + sum(costs) + 1e-9


def test_infinite_bandwidth_is_compute_bound():
    layers = compute.timed(compute.resnet50(), 28e12, 64)
    free = Network(Link(0.0, math.inf), Link(0.0, math.inf))
    for name in ("allreduce", "hier_allreduce"):
        row = simulate(layers, Cluster(64, 8), free, AlgorithmConfig(name),
                       compute.device("v100").sparse)
        assert row["iteration_s"] == pytest.approx(row["compute_s"])
        assert row["scaling_efficiency"] == pytest.approx(1.0)


def test_breakdown_adds_up_and_hitopk_beats_dense_on_a_thin_network():
    layers = compute.timed(compute.resnet50(), 28e12, 64)
    rates = compute.device("v100").sparse
    rows = {name: simulate(layers, Cluster(16, 8), network("cloud-25g"), AlgorithmConfig(name),
                           rates) for name in ("hier_allreduce", "hitopk")}
    for row in rows.values():
        parts = row["compute_s"] + row["exposed_comm_s"] + row["exposed_selection_s"]
        assert parts == pytest.approx(row["iteration_s"])
        assert row["exposed_comm_s"] >= 0 and row["exposed_selection_s"] >= 0
    assert rows["hitopk"]["iteration_s"] < rows["hier_allreduce"]["iteration_s"]
    assert rows["hitopk"]["exposed_selection_s"] > 0
