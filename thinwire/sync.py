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


def flush_residuals(parameters: Iterable[torch.Tensor], state):
    """Every rank's error-feedback residual, averaged over all ranks, as gradients (collective,
    dense): returns ``(flushed, mass)`` and empties the residuals (and momentum correction's
    velocities).

    ``flushed[i]`` is what the residuals held for parameter ``i``, in the units of a
    synchronised gradient (zero where none); ``flushed`` is None where no rank holds a
    residual (a dense algorithm: nothing is sent). Add it to the next step's synchronised ``.grad``
    (before ``optimizer.step()``) and the mass a sparse algorithm held back is applied: the
    steps' synchronised gradients plus the flush sum to the average of every rank's gradients
    over those steps (sent + kept = corrected, with nothing kept after). For a switch to
    another algorithm, density or selector, whose residuals would mean other coordinates.

    ``parameters``: those given to :func:`synchronize` (its trainable ones, in model order);
    for DDP use :func:`thinwire.ddp.flush_residuals`. ``mass``: this rank's flushed residual
    before averaging (``ErrorFeedback.mass``: l1, sum, elements) and the buckets flushed.
    """
    return flush_indexed([p for p in parameters if p.requires_grad], state)


def flush_indexed(params: list[torch.Tensor], state, average: bool = True):
    """:func:`flush_residuals` with ``params`` indexed as the residuals' layouts index them.
    ``average`` False: this rank's own residuals per parameter, not exchanged (no collective),
    in the units of this rank's gradient: added to the rank's next gradient before any
    synchronisation averages it, they deliver the same mass as the averaged flush added after
    (:func:`thinwire.train.replan.switch`'s hand-over, which costs no dense exchange)."""
    from thinwire import collectives

    topo = state.topology
    if topo is None:
        raise RuntimeError("this SyncState has no topology: attach one before flushing")
    if not state.feedback.residuals:  # a dense algorithm, or none yet (alike on every rank)
        return None, dict(state.feedback.mass(), buckets=0)
    space = collectives.get(state.algorithm).residual_space
    summed = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in params]
    for bucket, residual in sorted(state.feedback.residuals.items()):
        layout = state.feedback.layouts.get(bucket)
        if layout is None or not layout or min(layout) < 0 or max(layout) >= len(params):
            raise ValueError(f"the residual of bucket {bucket} names parameters {layout}, not "
                             f"indices of the {len(params)} parameters given")
        numel = sum(params[i].numel() for i in layout)
        flat = _in_bucket_space(space, residual, numel, topo, bucket)
        offset = 0
        for i in layout:
            size = params[i].numel()
            summed[i].add_(flat[offset:offset + size].view_as(summed[i]))
            offset += size
    mass = dict(state.feedback.mass(), buckets=len(state.feedback.residuals))
    state.feedback.reset()
    return (average_over_ranks(summed, topo.world) if average else summed), mass


def average_over_ranks(tensors: list[torch.Tensor], group=None) -> list[torch.Tensor]:
    """Each tensor averaged over the ranks of ``group`` (collective): one dense all-reduce
    per (dtype, device), so a flush costs about one dense step."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    out = list(tensors)
    kinds: dict = {}
    for i, tensor in enumerate(tensors):
        kinds.setdefault((tensor.dtype, tensor.device), []).append(i)
    for members in kinds.values():
        flat = torch.cat([tensors[i].reshape(-1) for i in members])
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        offset = 0
        for i in members:
            size = tensors[i].numel()
            out[i] = flat[offset:offset + size].view_as(tensors[i])
            offset += size
    return out


def _in_bucket_space(space: str, residual: torch.Tensor, numel: int, topo,
                     bucket: int) -> torch.Tensor:
    """A residual as a vector over its bucket (canonical order): where it sits there."""
    if space == "bucket":
        if residual.numel() != numel:
            raise ValueError(f"the residual of bucket {bucket} holds {residual.numel()} "
                             f"entries, its parameters {numel}")
        return residual
    n = topo.ranks_per_node  # node_shard: this local rank's slice of the padded node sum
    shard = residual.numel()
    if shard * n != numel + (-numel) % n:
        raise ValueError(f"the residual of bucket {bucket} holds {shard} entries, not a "
                         f"1/{n} shard of its {numel}")
    full = torch.zeros(shard * n, dtype=residual.dtype, device=residual.device)
    full[topo.local_rank * shard:(topo.local_rank + 1) * shard] = residual
    return full[:numel]
