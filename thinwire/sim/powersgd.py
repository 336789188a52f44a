"""PowerSGD in the simulator: PyTorch's ``powerSGD_hook`` as ``thinwire compare`` runs it.

PowerSGD is not one of thinwire's registered algorithms (it is PyTorch's hook, the peer
thinwire races against; :mod:`thinwire.train.grad_sync`), and its cost depends on the shapes
of the gradients, not only on their number, so it is modelled here rather than through the
registry's ``cost(cfg, cluster, net, elements, rates)``.

What one compressed step does, per DDP bucket (PyTorch 2.13, ``powerSGD_hook``):

* every gradient is viewed as an ``n x m`` matrix (``shape[0] x rest``); with ``r = min(n, m,
  rank)`` it is compressed when ``(n + m) r * min_compression_rate < n m`` (rate 2), else it
  travels uncompressed (biases, norms, small layers);
* three all-reduces over the whole world, one after the other: the uncompressed tensors
  (concatenated, fp32), then ``P = M Q`` (``sum n r`` fp32), then ``Q = M^T P`` (``sum m r``);
* its own computation: error feedback (add the residual, copy the input, the new residual),
  three batched matmuls that each stream the ``n x m`` matrix (``M Q``, ``M^T P``, ``P Q^T``)
  and the orthogonalisation of P and Q (small: ``(n + m) r`` elements). On a CPU these are
  memory-bound passes over the bucket, costed at ``PASSES`` passes of ``pass_rate`` elements/s
  (a calibration fits the rate; :func:`thinwire.sim.calibrate.fit`).

On gloo thinwire waits for each bucket's hook before DDP goes on (``grad_sync``: otherwise the
ranks' collectives interleave out of order), so nothing overlaps: the iteration is compute plus
the sum of the buckets' communication and computation. Buckets follow DDP's assignment
(:func:`thinwire.sim.overlap.buckets`' rule, here per tensor): reverse parameter order, first
bucket 1 MiB, then ``bucket_bytes``, each closed once it reaches its cap.
"""

from __future__ import annotations

import functools

import math
from dataclasses import dataclass
from typing import Sequence

from thinwire.collectives import traffic
from thinwire.collectives.costs import GRAD_ELEMENT_SIZE, BucketCost, Cluster, world_ring
from thinwire.sim.compute import TimedLayer
from thinwire.sim.overlap import FIRST_BUCKET_BYTES
from thinwire.sync import DEFAULT_BUCKET_BYTES

MIN_COMPRESSION_RATE = 2.0  # PowerSGDState's default
# Passes over a bucket's elements per compressed step: add the residual, clone the input, the
# three matmuls (each streams the matrix; the last writes it), the new residual (input - output).
PASSES = 6


@dataclass(frozen=True)
class PowerSGDBucket:
    elements: int          # gradient elements in the bucket
    uncompressed: int      # elements all-reduced as they are
    p_elements: int        # sum of n * r over the compressed matrices
    q_elements: int        # sum of m * r

    @property
    def sent_elements(self) -> int:
        """What PyTorch counts as ``total_numel_after_compression`` for this bucket."""
        return self.uncompressed + self.p_elements + self.q_elements


def check_rank(rank) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"powersgd_rank must be an integer >= 1, got {rank!r}")
    return rank


def _matrix(shape: Sequence[int]) -> tuple[int, int]:
    if not shape:
        return 1, 1
    n = int(shape[0])
    return n, math.prod(int(s) for s in shape[1:]) if len(shape) > 1 else 1


def plan(shapes: Sequence[Sequence[int]], rank: int,
         bucket_bytes: int = DEFAULT_BUCKET_BYTES,
         first_bucket_bytes: int = FIRST_BUCKET_BYTES) -> list[PowerSGDBucket]:
    """PowerSGD's buckets for parameters of ``shapes`` (model order), in DDP's launch order."""
    check_rank(rank)
    if not shapes:
        raise ValueError("shapes must list at least one parameter shape")
    groups, current, size = [], [], 0
    for shape in reversed(list(shapes)):  # gradients become ready in reverse order
        current.append(shape)
        size += math.prod(shape) * GRAD_ELEMENT_SIZE
        if size >= (first_bucket_bytes if not groups else bucket_bytes):
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    out = []
    for group in groups:
        uncompressed = p = q = 0
        for shape in group:
            n, m = _matrix(shape)
            r = min(n, m, rank)
            if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
                p, q = p + n * r, q + m * r
            else:
                uncompressed += n * m
        out.append(PowerSGDBucket(sum(math.prod(s) for s in group), uncompressed, p, q))
    return out


def bucket_cost(bucket: PowerSGDBucket, cluster: Cluster, net, pass_rate: float) -> BucketCost:
    """The three all-reduces (communication) and the hook's own computation ("selection")."""
    if not pass_rate > 0:
        raise ValueError(f"pass_rate must be > 0 elements/s, got {pass_rate!r}")
    w = cluster.world_size
    total = BucketCost()
    for elements in (bucket.uncompressed, bucket.p_elements, bucket.q_elements):
        if elements:
            total += world_ring(cluster, net, 2 * (w - 1), traffic.world_allreduce, elements,
                                GRAD_ELEMENT_SIZE)
    compressed = bucket.elements - bucket.uncompressed
    total.select_s = (PASSES * compressed + 2 * (bucket.p_elements + bucket.q_elements)) \
        / pass_rate
    return total


def simulate(layers: Sequence[TimedLayer], shapes: Sequence[Sequence[int]], cluster: Cluster,
             net, rank: int, pass_rate: float,
             bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> dict:
    """One predicted iteration (the keys of :func:`thinwire.sim.iteration.simulate`)."""
    buckets = plan(shapes, rank, bucket_bytes)
    costs = [bucket_cost(b, cluster, net, pass_rate) for b in buckets]
    compute = sum(l.forward_s + l.backward_s for l in layers)
    comm = sum(c.comm_s for c in costs)
    own = sum(c.select_s for c in costs)
    total = compute + comm + own  # the hook blocks the backward pass bucket by bucket
    return {
        "algorithm": "powersgd", "rank": rank,
        "nodes": cluster.nodes, "ranks_per_node": cluster.ranks_per_node,
        "world_size": cluster.world_size, "buckets": len(buckets),
        "iteration_s": total, "compute_s": compute,
        "exposed_comm_s": comm, "exposed_selection_s": own,
        "comm_s": comm, "selection_s": own, "sync_s": comm + own,
        "inter_node_mb_per_iter": sum(c.inter_bytes for c in costs) / 1e6,
        "intra_node_mb_per_iter": sum(c.intra_bytes for c in costs) / 1e6,
        "scaling_efficiency": compute / total if total > 0 else 1.0,
    }


@functools.lru_cache(maxsize=16)
def parameter_shapes(model_name: str) -> list[tuple[int, ...]] | None:
    """Shapes of a ``thinwire.train`` model's trainable parameters (model order); None where
    ``model_name`` is not one of its models."""
    try:
        from thinwire.train import models as train_models
    except ImportError:
        return None
    if model_name not in getattr(train_models, "MODELS", {}):
        return None
    module = train_models.build(model_name, 0)  # built once per model: a plan asks ~60 times
    return tuple(tuple(p.shape) for p in module.parameters() if p.requires_grad)
