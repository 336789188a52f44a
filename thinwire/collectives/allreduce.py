"""Dense all-reduce over all ranks: the same result as DDP's default hook."""

from __future__ import annotations

import torch
import torch.distributed as dist

from thinwire.collectives import traffic
from thinwire.compress import to_wire


def reduce(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    topo = state.topology
    wire = state.wire_dtype
    # Divide first, as fp16_compress_hook does: a half-precision sum of W gradients may overflow.
    payload = to_wire(flat / topo.world_size, wire)
    if payload is flat:
        payload = payload.clone()
    with state.timer("inter"):
        dist.all_reduce(payload, group=topo.world)
    state.record(traffic.world_allreduce(topo, payload.numel(), payload.element_size()))
    return payload.to(flat.dtype)
