"""Alpha-beta cost of one gradient bucket under each of thinwire's algorithms.

Each algorithm's model lives beside its implementation (``cost`` in its file under
:mod:`thinwire.collectives`, built from :mod:`thinwire.collectives.costs`); this module is the
simulator's entry point to them, so every registered algorithm is simulated without edits here.
"""

from __future__ import annotations

from thinwire import collectives
from thinwire.collectives import costs, traffic
from thinwire.collectives.costs import (GRAD_ELEMENT_SIZE, AlgorithmConfig, BucketCost, Cluster,
                                        SparseRates)

__all__ = ["GRAD_ELEMENT_SIZE", "AlgorithmConfig", "BucketCost", "Cluster", "SparseRates",
           "bucket_cost", "names"]


def names() -> tuple[str, ...]:
    """The algorithms the simulator models: every registered one."""
    return collectives.names()


def bucket_cost(cfg: AlgorithmConfig, cluster: Cluster, net, elements: int,
                rates: SparseRates) -> BucketCost:
    """Communication and selection cost of one bucket of ``elements`` fp32 gradients."""
    if isinstance(elements, bool) or not isinstance(elements, int) or elements < 1:
        raise ValueError(f"elements must be an integer >= 1, got {elements!r}")
    algorithm = collectives.get(cfg.name)
    if algorithm.sparse and elements * costs.GRAD_ELEMENT_SIZE < cfg.dense_below_bytes:
        # SyncState.reduce all-reduces a small bucket densely, whatever the sparse algorithm
        w = cluster.world_size
        return costs.world_ring(cluster, net, 2 * (w - 1), traffic.world_allreduce, elements,
                                cfg.wire_size)
    return algorithm.cost(cfg, cluster, net, elements, rates)
