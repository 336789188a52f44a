"""Chunked top-k with quantised values: the compressor of SparseLoCo-style outer exchanges.

A flat tensor is cut into chunks of ``chunk`` elements (the last one zero-padded); in every
chunk the ``k`` entries of largest magnitude are kept. Their indices within the chunk travel as
int16 (chunk <= 32768), their values either as float32 (``bits=None``) or quantised to ``bits``
bits (2, 4 or 8): a sign bit and ``2**(bits-1)`` magnitude levels ``scale * (j+1) / L`` per
chunk, ``scale`` the chunk's largest selected magnitude (sent as float32). Per kept entry that
is 2 + bits/8 bytes instead of top-k's 4 + 4 (float32 value, int32 index over a large shard),
so the same bytes carry several times the entries.

:func:`compress` returns what was sent *as the receiver decodes it*, so the caller's residual
``corrected - sent`` keeps the quantisation error as well as the unselected entries (sent +
kept = corrected, exactly up to one rounding of the subtraction).
"""

from __future__ import annotations

import math

import torch

BITS = (2, 4, 8)
MAX_CHUNK = 32768  # indices within a chunk travel as int16


def check(density: float, chunk: int, bits: int | None) -> None:
    """Clear errors naming the setting."""
    if not (isinstance(density, (int, float)) and not isinstance(density, bool)
            and math.isfinite(density) and 0 < density <= 1):
        raise ValueError(f"density must be a number in (0, 1], got {density!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(f"chunk must be an int in [1, {MAX_CHUNK}], got {chunk!r}")
    if bits is not None and bits not in BITS:
        raise ValueError(f"bits must be None (float32 values) or one of "
                         f"{', '.join(map(str, BITS))}, got {bits!r}")


def k_per_chunk(density: float, chunk: int) -> int:
    return max(1, min(chunk, round(density * chunk)))


def payload_bytes(numel: int, density: float, chunk: int, bits: int | None) -> int:
    """Bytes of :func:`compress`'s payload for ``numel`` elements (what one rank sends)."""
    chunks, k = -(-numel // chunk), k_per_chunk(density, chunk)
    values = chunks * k * 4 if bits is None else -(-chunks * k * bits // 8)
    return chunks * k * 2 + values + (0 if bits is None else chunks * 4)


def _quantise(values: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [chunks, k], scale float32 [chunks], the decoded values)."""
    levels = 1 << (bits - 1)
    magnitude = values.abs()
    scale = magnitude.amax(dim=1).to(torch.float32)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)).to(values.dtype)
    level = (magnitude / safe[:, None] * levels).round().clamp(1, levels) - 1
    negative = (values < 0).to(torch.uint8)
    codes = level.to(torch.uint8) | (negative << (bits - 1))
    return codes, scale, _dequantise(codes, scale, bits, values.dtype)


def _dequantise(codes: torch.Tensor, scale: torch.Tensor, bits: int, dtype) -> torch.Tensor:
    levels = 1 << (bits - 1)
    level = (codes & (levels - 1)).to(dtype) + 1
    sign = 1 - 2 * ((codes >> (bits - 1)) & 1).to(dtype)
    return sign * level * (scale.to(dtype)[:, None] / levels)


def _pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    flat = codes.reshape(-1)
    per_byte = 8 // bits
    flat = torch.cat([flat, flat.new_zeros((-flat.numel()) % per_byte)])
    grouped = flat.view(-1, per_byte).to(torch.int32)
    shifts = torch.arange(per_byte, dtype=torch.int32, device=codes.device) * bits
    return (grouped << shifts).sum(dim=1).to(torch.uint8)


def _unpack_bits(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    per_byte = 8 // bits
    shifts = torch.arange(per_byte, dtype=torch.int32, device=packed.device) * bits
    codes = (packed.to(torch.int32)[:, None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:count].to(torch.uint8)


def compress(flat: torch.Tensor, density: float, chunk: int, bits: int | None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(payload uint8, what was sent as a dense tensor like ``flat``)."""
    numel = flat.numel()
    chunks, k = -(-numel // chunk), k_per_chunk(density, chunk)
    grid = torch.zeros(chunks * chunk, dtype=flat.dtype, device=flat.device)
    grid[:numel] = flat
    grid = grid.view(chunks, chunk)
    index = grid.abs().topk(k, dim=1, sorted=False).indices
    values = grid.gather(1, index)
    parts = [index.to(torch.int16).reshape(-1).view(torch.uint8)]
    if bits is None:
        sent_values = values.to(torch.float32).to(values.dtype)  # as the receiver reads it
        parts.append(values.to(torch.float32).reshape(-1).view(torch.uint8))
    else:
        codes, scale, sent_values = _quantise(values, bits)
        parts += [_pack_bits(codes, bits), scale.view(torch.uint8)]
    sent = torch.zeros_like(grid).scatter_(1, index, sent_values)
    return torch.cat(parts), sent.view(-1)[:numel]


def decompress(payload: torch.Tensor, numel: int, density: float, chunk: int,
               bits: int | None, dtype=torch.float32) -> torch.Tensor:
    """The dense tensor of ``numel`` elements that ``payload`` encodes."""
    chunks, k = -(-numel // chunk), k_per_chunk(density, chunk)
    n_index = chunks * k * 2
    # slices are copied before a dtype view: a view needs an offset aligned to the new dtype
    index = payload[:n_index].clone().view(torch.int16).to(torch.int64).view(chunks, k)
    rest = payload[n_index:]
    if bits is None:
        values = rest[:chunks * k * 4].clone().view(torch.float32).to(dtype).view(chunks, k)
    else:
        n_codes = -(-chunks * k * bits // 8)
        codes = _unpack_bits(rest[:n_codes], bits, chunks * k).view(chunks, k)
        scale = rest[n_codes:n_codes + chunks * 4].clone().view(torch.float32)
        values = _dequantise(codes, scale, bits, dtype)
    dense = torch.zeros(chunks, chunk, dtype=dtype, device=payload.device)
    dense.scatter_(1, index, values)
    return dense.view(-1)[:numel]
