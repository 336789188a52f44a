"""thinwire.sim: network presets and per-bucket costs against hand-computed values."""

import math

import pytest
import torch

from thinwire import collectives
from thinwire.compress import packed_bytes
from thinwire.sim.collectives import AlgorithmConfig, Cluster, SparseRates, bucket_cost, names
from thinwire.sim.network import GBIT, Link, Network, network

# Round numbers, inter slower than intra, so every term is easy to check by hand.
NET = Network(intra=Link(alpha=1e-6, bandwidth=100e9), inter=Link(alpha=50e-6, bandwidth=1e9))
RATES = SparseRates(select_rate=1e9, scatter_rate=2e9, select_alpha=1e-4)


def cost(name, nodes, per_node, elements, net=NET, rates=RATES, **cfg):
    return bucket_cost(AlgorithmConfig(name, **cfg), Cluster(nodes, per_node), net, elements,
                       rates)


def test_the_simulator_models_every_registered_algorithm():
    assert names() == collectives.names()
    assert {"allreduce", "hier_allreduce", "topk_allgather", "hitopk"} <= set(names())


def test_allreduce_is_the_world_ring():
    d, w = 1_000_000, 4  # 2 nodes x 2 ranks
    c = cost("allreduce", 2, 2, d)
    node_bytes = 2 * (w - 1) / w * d * 4  # only the last local rank's ring hop crosses the NIC
    assert c.inter_bytes == pytest.approx(node_bytes)
    assert c.comm_s == pytest.approx(2 * (w - 1) * 50e-6 + node_bytes / 1e9)
    assert c.select_s == 0


def test_allreduce_fp16_wire_halves_the_bytes():
    full, half = cost("allreduce", 2, 2, 1000), cost("allreduce", 2, 2, 1000, wire="fp16")
    assert half.inter_bytes == pytest.approx(full.inter_bytes / 2)


def test_hier_allreduce_phases():
    d, n, m = 800_000, 8, 4
    c = cost("hier_allreduce", m, n, d)
    intra = 2 * (n - 1) * 1e-6 + 2 * (n - 1) / n * d * 4 / 100e9
    inter = 2 * (m - 1) * 50e-6 + n * (2 * (m - 1) / m * (d / n) * 4) / 1e9  # n rings share a NIC
    assert c.comm_s == pytest.approx(intra + inter)
    assert c.inter_bytes == pytest.approx(2 * (m - 1) / m * d * 4)


