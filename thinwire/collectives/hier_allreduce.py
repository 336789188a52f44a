"""Hierarchical all-reduce: reduce-scatter inside the node, all-reduce of the shard between
nodes, all-gather inside the node. Only 1/n of the bucket crosses the slow links per rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from thinwire.collectives import traffic
from thinwire.collectives.primitives import reduce_scatter
from thinwire.compress import to_wire


def padded(flat: torch.Tensor, parts: int) -> torch.Tensor:
    """A copy of ``flat`` zero-padded to a multiple of ``parts`` (shards must be equal)."""
    pad = (-flat.numel()) % parts
    out = torch.zeros(flat.numel() + pad, dtype=flat.dtype, device=flat.device)
    out[:flat.numel()] = flat
    return out


def reduce(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    topo = state.topology
    n = topo.ranks_per_node
    full = padded(to_wire(flat / topo.world_size, state.wire_dtype), n)
    shard = torch.empty(full.numel() // n, dtype=full.dtype, device=full.device)
    with state.timer("intra"):
        reduce_scatter(shard, full, topo.intra, n)
    with state.timer("inter"):
        dist.all_reduce(shard, group=topo.inter)
    with state.timer("intra"):
        dist.all_gather_single(full, shard, group=topo.intra)
    size = full.element_size()
    state.record(traffic.intra_reduce_scatter(topo, full.numel(), size))
    state.record(traffic.inter_allreduce(topo, shard.numel(), size))
    state.record(traffic.intra_allgather(topo, full.numel(), size))
    return full[:flat.numel()].to(flat.dtype)
