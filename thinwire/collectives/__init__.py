"""How gradients travel: one file per algorithm, each ``reduce(state, bucket_index, flat)``.

Every algorithm returns the average of ``flat`` over all ranks (exactly for the dense ones, up to
what top-k keeps back for the sparse ones) and records its traffic and timings on ``state``.
"""

from __future__ import annotations

from thinwire.collectives import allreduce, hier_allreduce, hitopk, topk_allgather

ALGORITHMS = {
    "allreduce": allreduce.reduce,
    "hier_allreduce": hier_allreduce.reduce,
    "topk_allgather": topk_allgather.reduce,
    "hitopk": hitopk.reduce,
}
SPARSE_ALGORITHMS = ("topk_allgather", "hitopk")
