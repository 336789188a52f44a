"""DiLoCo's cost model: DDP inside each node every inner step, the outer exchange every H steps.

An inner step is the simulator's ordinary iteration on one node (``Cluster(1, n)``: forward,
backward, and the node's own bucketed all-reduce overlapped with the backward pass; no
inter-node traffic). The outer exchange sends the pseudo-gradient of one fragment (1/F of the
parameters, as thinwire.local_sgd.fragments splits them) through the outer algorithm's own
cost model on the whole cluster, in flat buckets of ``bucket_bytes``; each of the F fragments
is exchanged once every H inner steps. Per inner step, on average:

    iteration  = inner + (F / H) * exposed
    exposed    = c_f                          without overlap (the step waits for it)
               = max(0, c_f - delay * inner)  with overlap (it runs behind ``delay`` steps)
    inter bytes = (F / H) * bytes of one fragment's exchange

where ``c_f`` is one fragment's exchange (communication + selection). The overlap model assumes
the exchange's inter-node traffic and the inner steps' intra-node all-reduce do not slow each
other (different links) and that the host has cores to spare for the exchange thread; on the
emulated cluster's shared CPUs neither is quite true, so the prediction is a lower bound there.
The cost the phases leave out (the outer step's work, the nodes' drift over H local steps) is
fitted from DiLoCo runs where the calibration holds some (:mod:`thinwire.sim.diloco_fit`) and
added by :func:`thinwire.sim.calibrate.predict_diloco`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from thinwire.collectives import costs, traffic
from thinwire.local_sgd import chunked
from thinwire.local_sgd.sparse_outer import DEFAULTS as SPARSELOCO_DEFAULTS
from thinwire.local_sgd.sparse_outer import NAME as SPARSELOCO
from thinwire.sim.collectives import (GRAD_ELEMENT_SIZE, AlgorithmConfig, BucketCost, Cluster,
                                      SparseRates, bucket_cost)
from thinwire.sim.compute import TimedLayer
from thinwire.sim.iteration import simulate
from thinwire.sim.network import Network
from thinwire.sync import DEFAULT_BUCKET_BYTES


def check_schedule(sync_every: int, fragments: int, overlap: bool, delay: int | None) -> int:
    """The delay in steps (1 by default with overlap, 0 without); clear errors otherwise."""
    from thinwire.local_sgd.fragments import check_schedule as check

    for name, value in (("sync_every", sync_every), ("fragments", fragments)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    delay = (1 if overlap else 0) if delay is None else delay
    if not overlap and delay != 0:
        raise ValueError(f"delay must be 0 without overlap, got {delay!r}")
    check(sync_every, fragments, overlap, delay)  # the trainer's own rules
    return delay


def fragment_sizes(parameters: int, fragments: int) -> list[int]:
    """Elements per fragment: as equal as whole elements allow (the trainer splits whole
    tensors, which is close to this for models of many tensors)."""
    if fragments > parameters:
        raise ValueError(f"fragments must be at most the parameter count ({parameters}), "
                         f"got {fragments}")
    base, extra = divmod(parameters, fragments)
    return [base + (1 if f < extra else 0) for f in range(fragments)]


@dataclass(frozen=True)
class SparseLoCoConfig:
    """The SparseLoCo outer exchange (``thinwire.local_sgd.sparse_outer``), which is not a
    per-step algorithm of the registry: chunked top-k at ``density``, ``bits`` per value
    (None: float32), ``chunk`` elements per chunk; the settings `thinwire train` declares as
    --density, --outer-bits (0 = float32) and --outer-chunk."""

    density: float = 0.01
    chunk: int = SPARSELOCO_DEFAULTS["chunk"]
    bits: int | None = SPARSELOCO_DEFAULTS["bits"]
    name: str = SPARSELOCO

    def __post_init__(self):
        chunked.check(self.density, self.chunk, self.bits)


def sparseloco_bucket_cost(outer: SparseLoCoConfig, cluster: Cluster, net: Network,
                           elements: int, rates: SparseRates) -> BucketCost:
    """What SparseOuterState.reduce does with one bucket: local rank j compresses shard j
    (1/n of the bucket) and all-gathers its payload with the ranks holding shard j on the
    other nodes; a dense all-gather inside the node reassembles the average."""
    n, m = cluster.ranks_per_node, cluster.nodes
    full = costs.padded_length(elements, n)
    shard = full // n
    payload = chunked.payload_bytes(shard, outer.density, outer.chunk, outer.bits)
    total = costs.inter_phase(cluster, net, m - 1, traffic.inter_allgather, payload)
    total += costs.intra_phase(cluster, net, traffic.intra_allgather, full, GRAD_ELEMENT_SIZE)
    k = -(-shard // outer.chunk) * chunked.k_per_chunk(outer.density, outer.chunk)
    total.select_s = costs.selection(rates, shard, (m - 1) * k)
    return total


def exchange_cost(outer, cluster: Cluster, net: Network, elements: int,
                  rates: SparseRates, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> BucketCost:
    """One flat pseudo-gradient of ``elements`` through ``outer`` (an AlgorithmConfig or a
    SparseLoCoConfig), bucket after bucket."""
    per_bucket = max(bucket_bytes // GRAD_ELEMENT_SIZE, 1)
    cost = sparseloco_bucket_cost if isinstance(outer, SparseLoCoConfig) else bucket_cost
    total = BucketCost()
    left = elements
    while left > 0:
        total += cost(outer, cluster, net, min(left, per_bucket), rates)
        left -= per_bucket
    return total


def simulate_diloco(layers: Sequence[TimedLayer], cluster: Cluster, net: Network,
                    outer: AlgorithmConfig | SparseLoCoConfig, rates: SparseRates, *, sync_every: int,
                    fragments: int = 1, overlap: bool = False, delay: int | None = None,
                    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                    batch_size: int | None = None) -> dict:
    """The predicted mean inner step of DiLoCo on ``cluster``: one JSON-ready row (the keys of
    :func:`thinwire.sim.iteration.simulate`'s rows, plus the schedule and the exchange)."""
    delay = check_schedule(sync_every, fragments, overlap, delay)
    node = simulate(layers, Cluster(1, cluster.ranks_per_node), net,
                    AlgorithmConfig("allreduce"), rates, bucket_bytes=bucket_bytes,
                    overlap=True)
    inner = node["iteration_s"]
    parameters = sum(l.params for l in layers)
    exchanges = [exchange_cost(outer, cluster, net, n, rates, bucket_bytes)
                 for n in fragment_sizes(parameters, fragments)]
    per_step = 1.0 / sync_every  # each fragment is exchanged once every sync_every steps
    hidden_by = delay * inner if overlap else 0.0
    exposed = sum(max(0.0, c.comm_s + c.select_s - hidden_by) for c in exchanges) * per_step
    exposed_selection = sum(c.select_s for c in exchanges) * per_step if not overlap else 0.0
    iteration = inner + exposed
    row = {
        "algorithm": f"diloco-{outer.name}-H{sync_every}", "outer_algorithm": outer.name,
        "density": outer.density if outer.name != "allreduce" else None,
        "sync_every": sync_every, "fragments": fragments, "overlap": overlap, "delay": delay,
        "nodes": cluster.nodes, "ranks_per_node": cluster.ranks_per_node,
        "world_size": cluster.world_size, "iteration_s": iteration,
        "inner_step_s": inner, "compute_s": node["compute_s"],
        "exposed_comm_s": iteration - node["compute_s"] - exposed_selection,
        "exposed_selection_s": exposed_selection,
        "exchange_s": [c.comm_s + c.select_s for c in exchanges],
        "comm_s": node["comm_s"] + sum(c.comm_s for c in exchanges) * per_step,
        "selection_s": sum(c.select_s for c in exchanges) * per_step,
        "inter_node_mb_per_iter": sum(c.inter_bytes for c in exchanges) * per_step / 1e6,
        "intra_node_mb_per_iter": node["intra_node_mb_per_iter"]
        + sum(c.intra_bytes for c in exchanges) * per_step / 1e6,
        "scaling_efficiency": node["compute_s"] / iteration if iteration > 0 else 1.0,
    }
    row["sync_s"] = row["comm_s"] + row["selection_s"]
    if batch_size is not None:
        row["samples_per_s"] = cluster.world_size * batch_size / iteration
    return row
