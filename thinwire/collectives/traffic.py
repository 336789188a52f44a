"""Bytes each rank sends, by link class, under ring schedules (the model of PAPERS.md 1b).

A ring collective over P ranks sends, per rank: all-reduce ``2(P-1)/P * d`` elements,
reduce-scatter and all-gather ``(P-1)/P * d`` each (d the full length), and an all-gather of a
B-byte block ``(P-1) * B``. In a ring over all W ranks ordered by node, rank r sends to rank
r+1, which is on another node only for the last local rank of a node: that rank's traffic is
inter-node, everyone else's intra-node. Gloo and NCCL may pick other schedules; the counters
report this model, the same on every backend, so algorithms compare on equal terms.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Traffic:
    intra: float = 0.0
    inter: float = 0.0


def _world_ring(topology, sent_bytes: float) -> Traffic:
    crosses = topology.nodes > 1 and topology.local_rank == topology.ranks_per_node - 1
    return Traffic(inter=sent_bytes) if crosses else Traffic(intra=sent_bytes)


def world_allreduce(topology, elements: int, element_size: int) -> Traffic:
    p = topology.world_size
    return _world_ring(topology, 2 * (p - 1) / p * elements * element_size)


def world_allgather(topology, block_bytes: int) -> Traffic:
    return _world_ring(topology, (topology.world_size - 1) * block_bytes)


def intra_reduce_scatter(topology, elements: int, element_size: int) -> Traffic:
    n = topology.ranks_per_node
    return Traffic(intra=(n - 1) / n * elements * element_size)


intra_allgather = intra_reduce_scatter  # the same volume, the other direction


def inter_allreduce(topology, elements: int, element_size: int) -> Traffic:
    m = topology.nodes
    return Traffic(inter=2 * (m - 1) / m * elements * element_size)


def inter_allgather(topology, block_bytes: int) -> Traffic:
    return Traffic(inter=(topology.nodes - 1) * block_bytes)


def world_alltoall(topology, block_bytes: float) -> Traffic:
    """An all-to-all over all W ranks with one ``block_bytes`` block per destination: a rank
    sends W-1 blocks (none to itself), (m-1)*n of them to ranks on other nodes."""
    n, m = topology.ranks_per_node, topology.nodes
    return Traffic(intra=(n - 1) * block_bytes, inter=(m - 1) * n * block_bytes)


def world_alltoallv(topology, sent_bytes) -> Traffic:
    """An all-to-all over all W ranks with ``sent_bytes[s]`` bytes to global rank ``s``."""
    n = topology.ranks_per_node
    node = topology.rank // n
    out = Traffic()
    for destination, nbytes in enumerate(sent_bytes):
        if destination == topology.rank:
            continue
        if destination // n == node:
            out.intra += nbytes
        else:
            out.inter += nbytes
    return out
