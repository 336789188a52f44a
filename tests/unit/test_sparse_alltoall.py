"""topk_a2a and oktopk without a process group: their options, checkpointed state, byte
formulas and cost models (the distributed results are in tests/distributed)."""

from __future__ import annotations

import math

import pytest
import torch

from thinwire.collectives import traffic
from thinwire.compress import packed_bytes
from thinwire.sim.collectives import AlgorithmConfig, Cluster, SparseRates, bucket_cost
from thinwire.sim.network import Link, Network
from thinwire.state import SyncState

NET = Network(intra=Link(alpha=1e-6, bandwidth=100e9), inter=Link(alpha=50e-6, bandwidth=1e9))
RATES = SparseRates(select_rate=1e9, scatter_rate=2e9, select_alpha=1e-4)


def test_oktopk_options_default_to_the_papers_intervals_and_are_checked():
    assert SyncState(None, "oktopk").algorithm_options == {"tau": 32, "rebalance_every": 64}
    state = SyncState(None, "oktopk", algorithm_options={"tau": 4})
    assert state.settings["algorithm_options"] == {"tau": 4, "rebalance_every": 64}
    with pytest.raises(ValueError, match=r"option 'tau' must be an integer >= 1, got 0"):
        SyncState(None, "oktopk", algorithm_options={"tau": 0})
    with pytest.raises(ValueError, match=r"rebalance_every' must be an integer >= 1, got True"):
        SyncState(None, "oktopk", algorithm_options={"rebalance_every": True})
    with pytest.raises(ValueError, match=r"no option 'period'; its options: tau, rebalance_every"):
        SyncState(None, "oktopk", algorithm_options={"period": 3})
    with pytest.raises(ValueError, match="algorithm 'topk_a2a' takes no option 'tau'; its "
                                         "options: none"):
        SyncState(None, "topk_a2a", algorithm_options={"tau": 1})
    with pytest.raises(ValueError, match="options must be a dict of name -> value, got 3"):
        SyncState(None, "oktopk", algorithm_options=3)


def test_algorithm_state_travels_with_the_state_dict():
    saved = SyncState(None, "oktopk")
    saved.algorithm_state[1] = {"numel": 10, "step": 3, "local_threshold": 0.5,
                                "global_threshold": 0.25, "bounds": [0, 4, 10]}
    restored = SyncState(None, "oktopk")
    restored.load_state_dict(saved.state_dict())
    assert restored.algorithm_state == saved.algorithm_state


class _Rank:  # what traffic.py reads from a Topology
    def __init__(self, nodes, ranks_per_node, rank):
        self.nodes, self.ranks_per_node, self.rank = nodes, ranks_per_node, rank
        self.world_size = nodes * ranks_per_node


def test_alltoall_bytes_split_by_the_destinations_node():
    rank = _Rank(3, 2, 3)  # node 1: ranks 2 and 3
    fixed = traffic.world_alltoall(rank, 100)
    assert (fixed.intra, fixed.inter) == (100, 400)
    uneven = traffic.world_alltoallv(rank, [1, 2, 4, 8, 16, 32])
    assert (uneven.intra, uneven.inter) == (4, 1 + 2 + 16 + 32)  # nothing to itself (8)


def _cost(name, nodes, per_node, elements, **cfg):
    return bucket_cost(AlgorithmConfig(name, **cfg), Cluster(nodes, per_node), NET, elements,
                       RATES)


def test_topk_a2a_cost_is_its_all_to_all_plus_a_dense_all_gather():
    d, w, density = 8_000_000, 8, 0.01
    c = _cost("topk_a2a", w, 1, d, density=density)
    length = d // w
    block = packed_bytes(math.ceil(density * length), torch.float32, length)
    assert c.inter_bytes == pytest.approx((w - 1) * (block + length * 4))
    assert c.comm_s == pytest.approx(2 * (w - 1) * 50e-6 + (w - 1) * (block + length * 4) / 1e9)
    # the issue's (2k + d)(P-1)/P elements of 4 bytes, with the coded indices' 2 bytes an
    # entry (and a 4-byte count per 65536 positions) for the 4: (1.5k + d)(P-1)/P
    assert c.inter_bytes == pytest.approx((1.5 * density * d + d) * (w - 1) / w * 4, rel=1e-4)
    k = math.ceil(density * length)
    assert c.select_s == pytest.approx(w * 1e-4 + d / 1e9 + w * k / 2e9)


def test_oktopk_sends_about_two_k_pairs_per_rank_whatever_the_world_size():
    d, density = 8_000_000, 0.01
    k = density * d
    for w in (8, 32):
        c = _cost("oktopk", w, 1, d, density=density)
        share = packed_bytes(math.ceil(k / w), torch.float32, d)  # k/P coded pairs
        steady = 2 * (w - 1) * share  # k(P-1)/P pairs reduced, k(P-1)/P gathered
        # plus, every tau = 32 steps, up to k pairs per owner gathered instead of k/P
        estimate = (w - 1) * (packed_bytes(int(k), torch.float32, d) - share) / 32
        assert c.inter_bytes == pytest.approx(steady + estimate, rel=1e-3)
    flat = _cost("topk_allgather", 32, 1, d, density=density)
    assert flat.inter_bytes > 7 * _cost("oktopk", 32, 1, d, density=density).inter_bytes


@pytest.mark.parametrize("name", ["topk_a2a", "oktopk"])
def test_small_buckets_are_all_reduced(name):
    small = 1000  # 4 kB < 64 KiB
    assert _cost(name, 2, 2, small).inter_bytes == pytest.approx(
        _cost("allreduce", 2, 2, small).inter_bytes)
