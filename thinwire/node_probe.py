"""How fast is the link inside a node? The intra-node half of auto's probe.

:func:`probe_intra_node`: the ranks of each node all-reduce two sizes among themselves (over
the backend the run trains with: gloo over the host's loopback on the emulator, NCCL over
NVLink or PCIe on GPUs); the difference of the two times over the difference of the bytes
each rank sends is the goodput (fixed costs cancel), and the line's intercept is the fixed cost
of one all-reduce. Every node measures at once, and every rank gets the slowest node's numbers
(the slowest node paces a step). The host is watched meanwhile (:class:`HostWatch`): on a
saturated or throttled host the numbers are the host's, and the probe says so.

auto's plan takes the goodput for its intra-node bandwidth where the host did not bind the
probe (:mod:`thinwire.sim.probed_links`; the calibration's races fitted it on their own
cluster); ``thinwire.ddp``'s auto records the numbers (its pilot times the candidates' real
steps instead).
"""

from __future__ import annotations

import datetime
import statistics

import torch
import torch.distributed as dist

from thinwire.link_probe import (PROBE_REPEATS, SATURATED, THROTTLED, HostWatch,
                                 timed_all_reduce, probe_device)

SMALL_BYTES, LARGE_BYTES = 1 << 20, 8 << 20  # inside a node 8 MiB takes milliseconds


def node_groups(ranks_per_node: int, timeout_s: float):
    """This rank's node's group (every rank creates every node's, in the same order)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = None
    for first in range(0, world, ranks_per_node):
        ranks = list(range(first, min(first + ranks_per_node, world)))
        group = dist.new_group(ranks=ranks, timeout=datetime.timedelta(seconds=timeout_s))
        if rank in ranks:
            mine = group
    return mine


def probe_intra_node(ranks_per_node: int, timeout_s: float, sizes: tuple = (SMALL_BYTES,
                     LARGE_BYTES), repeats: int = PROBE_REPEATS,
                     device: torch.device | None = None, world_group=None) -> dict:
    """The slowest node's intra-node all-reduce goodput (bytes/s a rank sends) and fixed cost
    (s), every rank the same numbers. Collective: every rank calls it. One rank a node: no
    link inside a node to measure (``goodput_Bps`` None). ``world_group``: a group of every
    rank for the nodes' worst (its timeout bounds the wait; None: the default group)."""
    if ranks_per_node < 2:
        return {"ranks_per_node": ranks_per_node, "goodput_Bps": None,
                "why": "one rank a node: nothing inside a node to measure"}
    small, large = sizes
    if not 0 < small < large:
        raise ValueError(f"sizes must be two byte counts 0 < small < large, got {sizes!r}")
    device = device or probe_device()
    group = node_groups(ranks_per_node, timeout_s)
    try:
        with HostWatch() as watch:
            times = []
            for size in (small, large):
                buffer = torch.ones(size // 4, dtype=torch.float32, device=device)
                timed_all_reduce(buffer, group)  # the buffers' first use, untimed
                times.append(statistics.median(timed_all_reduce(buffer, group)
                                               for _ in range(repeats)))
    finally:
        dist.destroy_process_group(group)
    share = 2 * (ranks_per_node - 1) / ranks_per_node  # a ring all-reduce sends this share
    extra_s = times[1] - times[0]
    goodput = share * (large - small) / extra_s if extra_s > 0 else 0.0
    fixed_s = max(times[0] - share * small / goodput, 0.0) if goodput > 0 else times[0]
    # the slowest node's: its goodput least, its times, fixed cost and host the worst
    worst = torch.tensor([-goodput, times[0], times[1], fixed_s,
                          -1.0 if watch.host_busy is None else watch.host_busy,
                          watch.throttled_share], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=world_group)
    goodput, small_s, large_s, fixed_s, busy, throttled = worst.tolist()
    goodput = -goodput
    host_busy = None if busy < 0 else busy
    host_bound = (host_busy is not None and host_busy >= SATURATED) or throttled > THROTTLED
    return {"ranks_per_node": ranks_per_node, "goodput_Bps": goodput if goodput > 0 else None,
            "fixed_s": fixed_s, "small_bytes": small, "small_s": small_s,
            "large_bytes": large, "large_s": large_s, "host_busy": host_busy,
            "throttled_share": throttled, "bound_by": "host" if host_bound else "link",
            **({} if goodput > 0 else {"why": f"{large} bytes took no longer than {small} "
                                               f"({large_s:.5f} s against {small_s:.5f} s)"})}
