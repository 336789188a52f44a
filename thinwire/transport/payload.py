"""Cutting a gradient payload into datagrams, and putting received datagrams back together.

A payload is either sparse, ``(values, indices)`` of a top-k selection, or dense, one bucket's
values (the index of an entry is its position). Both are cut into datagrams of
``entries_per_datagram`` consecutive entries; ``n_high = ceil(high_share * total)`` of them are
marked high (DLCP's magnitude priority):

* sparse: the entries are first ordered by magnitude, largest first, so the high datagrams hold
  the largest entries and are ``seq < n_high``;
* dense: entries keep their places (no index travels); the ``n_high`` datagrams with the largest
  sum of squares are high and are sent first.

Values travel in their own dtype, indices as int32, both in the host's byte order (thinwire's
ranks run on little-endian hosts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from thinwire.transport import wire

INDEX_BYTES = 4


@dataclass(frozen=True)
class Layout:
    entries: int
    sparse: bool
    dtype: torch.dtype
    per_datagram: int
    total: int
    n_high: int

    entry_bytes: int = 0  # value (+ index) bytes of one entry
    index_limit: int = 0  # sparse: every index must lie in [0, index_limit) (0: not checked)


    def span(self, seq: int) -> tuple[int, int]:
        """(offset, count) of datagram ``seq``."""
        offset = seq * self.per_datagram
        return offset, min(self.per_datagram, self.entries - offset)


# A float is non-finite exactly when its exponent bits are all ones: checked on the raw bits, so
# every wire dtype (bfloat16 too, which numpy lacks) takes one vectorised pass and no tensor.
_EXPONENT = {torch.float32: (np.uint32, 0x7F800000), torch.float16: (np.uint16, 0x7C00),
             torch.bfloat16: (np.uint16, 0x7F80), torch.float64: (np.uint64, 0x7FF0000000000000)}


def check_content(layout: Layout, count: int, body: bytes) -> str | None:
    """Why a datagram's entries cannot be applied (None: they can): a non-finite value, or an
    index outside [0, index_limit). A peer never sends either; a forged or corrupted datagram
    that passed the checksum might."""
    size = layout.entry_bytes - (INDEX_BYTES if layout.sparse else 0)
    bits = _EXPONENT.get(layout.dtype)
    if bits is not None:
        raw = np.frombuffer(body, dtype=bits[0], count=count)
        if np.any((raw & bits[0](bits[1])) == bits[0](bits[1])):
            return "a non-finite value"
    if layout.sparse:
        indices = np.frombuffer(body, dtype=np.int32, count=count, offset=count * size)
        if count and (indices.min() < 0 or (layout.index_limit
                                            and indices.max() >= layout.index_limit)):
            return f"an index outside [0, {layout.index_limit or '...'})"
    return None


def entries_per_datagram(dtype: torch.dtype, sparse: bool,
                         datagram_bytes: int = wire.MAX_DATAGRAM_BYTES) -> int:
    entry = torch.empty(0, dtype=dtype).element_size() + (INDEX_BYTES if sparse else 0)
    return (datagram_bytes - wire.HEADER_BYTES) // entry


def make_layout(entries: int, dtype: torch.dtype, sparse: bool, high_share: float,
                datagram_bytes: int = wire.MAX_DATAGRAM_BYTES) -> Layout:
    per = entries_per_datagram(dtype, sparse, datagram_bytes)
    total = math.ceil(entries / per)
    entry = torch.empty(0, dtype=dtype).element_size() + (INDEX_BYTES if sparse else 0)
    return Layout(entries, sparse, dtype, per, total, math.ceil(high_share * total), entry)


def max_entries(dtype: torch.dtype, sparse: bool,
                datagram_bytes: int = wire.MAX_DATAGRAM_BYTES) -> int:
    """The most entries one payload may have (its bitmap must fit in one datagram)."""
    return wire.MAX_DATAGRAMS * entries_per_datagram(dtype, sparse, datagram_bytes)


@dataclass
class Cut:
    layout: Layout
    order: torch.Tensor | None       # sparse: sorted position -> original position
    bodies: list[bytes]              # by seq
    high: list[bool]                 # by seq
    send_order: list[int]            # seqs, high ones first


def _raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def cut(values: torch.Tensor, indices: torch.Tensor | None, high_share: float,
        datagram_bytes: int = wire.MAX_DATAGRAM_BYTES) -> Cut:
    values = values.detach().reshape(-1).cpu()
    sparse = indices is not None
    layout = make_layout(values.numel(), values.dtype, sparse, high_share, datagram_bytes)
    per, order = layout.per_datagram, None
    if sparse:
        # the high entries first (largest magnitude, found by topk, cheaper than a full sort
        # on a busy host), then the others in their own order: only the split matters
        n_top = min(values.numel(), layout.n_high * per)
        top = torch.topk(values.abs(), n_top, sorted=False).indices
        rest = torch.ones(values.numel(), dtype=torch.bool)
        rest[top] = False
        order = torch.cat([top, rest.nonzero().flatten()])
        values = values[order]
        index_raw = _raw(indices.detach().reshape(-1).cpu()[order].to(torch.int32))
    value_raw, size = _raw(values), values.element_size()
    bodies = []
    for seq in range(layout.total):
        lo, count = layout.span(seq)
        body = value_raw[lo * size:(lo + count) * size]
        if sparse:
            body += index_raw[lo * INDEX_BYTES:(lo + count) * INDEX_BYTES]
        bodies.append(body)
    if sparse:
        high = [seq < layout.n_high for seq in range(layout.total)]
    else:
        squares = torch.nn.functional.pad(values.double() ** 2, (0, layout.total * per -
                                                                  values.numel()))
        scores = squares.view(layout.total, per).sum(dim=1) if layout.total else squares
        top = set(torch.argsort(scores, descending=True, stable=True)[:layout.n_high].tolist())
        high = [seq in top for seq in range(layout.total)]
    send_order = ([s for s in range(layout.total) if high[s]]
                  + [s for s in range(layout.total) if not high[s]])
    return Cut(layout, order, bodies, high, send_order)


def body_bytes(layout: Layout, seq: int) -> int:
    return layout.span(seq)[1] * layout.entry_bytes


def assemble(layout: Layout, bodies: dict[int, bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, int64 indices) of the datagrams in ``bodies`` (seq -> body), in seq order.

    Vectorised: the full datagrams' bodies are joined into one (datagrams, body) byte matrix
    whose columns split into values and indices; only a short last datagram is done alone."""
    size = layout.entry_bytes - (INDEX_BYTES if layout.sparse else 0)
    seqs = sorted(bodies)
    full = [s for s in seqs if layout.span(s)[1] == layout.per_datagram]
    values, indices = [], []
    if full:
        per = layout.per_datagram
        matrix = torch.frombuffer(bytearray(b"".join(bodies[s] for s in full)),
                                  dtype=torch.uint8).view(len(full), per * layout.entry_bytes)
        # clone: a fresh, aligned buffer (a one-row slice would keep the row's stride)
        values.append(matrix[:, :per * size].reshape(-1).clone().view(layout.dtype))
        if layout.sparse:
            indices.append(matrix[:, per * size:].reshape(-1).clone().view(torch.int32)
                           .to(torch.int64))
        else:
            starts = torch.tensor(full, dtype=torch.int64).unsqueeze(1) * per
            indices.append((starts + torch.arange(per)).reshape(-1))
    for seq in seqs[len(full):]:  # a short last datagram (seq total - 1) comes last
        offset, count = layout.span(seq)
        body = bodies[seq]
        values.append(torch.frombuffer(bytearray(body[:count * size]), dtype=layout.dtype))
        if layout.sparse:
            indices.append(torch.frombuffer(bytearray(body[count * size:]),
                                            dtype=torch.int32).to(torch.int64))
        else:
            indices.append(torch.arange(offset, offset + count, dtype=torch.int64))
    if not values:
        return torch.zeros(0, dtype=layout.dtype), torch.zeros(0, dtype=torch.int64)
    return torch.cat(values), torch.cat(indices)


def entries_of(cut_: Cut, seqs) -> torch.Tensor:
    """Original positions (in the caller's payload) of the entries in datagrams ``seqs``."""
    layout = cut_.layout
    spans = [torch.arange(*_bounds(layout, seq)) for seq in sorted(seqs)]
    positions = torch.cat(spans) if spans else torch.zeros(0, dtype=torch.int64)
    return cut_.order[positions] if cut_.order is not None else positions


def _bounds(layout: Layout, seq: int) -> tuple[int, int]:
    offset, count = layout.span(seq)
    return offset, offset + count
