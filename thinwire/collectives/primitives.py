"""Wire helpers shared by the algorithms: padding, the dense all-reduce, the reduce-scatter fast
path, the sparse all-gather exchange and the packed sparse all-to-all. Algorithm files import from here, never from each
other."""

from __future__ import annotations

import torch
import torch.distributed as dist

from thinwire.collectives import traffic
from thinwire.compress import pack, packed_bytes, to_sparse_wire, to_wire, unpack

# torch 2.13 names these all_gather_single / reduce_scatter_single and deprecates the older
# *_into_tensor / *_tensor names; the CUDA builds users (and the `device` tool's GPUs) run may
# be older and have only those. Every collective call goes through these two names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or \
    dist.reduce_scatter_tensor


def all_reduce_sum(tensor: torch.Tensor, group) -> None:
    """``tensor`` = the sum of every member's, in place. ``group`` is a process group, or one
    of the composed groups of a fault-tolerant run (thinwire.ft.groups: the cross-node group
    torchft re-forms at every quorum, and a world built from it and the node's group), which
    do the collective themselves."""
    own = getattr(group, "all_reduce_sum", None)
    if own is not None:
        own(tensor)
    else:
        dist.all_reduce(tensor, group=group)


def all_gather_into(out: torch.Tensor, tensor: torch.Tensor, group) -> None:
    """``out`` = every member's ``tensor``, one after the other in member order (as
    ``all_gather_single``); ``group`` as in :func:`all_reduce_sum`."""
    own = getattr(group, "all_gather_into", None)
    if own is not None:
        own(out, tensor)
    else:
        all_gather_single(out, tensor, group=group)


def padded(flat: torch.Tensor, parts: int) -> torch.Tensor:
    """A copy of ``flat`` zero-padded to a multiple of ``parts`` (shards must be equal)."""
    pad = (-flat.numel()) % parts
    out = torch.zeros(flat.numel() + pad, dtype=flat.dtype, device=flat.device)
    out[:flat.numel()] = flat
    return out


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
        reduce_scatter_single(shard, full, group=group)


def dense_allreduce(state, flat: torch.Tensor) -> torch.Tensor:
    """The average of ``flat`` over all ranks by one all-reduce (DDP's default, on thinwire's own
    world group), in ``state.wire_dtype`` on the wire."""
    topo = state.topology
    # Divide first, as fp16_compress_hook does: a half-precision sum of W gradients may overflow.
    payload = to_wire(flat / topo.world_size, state.wire_dtype)
    if payload is flat:
        payload = payload.clone()
    with state.timer("inter" if topo.nodes > 1 else "intra"):
        all_reduce_sum(payload, topo.world)
    state.record(traffic.world_allreduce(topo, payload.numel(), payload.element_size()))
    return payload.to(flat.dtype)


