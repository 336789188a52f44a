"""Nodes x ranks per node, and the process groups the hierarchical algorithms need.

Global rank ``r`` sits on node ``r // ranks_per_node`` with local rank ``r % ranks_per_node``,
the layout torchrun gives homogeneous jobs. The groups are built once, collectively, by every
rank in the same order (``torch.distributed.new_group`` requires that):

* ``world``: all ranks, a group of thinwire's own so its traffic never interleaves with what
  DDP itself sends on the default group;
* ``intra``: the ranks of this rank's node (fast links);
* ``inter``: the ranks sharing this rank's local rank, one per node (slow links).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class Topology:
    world_size: int
    rank: int
    ranks_per_node: int
    world: object = field(repr=False)
    intra: object = field(repr=False)
    inter: object = field(repr=False)

    @property
    def nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    @property
    def node(self) -> int:
        return self.rank // self.ranks_per_node

    @property
    def local_rank(self) -> int:
        return self.rank % self.ranks_per_node

    @classmethod
    def build(cls, ranks_per_node: int | None = None) -> "Topology":
        """Collective: every rank calls it. ``ranks_per_node`` defaults to torchrun's
        ``LOCAL_WORLD_SIZE`` (or ``THINWIRE_RANKS_PER_NODE``), so one machine can act as several
        nodes when it is given explicitly."""
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed must be initialised before building a Topology "
                               "(call torch.distributed.init_process_group first)")
        world_size, rank = dist.get_world_size(), dist.get_rank()
        n = _ranks_per_node_from(ranks_per_node, world_size)
        _check_all_ranks_agree(n, world_size)
        world = dist.new_group(list(range(world_size)))
        intra, _ = dist.new_subgroups_by_enumeration(
            [list(range(node * n, (node + 1) * n)) for node in range(world_size // n)])
        inter, _ = dist.new_subgroups_by_enumeration(
            [list(range(local, world_size, n)) for local in range(n)])
        return cls(world_size, rank, n, world, intra, inter)


def _ranks_per_node_from(ranks_per_node: int | None, world_size: int) -> int:
    source = "ranks_per_node"
    if ranks_per_node is None:
        for name in ("THINWIRE_RANKS_PER_NODE", "LOCAL_WORLD_SIZE"):
            if os.environ.get(name):
                ranks_per_node, source = os.environ[name], name
                break
        else:
            ranks_per_node, source = world_size, "default (one node)"
    try:
        n = int(ranks_per_node)
    except (TypeError, ValueError):
        raise ValueError(f"ranks_per_node ({source}) must be an integer, got {ranks_per_node!r}")
    if n < 1 or world_size % n:
        raise ValueError(f"ranks_per_node ({source}) must be >= 1 and divide the world size "
                         f"{world_size} evenly, got {n}")
    return n


def _check_all_ranks_agree(ranks_per_node: int, world_size: int) -> None:
    """Every rank states its view; all compare all, so a mismatch fails everywhere, never hangs."""
    device = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.tensor([ranks_per_node], dtype=torch.int64, device=device)
    views = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(views, mine)
    seen = [int(v) for v in views]
    if len(set(seen)) != 1:
        raise ValueError(f"ranks_per_node differs between ranks: rank r reports {seen} "
                         "(index = rank); every rank must use the same value")
