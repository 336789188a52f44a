"""HiTopKComm (PAPERS.md 1b): dense reduce-scatter inside the node, error feedback and top-k on
this rank's shard, sparse all-gather among the ranks sharing this local rank (the only step on
the slow links, all n NICs of a node busy in parallel), index_add, divide by W, dense all-gather
inside the node. Buckets under ``state.dense_below_bytes`` are all-reduced densely."""

from __future__ import annotations

import torch
import torch.distributed as dist

from thinwire.collectives import allreduce, traffic
from thinwire.collectives.primitives import reduce_scatter
from thinwire.collectives.hier_allreduce import padded
from thinwire.collectives.topk_allgather import sparse_exchange
from thinwire.compress import to_wire


def reduce(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    if flat.numel() * flat.element_size() < state.dense_below_bytes:
        return state.feedback.dense_momentum(bucket_index,
                                             allreduce.reduce(state, bucket_index, flat))
    topo = state.topology
    n = topo.ranks_per_node
    full = padded(to_wire(flat, state.wire_dtype), n)
    shard = torch.empty(full.numel() // n, dtype=full.dtype, device=full.device)
    with state.timer("intra"):
        reduce_scatter(shard, full, topo.intra, n)
    own = shard.to(flat.dtype)
    if state.feedback.momentum:  # after a dense warm-up: the whole-bucket velocity of the
        # average becomes this rank's shard of the node's sum (n times the average's)
        lo = topo.local_rank * own.numel()
        state.feedback.convert_velocity(
            bucket_index, own, lambda u: n * padded(u, n)[lo:lo + own.numel()])
    corrected = state.feedback.add_residual(bucket_index, own)
    dense, block_bytes = sparse_exchange(state, bucket_index, corrected, topo.inter, topo.nodes)
    dense.div_(topo.world_size)
    with state.timer("intra"):
        dist.all_gather_single(full, to_wire(dense, state.wire_dtype), group=topo.intra)
    size = full.element_size()
    state.record(traffic.intra_reduce_scatter(topo, full.numel(), size))
    state.record(traffic.inter_allgather(topo, block_bytes))
    state.record(traffic.intra_allgather(topo, full.numel(), size))
    return full[:flat.numel()].to(flat.dtype)
