"""Building blocks of the algorithms' alpha-beta cost models (each algorithm file has a ``cost``).

Volumes come from :mod:`thinwire.collectives.traffic` - the same functions the algorithms call
to report their bytes - evaluated for every local rank of a node, so a prediction and a measured
run's byte counters agree by construction. Times follow the ring model of PAPERS.md 1b:

* a ring collective over P ranks takes ``2(P-1)`` steps (all-reduce) or ``P-1`` steps
  (reduce-scatter, all-gather), each costing one ``alpha`` of the slowest link it crosses;
* the bytes cost ``bytes / bandwidth`` on the busiest link: per rank on intra-node links, per
  *node* on the NIC (the ranks of a node share it: n parallel inter-node rings of hitopk and
  hier_allreduce split the NIC n ways, which is what PAPERS.md's per-rank ``beta_inter`` means);
* phases that follow one another (reduce-scatter, then inter-node, then all-gather) add up.

Sparse algorithms also compute: top-k selection (with its error-feedback passes) over the
elements a rank selects from, and the index_add of what it receives. Those costs come from
:class:`SparseRates` and are reported apart from communication ("selection").

``net`` is a :class:`thinwire.sim.network.Network` (``net.intra`` / ``net.inter`` links with
``alpha``, ``bandwidth`` and ``time(steps, bytes)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch

from thinwire.collectives import registry, traffic
from thinwire.compress import SPARSE_WIRES, WIRE_DTYPES, packed_bytes
from thinwire.topk import k_for_density, validate_density

GRAD_ELEMENT_SIZE = 4  # gradients are fp32 (DDP keeps fp32 parameters under autocast)


# The cost model's time grows with the cluster: beyond these it is neither fast nor meaningful
# (the largest GPU clusters have a few thousand nodes of at most a few dozen GPUs).
MAX_NODES = 4096
MAX_RANKS_PER_NODE = 64


@dataclass(frozen=True)
class Cluster:
    nodes: int
    ranks_per_node: int

    def __post_init__(self):
        for name, most in (("nodes", MAX_NODES), ("ranks_per_node", MAX_RANKS_PER_NODE)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise ValueError(f"{name} must be an integer in [1, {most}], got {value!r}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class RankView:
    """What traffic.py reads from a Topology, for one local rank of a simulated cluster."""
    nodes: int
    ranks_per_node: int
    local_rank: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def rank(self) -> int:  # node 0's ranks stand for every node (the model is symmetric)
        return self.local_rank


@dataclass(frozen=True)
class SparseRates:
    """Device speed of the sparse algorithms' own computation (elements per second)."""
    select_rate: float          # top-k selection incl. error feedback, elements of input / s
    scatter_rate: float         # index_add of received (value, index) pairs / s
    select_alpha: float = 0.0   # fixed cost per selection call (kernel launches, host syncs)


@dataclass(frozen=True)
class AlgorithmConfig:
    name: str
    density: float = 0.01
    wire: str | None = None     # dense parts on the wire: None (fp32), "fp16" or "bf16"
    dense_below_bytes: int = registry.DEFAULT_DENSE_BELOW_BYTES  # sparse ones all-reduce less
    sparse_wire: str = "fp32"   # the selected values on the wire (sparse_wire algorithms)
    # the algorithm's own settings (oktopk's tau, ...), checked and completed by the algorithm
    options: dict | None = field(default=None, hash=False)

    def __post_init__(self):
        algorithm = registry.get(self.name)
        validate_density(self.density)
        if (self.wire or "none") not in WIRE_DTYPES:
            raise ValueError(f"wire must be one of {', '.join(WIRE_DTYPES)}, got {self.wire!r}")
        if self.sparse_wire not in SPARSE_WIRES:
            raise ValueError(f"sparse_wire must be one of {', '.join(SPARSE_WIRES)}, got "
                             f"{self.sparse_wire!r}")
        if self.sparse_wire != "fp32" and not algorithm.sparse_wire:
            raise ValueError(f"sparse_wire {self.sparse_wire!r} applies to "
                             f"{', '.join(registry.sparse_wire_names())}, not {self.name!r}")
        object.__setattr__(self, "options", algorithm.check_options(self.options))

    @property
    def wire_size(self) -> int:
        dtype = WIRE_DTYPES[self.wire or "none"]
        return GRAD_ELEMENT_SIZE if dtype is None else torch.empty((), dtype=dtype).element_size()


