"""Flat top-k SGD: every rank selects top-k of (gradient + residual) and all W ranks all-gather
values and indices; the sum (index_add) over W contributions, divided by W, is the update."""

from __future__ import annotations

import torch
import torch.distributed as dist

from thinwire.collectives import traffic
from thinwire.compress import pack, packed_bytes, unpack


def sparse_exchange(state, bucket_index: int, corrected: torch.Tensor, group, group_size: int):
    """Top-k of ``corrected`` (kept-back part stored as the residual), all-gathered in one
    packed collective; returns the dense sum of every member's selection."""
    numel = corrected.numel()
    with state.timer("select"):
        values, indices = state.compressor.select(corrected)
    payload = pack(values, indices, numel)
    state.feedback.keep(bucket_index, corrected, indices)
    gathered = torch.empty(group_size * payload.numel(), dtype=torch.uint8,
                           device=payload.device)
    with state.timer("inter"):
        dist.all_gather_single(gathered, payload, group=group)
    k = values.numel()
    parts = [unpack(chunk, k, values.dtype, numel) for chunk in gathered.chunk(group_size)]
    dense = torch.zeros(numel, dtype=values.dtype, device=values.device)
    # index_add, never scatter: the same index chosen by two ranks must add up.
    dense.index_add_(0, torch.cat([i for _, i in parts]), torch.cat([v for v, _ in parts]))
    return dense, packed_bytes(k, values.dtype, numel)


def reduce(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    topo = state.topology
    corrected = state.feedback.add_residual(bucket_index, flat.clone())
    dense, block_bytes = sparse_exchange(state, bucket_index, corrected, topo.world, topo.world_size)
    state.record(traffic.world_allgather(topo, block_bytes))
    return dense.div_(topo.world_size)
