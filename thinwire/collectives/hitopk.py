"""HiTopKComm (PAPERS.md 1b): dense reduce-scatter inside the node, error feedback and top-k on
this rank's shard, sparse all-gather among the ranks sharing this local rank (the only step on
the slow links, all n NICs of a node busy in parallel), index_add, divide by W, dense all-gather
inside the node. Buckets under ``state.dense_below_bytes`` are all-reduced densely."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from thinwire.collectives import costs, traffic
from thinwire.collectives.primitives import (dense_allreduce, padded, reduce_scatter,
                                             sparse_allgather)
from thinwire.collectives.registry import Algorithm, register
from thinwire.compress import to_wire


def reduce(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    if state.topology.nodes == 1:
        warnings.warn("hitopk on a single node: its intra-node phases stay dense and nothing "
                      "crosses a slow link, so it saves no time over allreduce (it is for "
                      "several nodes)", RuntimeWarning, stacklevel=2)
    if flat.numel() * flat.element_size() < state.dense_below_bytes:
        return state.feedback.dense_momentum(bucket_index, dense_allreduce(state, flat))
    topo = state.topology
    n = topo.ranks_per_node
    full = padded(to_wire(flat, state.wire_dtype), n)
    shard = torch.empty(full.numel() // n, dtype=full.dtype, device=full.device)
    with state.timer("intra", members=n):
        reduce_scatter(shard, full, topo.intra, n)
    own = shard.to(flat.dtype)
    if state.feedback.momentum:  # after a dense warm-up: the whole-bucket velocity of the
        # average becomes this rank's shard of the node's sum (n times the average's)
        lo = topo.local_rank * own.numel()
        state.feedback.convert_velocity(
            bucket_index, own, lambda u: n * padded(u, n)[lo:lo + own.numel()])
    corrected = state.feedback.add_residual(bucket_index, own)
    dense, block_bytes = sparse_allgather(state, bucket_index, corrected, topo.inter, topo.nodes)
    dense.div_(topo.world_size)
    with state.timer("intra", members=n):
        dist.all_gather_single(full, to_wire(dense, state.wire_dtype), group=topo.intra)
    size = full.element_size()
    state.record(traffic.intra_reduce_scatter(topo, full.numel(), size))
    state.record(traffic.inter_allgather(topo, block_bytes))
    state.record(traffic.intra_allgather(topo, full.numel(), size))
    return full[:flat.numel()].to(flat.dtype)


def cost(cfg, cluster, net, elements: int, rates) -> costs.BucketCost:
    if elements * costs.GRAD_ELEMENT_SIZE < cfg.dense_below_bytes:
        w = cluster.world_size
        return costs.world_ring(cluster, net, 2 * (w - 1), traffic.world_allreduce, elements,
                                cfg.wire_size)
    n, m, size = cluster.ranks_per_node, cluster.nodes, cfg.wire_size
    full = costs.padded_length(elements, n)
    k, block = costs.sparse_block(full // n, cfg.density)
    total = costs.intra_phase(cluster, net, traffic.intra_reduce_scatter, full, size)
    total += costs.inter_phase(cluster, net, m - 1, traffic.inter_allgather, block)
    total += costs.intra_phase(cluster, net, traffic.intra_allgather, full, size)
    total.select_s = costs.selection(rates, full // n, m * k)
    return total


ALGORITHM = register(Algorithm(
    "hitopk", reduce, cost, sparse=True,
    summary="HiTopKComm: intra-node reduce-scatter, top-k of the shard all-gathered between "
            "nodes, intra-node all-gather"))