@dataclass
class BucketCost:
    comm_s: float = 0.0
    select_s: float = 0.0
    intra_bytes: float = 0.0    # sent by the busiest rank on intra-node links
    inter_bytes: float = 0.0    # sent through one node's NIC (all its ranks together)

    def __iadd__(self, other: "BucketCost") -> "BucketCost":
        self.comm_s += other.comm_s
        self.select_s += other.select_s
        self.intra_bytes += other.intra_bytes
        self.inter_bytes += other.inter_bytes
        return self


def volumes(cluster: Cluster, fn, *args) -> tuple[float, float]:
    """(max intra bytes of one rank, inter bytes of one node) of a traffic.py function."""
    per_rank = [fn(RankView(cluster.nodes, cluster.ranks_per_node, j), *args)
                for j in range(cluster.ranks_per_node)]
    return max(t.intra for t in per_rank), sum(t.inter for t in per_rank)


def world_ring(cluster: Cluster, net, steps: int, fn, *args) -> BucketCost:
    """A collective over all ranks: alpha of the slowest link, bytes on the busiest one."""
    intra, inter = volumes(cluster, fn, *args)
    slowest = net.inter if cluster.nodes > 1 else net.intra
    fixed, wire = steps * slowest.alpha, max(intra / net.intra.bandwidth,
                                             inter / net.inter.bandwidth)
    # the link's form (thinwire.sim.network.combine): alpha-beta's sum, or the larger of the two
    seconds = max(fixed, wire) if getattr(slowest, "form", "sum") == "max" else fixed + wire
    return BucketCost(comm_s=seconds, intra_bytes=intra, inter_bytes=inter)


def intra_phase(cluster: Cluster, net, fn, *args) -> BucketCost:
    intra, _ = volumes(cluster, fn, *args)
    return BucketCost(comm_s=net.intra.time(cluster.ranks_per_node - 1, intra), intra_bytes=intra)


def inter_phase(cluster: Cluster, net, steps: int, fn, *args) -> BucketCost:
    _, inter = volumes(cluster, fn, *args)
    return BucketCost(comm_s=net.inter.time(steps, inter), inter_bytes=inter)


@lru_cache(maxsize=4096)
def sparse_block(numel: int, density: float,
                 value_dtype: torch.dtype = torch.float32) -> tuple[int, int]:
    """(k, bytes of one rank's packed values + indices) for a selection over ``numel``."""
    k = k_for_density(numel, density)
    return k, packed_bytes(k, value_dtype, numel)


def sparse_value_dtype(cfg) -> torch.dtype:
    """The dtype the selected values travel in under ``cfg`` (fp32 where it names none)."""
    return SPARSE_WIRES[getattr(cfg, "sparse_wire", None) or "fp32"] or torch.float32


def selection(rates: SparseRates, numel: int, received: int) -> float:
    """Seconds of top-k over ``numel`` entries plus index_add of ``received`` pairs."""
    return rates.select_alpha + numel / rates.select_rate + received / rates.scatter_rate


def padded_length(elements: int, parts: int) -> int:
    """``elements`` rounded up to a multiple of ``parts`` (equal shards)."""
    return -(-elements // parts) * parts


def world_sparse_allgather(cfg, cluster: Cluster, net, elements: int,
                           rates: SparseRates) -> BucketCost:
    """Every rank's top-k (values and indices) all-gathered by all ranks, then summed: the
    selection over ``elements`` and the sum of the W received blocks."""
    w = cluster.world_size
    k, block = sparse_block(elements, cfg.density, sparse_value_dtype(cfg))
    total = world_ring(cluster, net, w - 1, traffic.world_allgather, block)
    total.select_s = selection(rates, elements, w * k)
    return total
