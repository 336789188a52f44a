"""Pieces LARS and LAMB share: input checks, gathering the tensors of a group, trust ratios."""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor


def check_number(name: str, value: object, *, low: float = 0.0, high: float | None = None,
                 high_open: bool = False) -> float:
    """`value` as a float, or a clear error: `lr must be >= 0, got -1`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not value >= low:  # also catches NaN
        raise ValueError(f"{name} must be >= {low:g}, got {value:g}")
    if not math.isfinite(value):  # an infinite lr or decay turns every weight into inf/NaN
        raise ValueError(f"{name} must be a finite number, got {value:g}")
    if high is not None and (value >= high if high_open else value > high):
        bracket = ")" if high_open else "]"
        raise ValueError(f"{name} must be in [{low:g}, {high:g}{bracket}, got {value:g}")
    return value


def resolve_foreach(foreach: object) -> bool:
    """`foreach=None` means the fused path: it is the faster one on CPU and on CUDA."""
    if foreach is None:
        return True
    if not isinstance(foreach, bool):
        raise TypeError(f"foreach must be True, False or None, got {foreach!r}")
    return foreach


def params_with_grads(optimizer_name: str, group_index: int, group: dict
                      ) -> tuple[list[Tensor], list[Tensor]]:
    """The parameters of `group` that have a gradient, and those gradients.

    A loop over parameters for bookkeeping only (as torch.optim does): no tensor math, no
    host synchronisation. Sparse gradients are refused here, before any state changes.
    """
    params, grads = [], []
    for index, p in enumerate(group["params"]):
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise TypeError(
                f"{optimizer_name} does not support sparse gradients: parameter {index} of "
                f"param group {group_index} (shape {tuple(p.shape)}) has a sparse gradient; "
                "use a dense gradient (e.g. nn.Embedding(sparse=False))")
        params.append(p)
        grads.append(p.grad)
    return params, grads


def norm_dtype(dtype: torch.dtype) -> torch.dtype:
    """Norms and trust ratios in fp32 at least: bf16/fp16 norms are too coarse."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def trust_ratio(numerator: Tensor, denominator: Tensor, w_norm: Tensor, u_norm: Tensor) -> Tensor:
    """`numerator / denominator` where both norms are > 0, else 1; elementwise.

    Works on 0-d tensors (per-tensor path) and on stacked vectors of norms (fused path) alike;
    `torch.where` keeps the decision on the device: no `.item()`, no host synchronisation.
    """
    both_positive = (w_norm > 0) & (u_norm > 0)
    return torch.where(both_positive, numerator / denominator, torch.ones_like(w_norm))


# On CPU a `_foreach_*` op runs its tensors one after another, so one op streams the whole list
# through memory before the next op starts; with ~6 ops per step a list larger than the cache is
# read from DRAM ~6 times. Cutting the list into chunks of about this many elements (w, g and
# the state of a chunk: ~1.5 MB in fp32, within one core's L2) keeps a chunk in cache across
# all the ops. On CUDA one chunk is the whole bucket: multi_tensor_apply fuses the list.
CPU_CHUNK_ELEMENTS = 1 << 17


def chunks(tensors: list[Tensor], device: torch.device) -> list[slice]:
    """Consecutive slices of `tensors` to update one after another (see CPU_CHUNK_ELEMENTS).

    Reads only sizes (metadata), never values: no host synchronisation.
    """
    if device.type != "cpu":
        return [slice(0, len(tensors))]
    slices, start, size = [], 0, 0
    for i, t in enumerate(tensors):
        size += t.numel()
        if size >= CPU_CHUNK_ELEMENTS:
            slices.append(slice(start, i + 1))
            start, size = i + 1, 0
    if start < len(tensors):
        slices.append(slice(start, len(tensors)))
    return slices
