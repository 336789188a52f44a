"""How a requester's entries reach their owners: one byte stream per owner, and its decoding.

A block for one owner holds, in this order,

* ``ids``: the ids the owner must look up, as ``I``-byte integers (``id_dtype``);
* ``index``: per entry, the position of its id in ``ids`` (only when ids are deduplicated);
* ``lengths``: per segment sent to the owner, how many of the entries belong to it.

Entries arrive grouped by segment, in the order of the segments, so ``lengths`` is all the owner
needs to sum its partial per segment. ``index`` and ``lengths`` are written in the narrowest of
1, 2 or 4 bytes that holds their largest value, chosen per block and announced in the block's
header row ``[entries, segments, ids, index_width, length_width]`` (5 int64 per peer).

``dedup=True`` (DES): where it is smaller, each distinct id of the block travels once and entries
refer to it by index (a low-cardinality field such as gender, or popular ids, then cost ~1 byte
per entry instead of ``I``); where ids hardly repeat, the block sends every id (index width 0),
which is what the requester decides per block; lengths are narrow either way. ``dedup=False`` (the TorchRec-style baselines, which ship the raw jagged
tensor): ids per entry, no index, 4-byte lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


HEADER_COLUMNS = 5
_WIDTH_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def int_width(max_value: int) -> int:
    """Bytes per value for non-negative integers up to max_value (1, 2 or 4)."""
    if max_value < 0:
        raise ValueError(f"max_value must be >= 0, got {max_value}")
    if max_value < 2**8:
        return 1
    if max_value < 2**15:
        return 2
    if max_value < 2**31:
        return 4
    raise ValueError(f"max_value must be < 2**31 to travel as an index, got {max_value}")


def to_bytes(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return values.to(dtype).contiguous().view(torch.uint8)


def from_bytes(block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # clone: a slice of the received stream need not be aligned for the wider dtype
    return block.clone().view(dtype).long()


def encode(ids: torch.Tensor, dest: torch.Tensor, lengths: torch.Tensor, segments: torch.Tensor,
           world: int, id_dtype: torch.dtype, dedup: bool,
           rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The byte stream (owner blocks in rank order) and its header [world, 5] int64.

    ``ids``/``dest``: entries sorted by (owner, segment); ``lengths``: entries per touched
    segment, in the same order; ``segments``: touched segments per owner. The block for
    ``rank`` (this rank's own, which never crosses the network) is not deduplicated."""
    entries = torch.bincount(dest, minlength=world)
    id_bytes = torch.empty((), dtype=id_dtype).element_size()
    id_blocks = ids.split(entries.tolist())
    length_blocks = lengths.split(segments.tolist())
    blocks, header = [], []
    for k in range(world):
        block_ids, n = id_blocks[k], int(entries[k])
        index_width, sent_ids = 0, block_ids
        if dedup and n and k != rank:
            distinct, local = torch.unique(block_ids, return_inverse=True)
            width = int_width(len(distinct) - 1)
            # indices pay off only where ids repeat enough: else send every id
            if len(distinct) * id_bytes + n * width < n * id_bytes:
                index_width, sent_ids = width, distinct
        parts = [to_bytes(sent_ids, id_dtype)]
        if index_width:
            parts.append(to_bytes(local, _WIDTH_DTYPES[index_width]))
        longest = int(length_blocks[k].max()) if len(length_blocks[k]) else 0
        length_width = int_width(longest) if dedup else 4
        parts.append(to_bytes(length_blocks[k], _WIDTH_DTYPES[length_width]))
        blocks += parts
        header.append([n, int(segments[k]), len(sent_ids), index_width, length_width])
    return torch.cat(blocks), torch.tensor(header, dtype=torch.int64)


def block_bytes(header: torch.Tensor, id_bytes: int) -> torch.Tensor:
    """Bytes of each block announced by `header` rows."""
    n, s, u, wi, wl = header.unbind(1)
    return u * id_bytes + n * wi + s * wl


@dataclass
class Received:
    """What an owner got from all requesters, merged: each distinct id once."""
    ids: torch.Tensor            # [V] distinct ids to look up
    entry_row: torch.Tensor      # [n] per entry, its id's place in `ids`
    entry_segment: torch.Tensor  # [n] per entry, its segment among all received segments
    num_segments: int


def decode(stream: torch.Tensor, header: torch.Tensor, id_dtype: torch.dtype) -> Received:
    id_bytes = torch.empty((), dtype=id_dtype).element_size()
    sizes = block_bytes(header, id_bytes).tolist()
    ids, rows, segs = [], [], []
    id_base = seg_base = 0
    for block, (n, s, u, wi, wl) in zip(stream.split(sizes), header.tolist()):
        cut = u * id_bytes
        ids.append(from_bytes(block[:cut], id_dtype))
        if wi:
            rows.append(id_base + from_bytes(block[cut:cut + n * wi], _WIDTH_DTYPES[wi]))
            cut += n * wi
        else:
            rows.append(id_base + torch.arange(n))
        lengths = from_bytes(block[cut:cut + s * wl], _WIDTH_DTYPES[wl])
        segs.append(seg_base + torch.repeat_interleave(torch.arange(s), lengths))
        id_base += u
        seg_base += s
    # the same id can come from several requesters: look it up (and update it) once
    distinct, inverse = torch.unique(torch.cat(ids), return_inverse=True)
    return Received(distinct, inverse[torch.cat(rows)], torch.cat(segs), seg_base)