def sum_sparse(parts, numel: int, dtype, device, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    """Dense sum of (values, indices) pairs; index_add, never scatter: the same index chosen by
    two ranks must add up. ``out``: a zeroed tensor of ``numel`` entries to sum into (a slice
    of a larger result saves allocating and concatenating the parts)."""
    if out is not None and (out.numel() != numel or out.dtype != dtype):
        raise ValueError(f"out must hold {numel} entries of {dtype}, got {out.numel()} of "
                         f"{out.dtype}")
    dense = torch.zeros(numel, dtype=dtype, device=device) if out is None else out
    parts = list(parts)
    if parts:  # values that travelled narrower than the sum's dtype widen exactly here
        # .to(device): dlcp's datagrams arrive in host memory whatever the gradient's device
        dense.index_add_(0, torch.cat([i for _, i in parts]).to(device),
                         torch.cat([v for v, _ in parts]).to(device, dtype))
    return dense


def corrected_copy(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    """This rank's own copy of the bucket plus its error-feedback residual (with momentum
    correction, velocity plus residual): what a sparse algorithm selects from. ``flat`` is
    left as it was given."""
    return state.feedback.add_residual(bucket_index, flat.clone())


def select_shards_for_wire(state, bucket_index: int, corrected: torch.Tensor, shards: int):
    """select_for_wire on each of ``shards`` equal slices of ``corrected`` (zero-padded to a
    multiple): per shard (values as they travel, shard-local indices), and the shard length.
    The residual keeps what no shard sent, and the rounding error of what was sent."""
    numel = corrected.numel()
    rows = padded(corrected, shards).view(shards, -1)
    length = rows.shape[1]
    with state.timer("select"):
        parts = [state.compressor.select(row) for row in rows]  # shard-local indices
    parts = [(to_sparse_wire(v, state.sparse_wire_dtype), i) for v, i in parts]
    sent = torch.cat([indices + s * length for s, (_, indices) in enumerate(parts)])
    real = sent < numel  # padding is never kept
    state.feedback.keep(bucket_index, corrected, sent[real],
                        torch.cat([v for v, _ in parts])[real])
    return parts, length


def select_for_wire(state, bucket_index: int, corrected: torch.Tensor):
    """Top-k of ``corrected`` with its values rounded to ``state.sparse_wire_dtype``; the
    residual keeps what was not sent, the rounding error of what was included, so that
    (what is applied) + residual == corrected exactly. Returns (values as they travel,
    indices)."""
    with state.timer("select"):
        values, indices = state.compressor.select(corrected, key=bucket_index)
    values = to_sparse_wire(values, state.sparse_wire_dtype)
    state.feedback.keep(bucket_index, corrected, indices, values)
    return values, indices


def select_and_allgather(state, bucket_index: int, corrected: torch.Tensor, group,
                         group_size: int, phase: str = "inter"):
    """Top-k of ``corrected`` (the kept-back part stored as the residual), all-gathered among
    ``group`` in one packed collective; returns (the members' packed blocks, one after the
    other, as bytes; k; the values' dtype; bytes of one block)."""
    values, indices = select_for_wire(state, bucket_index, corrected)
    payload = pack(values, indices, corrected.numel())
    gathered = torch.empty(group_size * payload.numel(), dtype=torch.uint8,
                           device=payload.device)
    with state.timer(phase, members=group_size):
        all_gather_into(gathered, payload, group)
    return gathered, values.numel(), values.dtype, payload.numel()


def sum_blocks(gathered: torch.Tensor, members: int, k: int, dtype, numel: int,
               out_dtype=None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Dense sum, in ``out_dtype`` (default: the values' ``dtype``), of ``members`` packed
    (values, indices) blocks of k entries each (into ``out``, zeroed, where given)."""
    parts = [unpack(chunk, k, dtype, numel) for chunk in gathered.chunk(members)]
    return sum_sparse(parts, numel, out_dtype or dtype, gathered.device, out)


def sparse_allgather(state, bucket_index: int, corrected: torch.Tensor, group, group_size: int,
                     phase: str = "inter"):
    """select_and_allgather, summed: (dense sum of every member's selection, bytes of one
    member's block)."""
    gathered, k, dtype, block_bytes = select_and_allgather(state, bucket_index, corrected, group,
                                                           group_size, phase)
    return sum_blocks(gathered, group_size, k, dtype, corrected.numel(),
                      corrected.dtype), block_bytes


def sparse_alltoall(state, parts, numel: int, group, phase: str, equal_sizes: bool = False,
                    received_counts: list[int] | None = None):
    """Send ``parts[s]`` = (values, indices < numel) to member ``s`` of ``group``, all in one
    packed all-to-all; returns (what each member sent here, in member order; the bytes sent to
    each member).

    With ``equal_sizes`` every block holds the same number of entries (a fixed k), so the
    receiver knows their sizes. Otherwise the entry counts are exchanged first by a small
    all-to-all (8 bytes per member, recorded by the caller): gloo's all-to-all takes uneven
    splits, so only the bytes each block needs travel, never padding to the largest block.
    A caller that knows what each member sends passes ``received_counts`` instead.
    """
    dtype, device = parts[0][0].dtype, parts[0][0].device
    counts = torch.tensor([v.numel() for v, _ in parts], dtype=torch.int64, device=device)
    if received_counts is not None:
        received_counts = torch.tensor(received_counts, dtype=torch.int64)
    elif equal_sizes:
        received_counts = counts
    else:
        received_counts = torch.empty_like(counts)
        with state.timer(phase):
            dist.all_to_all_single(received_counts, counts, group=group)
    payloads = [pack(v, i, numel) for v, i in parts]
    sent = [p.numel() for p in payloads]
    received_counts = received_counts.tolist()
    splits = [packed_bytes(c, dtype, numel) for c in received_counts]
    received = torch.empty(sum(splits), dtype=torch.uint8, device=device)
    with state.timer(phase):
        dist.all_to_all_single(received, torch.cat(payloads), splits, sent, group=group)
    blocks = [unpack(chunk, c, dtype, numel)
              for chunk, c in zip(received.split(splits), received_counts)]
    return blocks, sent
