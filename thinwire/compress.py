"""What is sent: dense casts for the wire, and top-k packed into one buffer.

Pure functions from a flat tensor to a payload and back. Top-k values and their indices travel
in one byte buffer, so that a sparse exchange is one collective, not two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from thinwire import topk

WIRE_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def wire_dtype(name: str | None) -> torch.dtype | None:
    """The dtype dense parts travel in (None: the gradient's own)."""
    key = "none" if name is None else name
    if key not in WIRE_DTYPES:
        raise ValueError(f"wire must be one of {', '.join(WIRE_DTYPES)}, got {name!r}")
    return WIRE_DTYPES[key]


def to_wire(flat: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return flat if dtype is None or flat.dtype == dtype else flat.to(dtype)


@dataclass
class TopK:
    """Top-k compressor: ``k = ceil(density * numel)`` entries chosen by ``selector``."""

    density: float
    selector: str = "auto"
    options: dict = field(default_factory=dict)
    # per key (a bucket): (numel, threshold, factor) carried to its next selection; see select
    hints: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self.density = topk.validate_density(self.density)
        if self.selector not in topk.METHODS:
            raise ValueError(
                f"selector must be one of {', '.join(topk.METHODS)}, got {self.selector!r}")
        topk.check_selector_options(self.selector, self.options)

    def k(self, numel: int) -> int:
        return topk.k_unchecked(numel, self.density)  # density was checked in __post_init__

    def select(self, flat: torch.Tensor, key=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k of ``flat``. With a ``key`` (the bucket) and the "mstopk-carry" selector, the
        k-th magnitude of the key's last selection, lowered by a factor, is tried first as the
        threshold (:func:`thinwire.topk.top_k_above`: one pass, the exact top-k); the search
        runs only where that threshold keeps fewer than k or too many entries. The factor
        adapts so that about 1.2-1.6 k entries pass.

        Not the library's default (a selector the user picks), but both of compare's
        workloads use it: it cut the selection on MNIST from 44 to 17-19 ms a step, and on
        the LM, since a miss retries at a moved threshold before it searches, from 21-23 to
        9-10 ms (step 225 -> 212 ms; before the retry it made the LM step slower, 301 against
        245 ms; docs/benchmarks.md)."""
        numel, k = flat.numel(), self.k(flat.numel())
        if key is None or self.selector != "mstopk-carry" or k == numel:
            return topk.select(flat, k, self.selector, **self.options)
        hint = self.hints.get(key)
        factor = 0.9 if hint is None or hint[0] != numel else hint[2]
        values, moved = None, 1.0
        if hint is not None and hint[0] == numel and hint[1] > 0:
            for _ in range(CARRY_RETRIES + 1):
                values, indices, passed = topk.top_k_above(flat, k, hint[1] * moved)
                if values is not None:
                    break
                # A miss: one more pass at a moved threshold still costs a fraction of the
                # search (3.5 against 19 ms for 1.6M entries); misses were ~10% of steps on
                # compare's MNIST workload, mostly while the gradients shrink quickly.
                moved *= CARRY_RETRY_STEP if passed < k else 1 / CARRY_RETRY_STEP
        if values is None:
            values, indices = topk.select(flat, k, self.selector, **self.options)
            if hint is not None and hint[0] == numel:  # the hint missed: widen the margin
                factor = max(0.3, factor * 0.8)
        elif moved != 1.0:  # found on a retry: carry the margin that worked next time
            factor = min(0.99, max(0.3, factor * moved))
        else:
            if passed < 1.2 * k:  # close to a miss: a little more margin
                factor = max(0.3, factor * 0.95)
            elif passed > 1.6 * k:  # more than needed: tighten
                factor = min(0.99, factor * 1.05)
        kth = float(values.abs().min()) if values.numel() else 0.0
        self.hints[key] = (numel, kth * factor, factor)
        return values, indices


# mstopk-carry: where the carried threshold misses, retries at a threshold moved by this factor
# (down where too few entries passed, up where too many) before it searches.
CARRY_RETRIES, CARRY_RETRY_STEP = 1, 0.7

# The sparse wire: values in one of these dtypes, indices coded (below). The values' rounding
# error goes back to the error-feedback residual (see :func:`to_sparse_wire`). "fp32": the
# values travel as computed (the gradient's dtype: fp32 in fp32 training), never rounded.
SPARSE_WIRES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def sparse_wire_dtype(name: str) -> torch.dtype | None:
    """The dtype the sparse algorithms' selected values travel in."""
    if name not in SPARSE_WIRES:
        raise ValueError(f"sparse_wire must be one of {', '.join(SPARSE_WIRES)}, got {name!r}")
    return SPARSE_WIRES[name]


def to_sparse_wire(values: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``values`` as they travel: rounded to ``dtype`` (None, or one not narrower than the
    values': unchanged), clamped to its finite range (a float16 overflow would send an Inf;
    what the clamp leaves out goes back to the residual with the rounding error)."""
    if dtype is None or torch.finfo(values.dtype).bits <= torch.finfo(dtype).bits:
        return values
    top = torch.finfo(dtype).max
    return values.clamp(-top, top).to(dtype)


def index_dtype(numel: int) -> torch.dtype:
    """int32 indices halve the index bytes; int64 only where a bucket needs them."""
    return torch.int32 if numel <= torch.iinfo(torch.int32).max else torch.int64


# Index coding. Both codings are exact, of a size fixed by (k, numel) (so an all-gather needs
# no size exchange), and cheap to code with a handful of tensor operations; pack picks the
# smaller for the (k, numel) at hand, and unpack knows which from the same two numbers:
# * "chunks": the indices sorted, cut into chunks of 65536 positions; per chunk its count
#   (int32) and each index's offset inside it (16 bits): 2 bytes an entry + 4 a chunk, against
#   4 for int32 indices. Smaller than the bitmap below a density of 1/16.
# * "bitmap": one bit per position (numel / 8 bytes), the values in index order: smaller
#   above 1/16 (a density warm-up's first steps, small buckets at high density).
# Delta coding with variable-length integers would take ~1 byte an entry at 5% density, but its
# size depends on the data (padding or a size exchange for the all-gather) and it needs a
# sequential decoder; these two are fixed-size and vectorised.
_CHUNK = 1 << 16
_BITS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def index_coding(k: int, numel: int) -> str:
    """"chunks" or "bitmap": the smaller coding of k indices below numel."""
    chunks = -(-numel // _CHUNK)
    return "bitmap" if -(-numel // 8) < 4 * chunks + 2 * k else "chunks"


def _index_bytes(k: int, numel: int) -> int:
    if index_coding(k, numel) == "bitmap":
        return -(-numel // 8)
    return 4 * -(-numel // _CHUNK) + 2 * k


_ALIGN = 8  # each section starts at a multiple of 8 bytes, so the views need no copies


def _aligned(nbytes: int) -> int:
    return nbytes + (-nbytes) % _ALIGN


def _section_sizes(k: int, value_dtype: torch.dtype, numel: int) -> tuple[int, int]:
    value_size = torch.empty((), dtype=value_dtype).element_size()
    return _aligned(_index_bytes(k, numel)), _aligned(k * value_size)


def _encode_indices(out: torch.Tensor, indices: torch.Tensor, numel: int) -> None:
    """Writes the coded ``indices`` (sorted, unique, < numel) into the uint8 ``out``."""
    k = indices.numel()
    if index_coding(k, numel) == "bitmap":
        mask = torch.zeros(_aligned(numel), dtype=torch.uint8, device=indices.device)
        mask[indices] = 1
        bits = mask.view(-1, 8) * _BITS.to(indices.device)
        out[:-(-numel // 8)] = bits.sum(1, dtype=torch.uint8)[:-(-numel // 8)]
        return
    chunks = -(-numel // _CHUNK)
    counts = torch.bincount(indices >> 16, minlength=chunks).to(torch.int32)
    out[:4 * chunks] = counts.view(torch.uint8)
    # int32 -> int16 keeps the low 16 bits (two's complement); decoding masks them back
    offsets = (indices & (_CHUNK - 1)).to(torch.int32).to(torch.int16)
    out[4 * chunks:4 * chunks + 2 * k] = offsets.view(torch.uint8)


def _decode_indices(section: torch.Tensor, k: int, numel: int) -> torch.Tensor:
    if index_coding(k, numel) == "bitmap":
        raw = section[:-(-numel // 8)]
        bits = (raw.unsqueeze(1) & _BITS.to(raw.device)) != 0
        return torch.nonzero(bits.view(-1)).squeeze(1)
    chunks = -(-numel // _CHUNK)
    counts = section[:4 * chunks].view(torch.int32).to(torch.int64)
    offsets = section[4 * chunks:4 * chunks + 2 * k].view(torch.int16).to(torch.int64)
    bases = torch.repeat_interleave(torch.arange(chunks, device=section.device) * _CHUNK,
                                    counts, output_size=k)
    return bases + (offsets & (_CHUNK - 1))


def pack(values: torch.Tensor, indices: torch.Tensor, numel: int) -> torch.Tensor:
    """Coded indices then values (in their own dtype: round them first with
    :func:`to_sparse_wire`) in one uint8 buffer, each section zero-padded to 8 bytes. The
    entries travel in index order (both codings need it); unique indices below ``numel``."""
    k = values.numel()
    index_bytes, value_bytes = _section_sizes(k, values.dtype, numel)
    buffer = torch.zeros(index_bytes + value_bytes, dtype=torch.uint8, device=values.device)
    if k == 0:
        return buffer
    indices, values = indices.reshape(-1).to(torch.int64), values.reshape(-1)
    if k > 1 and not bool((indices[1:] > indices[:-1]).all()):  # selectors may give any order
        indices, order = torch.sort(indices)
        values = values[order]
    _encode_indices(buffer[:index_bytes], indices, numel)
    raw_value = values.contiguous().view(torch.uint8)
    buffer[index_bytes:index_bytes + raw_value.numel()] = raw_value
    return buffer


def unpack(buffer: torch.Tensor, k: int, value_dtype: torch.dtype, numel: int):
    """Inverse of :func:`pack` for one rank's buffer: (values in ``value_dtype``, int64
    indices, ascending)."""
    index_bytes, _ = _section_sizes(k, value_dtype, numel)
    if k == 0:
        return (torch.empty(0, dtype=value_dtype, device=buffer.device),
                torch.empty(0, dtype=torch.int64, device=buffer.device))
    indices = _decode_indices(buffer[:index_bytes], k, numel)
    values = buffer[index_bytes:].view(value_dtype)[:k]
    return values, indices


def packed_bytes(k: int, value_dtype: torch.dtype, numel: int) -> int:
    """Bytes one rank's :func:`pack` buffer takes on the wire."""
    return sum(_section_sizes(k, value_dtype, numel))
