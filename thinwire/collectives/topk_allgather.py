"""Flat top-k SGD: every rank selects top-k of (gradient + residual) and all W ranks all-gather
values and indices; the sum (index_add) over W contributions, divided by W, is the update."""

from __future__ import annotations

import torch

from thinwire.collectives import costs, traffic
from thinwire.collectives.primitives import corrected_copy, sparse_allgather
from thinwire.collectives.registry import Algorithm, register


def reduce(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    topo = state.topology
    corrected = corrected_copy(state, bucket_index, flat)
    phase = "inter" if topo.nodes > 1 else "intra"
    dense, block_bytes = sparse_allgather(state, bucket_index, corrected, topo.world,
                                          topo.world_size, phase)
    state.record(traffic.world_allgather(topo, block_bytes))
    return dense.div_(topo.world_size)


def cost(cfg, cluster, net, elements: int, rates) -> costs.BucketCost:
    return costs.world_sparse_allgather(cfg, cluster, net, elements, rates)


ALGORITHM = register(Algorithm(
    "topk_allgather", reduce, cost, sparse=True, sparse_wire=True,
    summary="top-k with error feedback on every rank, values+indices all-gathered by all ranks"))
