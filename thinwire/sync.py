"""The same algorithms without DDP, for custom training loops.

    state = thinwire.SyncState(thinwire.Topology.build(), "hitopk", density=0.01)
    loss.backward()
    thinwire.synchronize(model.parameters(), state)   # every .grad is now the average
    optimizer.step()
"""

from __future__ import annotations

from typing import Iterable

import torch

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb


def buckets(parameters: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Parameters grouped into buckets of at most ``bucket_bytes`` (one parameter may exceed it),
    in reverse order as DDP does (gradients of the last layers are ready first), split by dtype
    and device."""
    groups: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    size = 0
    for p in reversed(parameters):
        nbytes = p.numel() * p.element_size()
        same_kind = not current or (current[0].dtype, current[0].device) == (p.dtype, p.device)
        if current and (size + nbytes > bucket_bytes or not same_kind):
            groups.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        groups.append(current)
    return groups


def synchronize(parameters: Iterable[torch.Tensor], state,
                bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """Replace every parameter's ``.grad`` by its average over all ranks (collective).

    Every rank must pass the same parameters, all with gradients. The result equals the DDP
    hook's for the same :class:`~thinwire.state.SyncState` settings and the same buckets: the
    same weight decay in the hook, dense warm-up, and each bucket in canonical (model) order.
    """
    if not isinstance(bucket_bytes, int) or isinstance(bucket_bytes, bool) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be an int >= 1, got {bucket_bytes!r}")
    params = [p for p in parameters if p.requires_grad]
    missing = [i for i, p in enumerate(params) if p.grad is None]
    if missing:
        raise ValueError(f"parameters {missing[:5]} have no .grad; call backward() first (every "
                         "rank must synchronise the same parameters)")
    if any(p.grad.is_sparse for p in params):
        raise TypeError("sparse gradients are not supported; use dense embeddings here")
    position = {id(p): i for i, p in enumerate(params)}
    try:
        _reduce_buckets(params, state, bucket_bytes, position)
    except BaseException:
        state.abandon_step()  # a caller that goes on starts the next step clean
        raise


def _reduce_buckets(params, state, bucket_bytes: int, position: dict) -> None:
    for index, bucket in enumerate(buckets(params, bucket_bytes)):
        bucket = sorted(bucket, key=lambda p: position[id(p)])  # canonical: model order
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        state.add_weight_decay(flat, bucket)
        averaged = state.reduce(index, flat, tuple(position[id(p)] for p in bucket))
        offset = 0
        for p in bucket:
            p.grad.copy_(averaged[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()
    state.end_step()
