"""Hierarchical all-reduce: reduce-scatter inside the node, all-reduce of the shard between
nodes, all-gather inside the node. Only 1/n of the bucket crosses the slow links per rank."""

from __future__ import annotations

import torch

from thinwire.collectives import costs, traffic
from thinwire.collectives.primitives import (all_gather_single, all_reduce_sum, padded,
                                              reduce_scatter)
from thinwire.collectives.registry import Algorithm, register
from thinwire.compress import to_wire


def reduce(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    topo = state.topology
    n = topo.ranks_per_node
    full = padded(to_wire(flat / topo.world_size, state.wire_dtype), n)
    shard = torch.empty(full.numel() // n, dtype=full.dtype, device=full.device)
    with state.timer("intra", members=n):
        reduce_scatter(shard, full, topo.intra, n)
    with state.timer("inter", members=topo.nodes):
        all_reduce_sum(shard, topo.inter)
    with state.timer("intra", members=n):
        all_gather_single(full, shard, group=topo.intra)
    size = full.element_size()
    state.record(traffic.intra_reduce_scatter(topo, full.numel(), size))
    state.record(traffic.inter_allreduce(topo, shard.numel(), size))
    state.record(traffic.intra_allgather(topo, full.numel(), size))
    return full[:flat.numel()].to(flat.dtype)


def cost(cfg, cluster, net, elements: int, rates) -> costs.BucketCost:
    n, m, size = cluster.ranks_per_node, cluster.nodes, cfg.wire_size
    full = costs.padded_length(elements, n)
    total = costs.intra_phase(cluster, net, traffic.intra_reduce_scatter, full, size)
    total += costs.inter_phase(cluster, net, 2 * (m - 1), traffic.inter_allreduce, full // n, size)
    total += costs.intra_phase(cluster, net, traffic.intra_allgather, full, size)
    return total


ALGORITHM = register(Algorithm(
    "hier_allreduce", reduce, cost, sparse=False,
    summary="reduce-scatter in the node, all-reduce of 1/n between nodes, all-gather in the node"))
