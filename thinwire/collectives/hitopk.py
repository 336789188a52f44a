"""HiTopKComm (PAPERS.md 1b): dense reduce-scatter inside the node, error feedback and top-k on
this rank's shard, sparse all-gather among the ranks sharing this local rank (the only step on
the slow links, all n NICs of a node busy in parallel), index_add, divide by W, and the result
back to every rank of the node. (Buckets under ``state.dense_below_bytes`` never get here:
``SyncState.reduce`` all-reduces them densely for every sparse algorithm.)

The last step, inside the node, is sparse whenever that is smaller: the node's ranks all-gather
the packed selections they received from the other nodes (m blocks of k entries each, the bytes
that crossed the slow links) and every rank adds them up itself, instead of all-gathering the
dense shards (which hold at most m*k nonzeros each). At 1% density on 2 nodes that moves 2% of
the dense bytes, with the same arithmetic (every rank sums the same blocks in the same order, so
all ranks hold identical values, and the values are not rounded to the wire dtype). The dense
all-gather stays where the selections would be larger (density near 1)."""

from __future__ import annotations

import warnings

import torch

from thinwire.collectives import costs, traffic
from thinwire.collectives.primitives import (all_gather_single, padded, reduce_scatter,
                                            select_and_allgather,
                                            sum_blocks)
from thinwire.collectives.registry import Algorithm, register
from thinwire.compress import packed_bytes, to_wire


def sparse_back(nodes: int, shard: int, k: int, value_dtype: torch.dtype,
                wire_size: int) -> bool:
    """Whether the node all-gathers the received selections rather than the dense shard."""
    return nodes * packed_bytes(k, value_dtype, shard) < shard * wire_size


def reduce(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    if state.topology.nodes == 1:
        warnings.warn("hitopk on a single node: its intra-node phases stay dense and nothing "
                      "crosses a slow link, so it saves no time over allreduce (it is for "
                      "several nodes)", RuntimeWarning, stacklevel=2)
    topo = state.topology
    n, m = topo.ranks_per_node, topo.nodes
    full = to_wire(flat, state.wire_dtype)
    if full.numel() % n:  # else no copy: full is only read (the caller's flat stays intact)
        full = padded(full, n)
    wire_size = full.element_size()
    s = full.numel() // n
    shard = torch.empty(s, dtype=full.dtype, device=full.device)
    with state.timer("intra", members=n):
        reduce_scatter(shard, full, topo.intra, n)
    own = shard.to(flat.dtype)
    if state.feedback.momentum:  # after a dense warm-up: the whole-bucket velocity of the
        # average becomes this rank's shard of the node's sum (n times the average's)
        lo = topo.local_rank * s
        state.feedback.convert_velocity(
            bucket_index, own, lambda u: n * padded(u, n)[lo:lo + s])
    corrected = state.feedback.add_residual(bucket_index, own)
    received, k, value_dtype, block_bytes = select_and_allgather(
        state, bucket_index, corrected, topo.inter, m)
    state.record(traffic.intra_reduce_scatter(topo, full.numel(), wire_size))
    state.record(traffic.inter_allgather(topo, block_bytes))
    if sparse_back(m, s, k, value_dtype, wire_size):
        node = torch.empty(n * received.numel(), dtype=torch.uint8, device=received.device)
        with state.timer("intra", members=n):
            all_gather_single(node, received, group=topo.intra)
        state.record(traffic.Traffic(intra=(n - 1) * received.numel()))
        out = torch.zeros(n * s, dtype=flat.dtype, device=flat.device)
        for j, blocks in enumerate(node.chunk(n)):  # member j's shard of the node's sum
            sum_blocks(blocks, m, k, value_dtype, s, flat.dtype, out[j * s:(j + 1) * s])
        out.div_(topo.world_size)
        return out[:flat.numel()].to(flat.dtype)
    dense = sum_blocks(received, m, k, value_dtype, s, flat.dtype).div_(topo.world_size)
    gathered = torch.empty_like(full)
    with state.timer("intra", members=n):
        all_gather_single(gathered, to_wire(dense, state.wire_dtype), group=topo.intra)
    state.record(traffic.intra_allgather(topo, full.numel(), wire_size))
    return gathered[:flat.numel()].to(flat.dtype)


def cost(cfg, cluster, net, elements: int, rates) -> costs.BucketCost:
    n, m, size = cluster.ranks_per_node, cluster.nodes, cfg.wire_size
    full = costs.padded_length(elements, n)
    value_dtype = costs.sparse_value_dtype(cfg)
    k, block = costs.sparse_block(full // n, cfg.density, value_dtype)
    total = costs.intra_phase(cluster, net, traffic.intra_reduce_scatter, full, size)
    total += costs.inter_phase(cluster, net, m - 1, traffic.inter_allgather, block)
    if sparse_back(m, full // n, k, value_dtype, size):
        total += costs.intra_phase(cluster, net, lambda topo: traffic.Traffic(
            intra=(topo.ranks_per_node - 1) * m * block))
        total.select_s = costs.selection(rates, full // n, n * m * k)
    else:
        total += costs.intra_phase(cluster, net, traffic.intra_allgather, full, size)
        total.select_s = costs.selection(rates, full // n, m * k)
    return total


ALGORITHM = register(Algorithm(
    "hitopk", reduce, cost, sparse=True, sparse_wire=True, residual_space="node_shard",
    summary="HiTopKComm: intra-node reduce-scatter, top-k of the shard all-gathered between "
            "nodes, the received selections all-gathered inside the node"))
