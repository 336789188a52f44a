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

import atexit
import datetime
import gc
import math
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

    timeout: datetime.timedelta | None = None

    @classmethod
    def build(cls, ranks_per_node: int | None = None,
              timeout: datetime.timedelta | float | None = None) -> "Topology":
        """Collective: every rank calls it. ``ranks_per_node`` defaults to
        ``THINWIRE_RANKS_PER_NODE`` (the emulated cluster's), else torchrun's
        ``LOCAL_WORLD_SIZE``, so one machine can act as several nodes when it is given
        explicitly. ``timeout`` (a timedelta or seconds) bounds every
        collective on the groups; by default the one given to ``init_process_group``, so a
        frozen peer ends thinwire's collectives as soon as it ends the user's own."""
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed must be initialised before building a Topology "
                               "(call torch.distributed.init_process_group first)")
        timeout = _check_timeout(timeout) if timeout is not None else default_timeout()
        world_size, rank = dist.get_world_size(), dist.get_rank()
        n = ranks_per_node_of(ranks_per_node, world_size)
        _check_all_ranks_agree(n, world_size)
        world = dist.new_group(list(range(world_size)), timeout=timeout)
        intra, _ = dist.new_subgroups_by_enumeration(
            [list(range(node * n, (node + 1) * n)) for node in range(world_size // n)],
            timeout=timeout)
        inter, _ = dist.new_subgroups_by_enumeration(
            [list(range(local, world_size, n)) for local in range(n)], timeout=timeout)
        return cls(world_size, rank, n, world, intra, inter, timeout)

    def close(self) -> None:
        """Destroy this topology's process groups (their sockets and threads); it cannot be
        used afterwards. Local (no collective): each rank closes its own, any time after its
        last collective on them. Building and closing in a loop keeps the file descriptors
        flat (a build opens ~14 here; a sweep in one process ran out of them after ~70)."""
        for key, (_, cached) in list(_SHARED.items()):
            if cached is self:
                del _SHARED[key]
        groups = {id(g): g for g in (self.world, self.intra, self.inter)
                  if isinstance(g, dist.ProcessGroup)}
        self.world = self.intra = self.inter = None
        if not dist.is_initialized():
            return  # destroy_process_group(None) already took them
        known = dist.distributed_c10d._world.pg_map
        for group in groups.values():
            if group in known:
                dist.destroy_process_group(group)

    def __enter__(self) -> "Topology":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @classmethod
    def shared(cls, ranks_per_node: int | None = None,
               timeout: datetime.timedelta | float | None = None) -> "Topology":
        """:meth:`build`, once per (default process group, ranks per node, timeout): models
        registered one after another reuse the same groups instead of opening new sockets
        each time. Collective like :meth:`build` (every rank makes the same calls, so every
        rank hits or misses the cache alike)."""
        if not dist.is_initialized():
            return cls.build(ranks_per_node, timeout)  # raises the clear error
        default = dist.distributed_c10d._get_default_group()
        n = ranks_per_node_of(ranks_per_node, dist.get_world_size())
        limit = _check_timeout(timeout) if timeout is not None else default_timeout()
        key = (id(default), n, limit)
        cached = _SHARED.get(key)
        if cached is None or cached[0] is not default:
            # the default group is kept in the entry, so its id cannot be reused by a new one
            _SHARED[key] = (default, cls.build(n, limit))
        return _SHARED[key][1]


_SHARED: dict = {}


@atexit.register
def _forget_shared_groups() -> None:
    """Drop the cached groups while torch is intact: left to the interpreter's final teardown,
    a process group destroyed after torch's own state aborts the process ("terminate called
    without an active exception"), as it did in about one test run in three."""
    _SHARED.clear()
    gc.collect()


def default_timeout() -> datetime.timedelta | None:
    """The timeout the user gave ``init_process_group`` (None where the backend hides it)."""
    try:
        group = dist.distributed_c10d._get_default_group()
        device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
        return group._get_backend(device).options._timeout
    except (AttributeError, RuntimeError, ValueError):
        return None


def _check_timeout(timeout) -> datetime.timedelta:
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise ValueError(f"timeout must be a datetime.timedelta or a number of seconds > 0, got "
                         f"{timeout!r}")
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"timeout must be finite and > 0 seconds, got {timeout!r}")
    return datetime.timedelta(seconds=seconds)


def ranks_per_node_of(ranks_per_node: int | None, world_size: int) -> int:
    """``ranks_per_node`` checked against ``world_size``; None: the launcher's
    (THINWIRE_RANKS_PER_NODE, LOCAL_WORLD_SIZE), else one node."""
    source = "ranks_per_node"
    if isinstance(ranks_per_node, (bool, float)):
        raise ValueError(f"ranks_per_node must be an integer >= 1, got {ranks_per_node!r}")
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