def test_hitopk_matches_the_papers_formula():
    # PAPERS.md 1b: 2(n-1)a_intra + (RS + AG volume) b_intra + (m-1)a_inter
    #               + 2(m-1)(density d/n) b_inter, b_inter per rank = n/B (the NIC is shared).
    # At density 0.1 the m received selections (16 x 800 kB) outweigh the dense shard (4 MB),
    # so the node all-gathers the dense shard, as in the paper.
    d, n, m, density = 8_000_000, 8, 16, 0.1
    c = cost("hitopk", m, n, d, density=density)
    k = density * d / n  # 100,000
    # fp32 values and coded indices (at this density a bitmap of the 1M-entry shard)
    block = packed_bytes(int(k), torch.float32, d // n)
    expected = (2 * (n - 1) * 1e-6 + 2 * (n - 1) / n * d * 4 / 100e9
                + (m - 1) * 50e-6 + (m - 1) * block * n / 1e9)
    assert c.comm_s == pytest.approx(expected)
    assert c.inter_bytes == pytest.approx((m - 1) * n * block)
    # selection over this rank's shard, index_add of the m received selections
    assert c.select_s == pytest.approx(1e-4 + (d / n) / 1e9 + m * k / 2e9)


def test_hitopk_all_gathers_the_received_selections_inside_the_node_when_smaller():
    # density 0.01: m blocks of k entries (16 x 80 kB) are under the dense shard (4 MB); each
    # rank then adds up all n*m blocks of its node itself
    d, n, m, density = 8_000_000, 8, 16, 0.01
    c = cost("hitopk", m, n, d, density=density)
    k = density * d / n  # 10,000
    block = packed_bytes(int(k), torch.float32, d // n)  # fp32 values, coded indices
    expected = (2 * (n - 1) * 1e-6 + (n - 1) / n * d * 4 / 100e9 + (n - 1) * m * block / 100e9
                + (m - 1) * 50e-6 + (m - 1) * block * n / 1e9)
    assert c.comm_s == pytest.approx(expected)
    assert c.inter_bytes == pytest.approx((m - 1) * n * block)
    assert c.select_s == pytest.approx(1e-4 + (d / n) / 1e9 + n * m * k / 2e9)


def test_topk_allgather_sends_every_ranks_selection():
    d, w, density = 1_000_000, 16, 0.01
    c = cost("topk_allgather", 4, 4, d, density=density)
    k = 10_000
    block = packed_bytes(k, torch.float32, d)  # fp32 values, coded indices
    assert c.inter_bytes == pytest.approx((w - 1) * block)
    assert c.comm_s == pytest.approx((w - 1) * 50e-6 + (w - 1) * block / 1e9)
    assert c.select_s == pytest.approx(1e-4 + d / 1e9 + w * k / 2e9)


def test_hitopk_cuts_inter_node_volume_by_about_ranks_per_node():
    flat = cost("topk_allgather", 16, 8, 8_000_000)
    hier = cost("hitopk", 16, 8, 8_000_000)
    ratio = flat.inter_bytes / hier.inter_bytes
    # (W-1)/(m-1), up to the coded indices' per-chunk counts (4 bytes per 65536 positions)
    assert ratio == pytest.approx(8 * (128 - 1) / (16 - 1) / 8, rel=1e-3)


def test_hitopk_small_buckets_are_all_reduced():
    small = 1000  # 4 kB < 64 KiB
    assert cost("hitopk", 4, 2, small).comm_s == cost("allreduce", 4, 2, small).comm_s
    assert cost("hitopk", 4, 2, small).select_s == 0


@pytest.mark.parametrize("name", sorted(collectives.names()))
def test_one_node_has_no_inter_node_cost(name):
    slow_nic = Network(NET.intra, Link(alpha=1.0, bandwidth=1.0))
    c = cost(name, 1, 8, 2_000_000, net=slow_nic)
    assert c.inter_bytes == 0
    assert c.comm_s < 1e-3  # a single inter-node byte or message would cost >= 1 s
    assert c.comm_s == cost(name, 1, 8, 2_000_000).comm_s


@pytest.mark.parametrize("name", sorted(collectives.names()))
def test_one_rank_costs_nothing_to_communicate(name):
    assert cost(name, 1, 1, 1_000_000).comm_s == 0


@pytest.mark.parametrize("name", sorted(collectives.names()))
def test_free_network_costs_nothing(name):
    free = Network(Link(0.0, math.inf), Link(0.0, math.inf))
    c = cost(name, 16, 8, 5_000_000, net=free)
    assert c.comm_s == 0


def test_presets_and_their_errors():
    assert network("cloud-25g").inter.bandwidth == pytest.approx(0.9 * 25 * GBIT)
    assert network("100g") == network("cloud-100g")
    with pytest.raises(ValueError, match=r"network must be one of .*cloud-25g.*got 'eth'"):
        network("eth")
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        Link(1e-6, 0)
    with pytest.raises(ValueError, match="alpha must be"):
        Link(-1, 1e9)


@pytest.mark.parametrize("field,value,most", [("nodes", 0, 4096), ("ranks_per_node", -2, 64),
                                             ("nodes", 1.5, 4096), ("nodes", 10**9, 4096)])
def test_cluster_rejects_bad_sizes(field, value, most):
    kwargs = {"nodes": 2, "ranks_per_node": 2, field: value}
    with pytest.raises(ValueError, match=rf"{field} must be an integer in \[1, {most}\], got "
                                         rf"{value}"):
        Cluster(**kwargs)


def test_algorithm_config_errors():
    with pytest.raises(ValueError, match=r"algorithm must be one of allreduce.*got 'ring'"):
        AlgorithmConfig("ring")
    with pytest.raises(ValueError, match="density must be in"):
        AlgorithmConfig("hitopk", density=2.0)
    with pytest.raises(ValueError, match="wire must be one of"):
        AlgorithmConfig("allreduce", wire="int8")
    with pytest.raises(ValueError, match="elements must be an integer >= 1, got 0"):
        cost("allreduce", 2, 2, 0)


def test_the_max_form_takes_the_larger_of_fixed_cost_and_wire_time():
    from thinwire.collectives.costs import Cluster, world_ring
    from thinwire.collectives import traffic
    from thinwire.sim.network import Link, Network, combine

    assert combine(0.01, 5.0, "sum") == pytest.approx(5.01)
    assert combine(0.01, 5.0, "max") == 5.0 and combine(3.0, 0.5, "max") == 3.0
    slow = Link(alpha=1e-3, bandwidth=1e6, form="max")   # 1 MB/s, 1 ms a message
    assert slow.time(10, 5e6) == pytest.approx(5.0)       # the wire: 5 s > 10 ms
    assert slow.time(10, 1e3) == pytest.approx(0.01)      # the messages: 10 ms > 1 ms
    assert Link(1e-3, 1e6).time(10, 5e6) == pytest.approx(5.01)
    # a world all-reduce of 1e6 fp32 over 2 x 1: 2 ring steps, 4 MB through the node's NIC
    for form, expected in (("sum", 2 * 0.5 + 4.0), ("max", 4.0)):
        net = Network(Link(1e-4, 1e9, form), Link(0.5, 1e6, form))
        cost = world_ring(Cluster(2, 1), net, 2, traffic.world_allreduce, 1_000_000, 4)
        assert cost.comm_s == pytest.approx(expected, rel=0.01), form
    with pytest.raises(ValueError, match="form must be one of sum, max, got 'min'"):
        Link(1e-3, 1e6, form="min")
