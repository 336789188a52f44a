"""TopKA2A (ICPP 2024), the flat variant: every rank owns one shard of the bucket.

With P ranks and a bucket of length d, shard s is ``[s L, (s+1) L)`` with ``L = ceil(d / P)``
(the last one zero-padded). Rank r forms ``c = g_r + e_r`` over its whole bucket (error
feedback), selects the top ``k_s = ceil(density L)`` of ``|c|`` inside every shard with the
configured selector, and sends shard s's (values, indices) to rank s in ONE all-to-all; k_s is
the same for every shard, so every block has the same size and no size exchange is needed. The
residual is ``c`` minus what was sent. Rank s index_adds what it received into its dense shard
and divides by P; a dense all-gather of the shards (in ``state.wire_dtype``) gives every rank the
average. Per rank that is ``2 k (P-1)/P`` sparse entries and ``d (P-1)/P`` dense ones.

The name means this flat variant (one all-to-all among all ranks); no hierarchical variant is
implemented. (Buckets under ``state.dense_below_bytes`` are all-reduced densely by
``SyncState.reduce``, for every sparse algorithm.)
"""

from __future__ import annotations

import torch

from thinwire.collectives import costs, traffic
from thinwire.collectives.primitives import (all_gather_single, corrected_copy,
                                            select_shards_for_wire,
                                            sparse_alltoall, sum_sparse)
from thinwire.collectives.registry import Algorithm, register
from thinwire.compress import packed_bytes, to_wire


def reduce(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    topo = state.topology
    p, d = topo.world_size, flat.numel()
    corrected = corrected_copy(state, bucket_index, flat)
    parts, length = select_shards_for_wire(state, bucket_index, corrected, p)
    phase = "inter" if topo.nodes > 1 else "intra"
    received, _ = sparse_alltoall(state, parts, length, topo.world, phase, equal_sizes=True)
    own = sum_sparse(received, length, flat.dtype, flat.device).div_(p)
    own = to_wire(own, state.wire_dtype)
    full = torch.empty(p * length, dtype=own.dtype, device=own.device)
    with state.timer(phase):
        all_gather_single(full, own, group=topo.world)
    k = parts[0][0].numel()
    state.record(traffic.world_alltoall(topo, packed_bytes(k, parts[0][0].dtype, length)))
    state.record(traffic.world_allgather(topo, length * own.element_size()))
    return full[:d].to(flat.dtype)


def cost(cfg, cluster, net, elements: int, rates) -> costs.BucketCost:
    w = cluster.world_size
    length = costs.padded_length(elements, w) // w
    k, block = costs.sparse_block(length, cfg.density, costs.sparse_value_dtype(cfg))
    # all-to-all: W-1 pairwise exchanges; all-gather: a ring of W-1 steps
    total = costs.world_ring(cluster, net, w - 1, traffic.world_alltoall, block)
    total += costs.world_ring(cluster, net, w - 1, traffic.world_allgather,
                              length * cfg.wire_size)
    # one selection call per shard
    total.select_s = costs.selection(rates, w * length, w * k) + (w - 1) * rates.select_alpha
    return total


ALGORITHM = register(Algorithm(
    "topk_a2a", reduce, cost, sparse=True, sparse_wire=True,
    summary="TopKA2A (flat): top-k per shard, one all-to-all to each shard's owner, which "
            "sums its shard; dense all-gather of the shards"))
