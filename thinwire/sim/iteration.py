"""One training iteration, predicted: compute, exposed communication, exposed selection.

    layers = timed(model("resnet50"), device("v100").flops, batch=64)
    row = simulate(layers, Cluster(16, 8), network("cloud-25g"), AlgorithmConfig("hitopk"),
                   device("v100").sparse)

The exposed parts come from running the overlap timeline twice, with and without the selection
costs: ``exposed_comm_s = T(no selection) - compute``, ``exposed_selection_s = T - T(no
selection)``, so compute + exposed communication + exposed selection = iteration time.
Scaling efficiency is ``compute / iteration``: the throughput of W ranks relative to W times a
single rank that never communicates (weak scaling, fixed per-rank batch).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from thinwire.sim.collectives import AlgorithmConfig, Cluster, SparseRates, bucket_cost
from thinwire.sim.compute import TimedLayer
from thinwire.sim.network import Network
from thinwire.sim.overlap import buckets, iteration_time
from thinwire.sync import DEFAULT_BUCKET_BYTES

SCALING_NODES = (1, 2, 4, 8, 16, 32, 64)


def simulate(layers: Sequence[TimedLayer], cluster: Cluster, net: Network,
             algorithm: AlgorithmConfig, rates: SparseRates,
             bucket_bytes: int = DEFAULT_BUCKET_BYTES, overlap: bool = True,
             batch_size: int | None = None) -> dict:
    """The predicted iteration of ``algorithm`` on ``cluster``: one JSON-ready row."""
    if not layers or not any(l.params for l in layers):
        raise ValueError("layers must contain at least one layer with parameters")
    groups = buckets(layers, bucket_bytes)
    costs = [bucket_cost(algorithm, cluster, net, sum(layers[i].params for i in g), rates)
             for g in groups]
    comm = [c.comm_s for c in costs]
    total = iteration_time(layers, groups, [c.comm_s + c.select_s for c in costs], overlap)
    without_selection = iteration_time(layers, groups, comm, overlap)
    compute = sum(l.forward_s + l.backward_s for l in layers)
    row = {
        "algorithm": algorithm.name, "density": algorithm.density,
        "nodes": cluster.nodes, "ranks_per_node": cluster.ranks_per_node,
        "world_size": cluster.world_size, "buckets": len(groups),
        "iteration_s": total, "compute_s": compute,
        "exposed_comm_s": without_selection - compute,
        "exposed_selection_s": total - without_selection,
        "comm_s": sum(comm), "selection_s": sum(c.select_s for c in costs),
        "sync_s": sum(comm) + sum(c.select_s for c in costs),
        "inter_node_mb_per_iter": sum(c.inter_bytes for c in costs) / 1e6,
        "intra_node_mb_per_iter": sum(c.intra_bytes for c in costs) / 1e6,
        "scaling_efficiency": compute / total if total > 0 else 1.0,
    }
    if batch_size is not None:
        row["samples_per_s"] = cluster.world_size * batch_size / total
    return row


def scaling(layers: Sequence[TimedLayer], ranks_per_node: int, net: Network,
            algorithms: Iterable[AlgorithmConfig], rates: SparseRates,
            nodes: Iterable[int] = SCALING_NODES, **options) -> list[dict]:
    """One :func:`simulate` row per (algorithm, node count)."""
    return [simulate(layers, Cluster(m, ranks_per_node), net, cfg, rates, **options)
            for cfg in algorithms for m in nodes]
