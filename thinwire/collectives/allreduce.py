"""Dense all-reduce over all ranks: the same result as DDP's default hook."""

from __future__ import annotations

import torch

from thinwire.collectives import costs, traffic
from thinwire.collectives.primitives import dense_allreduce
from thinwire.collectives.registry import Algorithm, register


def reduce(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    return dense_allreduce(state, flat)


def cost(cfg, cluster, net, elements: int, rates) -> costs.BucketCost:
    w = cluster.world_size
    return costs.world_ring(cluster, net, 2 * (w - 1), traffic.world_allreduce, elements,
                            cfg.wire_size)


ALGORITHM = register(Algorithm(
    "allreduce", reduce, cost, sparse=False,
    summary="dense ring all-reduce over all ranks (DDP's default, optionally fp16/bf16)"))
