"""Collective building blocks with backend-specific fast paths behind one function."""

from __future__ import annotations

import torch
import torch.distributed as dist


def reduce_scatter(shard: torch.Tensor, full: torch.Tensor, group, group_size: int) -> None:
    """``shard`` = this member's 1/group_size slice of the sum of every member's ``full``.

    On gloo, reduce_scatter measured about twice as slow as an all-to-all followed by a local
    sum (0.20 s against 0.12 s for 25.6M floats on 2 ranks), for the same (P-1)/P volume: the
    all-to-all sends each member exactly the slices it owns, so that is what runs there.
    """
    if group_size == 1:
        shard.copy_(full)
        return
    if dist.get_backend(group) == "gloo":
        received = torch.empty_like(full)
        dist.all_to_all_single(received, full, group=group)
        torch.sum(received.view(group_size, -1), dim=0, out=shard)
    else:
        dist.reduce_scatter_single(shard, full, group=group)
