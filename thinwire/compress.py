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
    selector: str = "mstopk"
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        self.density = topk.validate_density(self.density)
        if self.selector not in topk.METHODS:
            raise ValueError(
                f"selector must be one of {', '.join(topk.METHODS)}, got {self.selector!r}")

    def k(self, numel: int) -> int:
        return topk.k_unchecked(numel, self.density)  # density was checked in __post_init__

    def select(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return topk.select(flat, self.k(flat.numel()), self.selector, **self.options)


def index_dtype(numel: int) -> torch.dtype:
    """int32 indices halve the index bytes; int64 only where a bucket needs them."""
    return torch.int32 if numel <= torch.iinfo(torch.int32).max else torch.int64


_ALIGN = 8  # each section starts at a multiple of 8 bytes, so the views need no copies


def _aligned(nbytes: int) -> int:
    return nbytes + (-nbytes) % _ALIGN


def _section_sizes(k: int, value_dtype: torch.dtype, numel: int) -> tuple[int, int]:
    index_size = torch.empty((), dtype=index_dtype(numel)).element_size()
    value_size = torch.empty((), dtype=value_dtype).element_size()
    return _aligned(k * index_size), _aligned(k * value_size)


def pack(values: torch.Tensor, indices: torch.Tensor, numel: int) -> torch.Tensor:
    """Indices then values in one uint8 buffer, each section zero-padded to 8 bytes."""
    k = values.numel()
    index_bytes, value_bytes = _section_sizes(k, values.dtype, numel)
    buffer = torch.zeros(index_bytes + value_bytes, dtype=torch.uint8, device=values.device)
    raw_index = indices.to(index_dtype(numel)).contiguous().view(torch.uint8)
    raw_value = values.contiguous().view(torch.uint8)
    buffer[:raw_index.numel()] = raw_index
    buffer[index_bytes:index_bytes + raw_value.numel()] = raw_value
    return buffer


def unpack(buffer: torch.Tensor, k: int, value_dtype: torch.dtype, numel: int):
    """Inverse of :func:`pack` for one rank's buffer; indices come back as int64."""
    index_bytes, _ = _section_sizes(k, value_dtype, numel)
    idx_type = index_dtype(numel)
    indices = buffer[:index_bytes].view(idx_type)[:k]
    values = buffer[index_bytes:].view(value_dtype)[:k]
    return values, indices.to(torch.int64)


def packed_bytes(k: int, value_dtype: torch.dtype, numel: int) -> int:
    """Bytes one rank's :func:`pack` buffer takes on the wire."""
    return sum(_section_sizes(k, value_dtype, numel))
