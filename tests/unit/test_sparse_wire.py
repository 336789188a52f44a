"""The compact sparse wire: coded indices round-trip exactly, values within their dtype's
rounding, and error feedback keeps the rounding error (applied + residual == corrected)."""

from __future__ import annotations

import math

import pytest
import torch

from thinwire import compress
from thinwire.feedback import ErrorFeedback
from thinwire.state import SyncState


@pytest.mark.parametrize("numel, k", [
    (1, 1), (100, 1), (100, 13), (100, 100), (65536, 65536), (65537, 2), (70000, 5000),
    (200_000, 10_000), (1_600_000, 80_000), (1_600_000, 400_000)])
def test_indices_round_trip_exactly_in_the_smaller_coding(numel, k):
    g = torch.Generator().manual_seed(numel + k)
    indices = torch.randperm(numel, generator=g)
    if numel > 65536:  # the chunk edges (the last and first position of a chunk) go first
        edges = torch.tensor([65535, 65536])
        indices = torch.cat([edges, indices[(indices != 65535) & (indices != 65536)]])
    indices = indices[:k]
    values = torch.randn(k, generator=g)
    buffer = compress.pack(values, indices, numel)
    chunks = math.ceil(numel / 65536)
    index_bytes = min(2 * k + 4 * chunks, math.ceil(numel / 8))
    assert buffer.numel() == compress.packed_bytes(k, torch.float32, numel) == \
        math.ceil(index_bytes / 8) * 8 + math.ceil(4 * k / 8) * 8
    got_values, got_indices = compress.unpack(buffer, k, torch.float32, numel)
    order = torch.argsort(indices)
    assert torch.equal(got_indices, indices[order])
    assert torch.equal(got_values, values[order])


def test_the_coding_is_chunks_below_a_sixteenth_and_a_bitmap_above():
    assert compress.index_coding(80_000, 1_600_000) == "chunks"  # 5%: 2 bytes an entry
    assert compress.index_coding(200_000, 1_600_000) == "bitmap"  # 12.5%: 1.6 bytes an entry
    # 5% of a 1.6M shard in fp16: 4 bytes an entry against 8 (int32 + fp32)
    assert compress.packed_bytes(80_000, torch.float16, 1_600_000) == 4 * 80_000 + 104


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_values_are_within_their_dtypes_rounding_and_clamped_finite(dtype):
    x = torch.randn(10_000, dtype=torch.float32) * torch.logspace(-6, 3, 10_000)
    # beyond the finite range: fp16 tops at 65504, bf16 at 3.39e38 (fp32 at 3.40e38)
    x[0], x[1] = 1e6, -3.4e38 if dtype == torch.bfloat16 else -1e6
    wire = compress.to_sparse_wire(x, dtype)
    assert wire.dtype == dtype and bool(torch.isfinite(wire).all())
    info = torch.finfo(dtype)
    inside = x.abs() <= info.max
    err = (wire.float() - x)[inside].abs()
    bound = torch.maximum(x[inside].abs() * info.eps / 2, torch.tensor(info.smallest_normal *
                                                                          info.eps / 2))
    assert bool((err <= bound).all())
    # never widened: fp16 values stay as they are under bf16 and fp32
    half = torch.randn(4).half()
    assert compress.to_sparse_wire(half, torch.float32) is half
    assert compress.to_sparse_wire(half, None) is half


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.float64])
def test_error_feedback_keeps_the_rounding_error_exactly(dtype, grad_dtype):
    """applied (the values as they travelled, widened) + residual == corrected, checked in
    float64 without tolerance, over steps."""
    feedback = ErrorFeedback()
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        grad = (torch.randn(5000, generator=g) * 10.0 ** (step - 2)).to(grad_dtype)
        corrected = feedback.add_residual(0, grad.clone())
        before = corrected.to(torch.float64).clone()
        _, indices = torch.topk(corrected.abs(), 250)
        sent = compress.to_sparse_wire(corrected[indices], dtype)
        feedback.keep(0, corrected, indices, sent)
        applied = torch.zeros(5000, dtype=torch.float64)
        applied[indices] = sent.to(torch.float64)
        assert torch.equal(applied + feedback.residuals[0].to(torch.float64), before)
        assert bool((feedback.residuals[0][indices] != 0).any())  # the rounding error was kept


def test_sparse_wire_is_checked_and_named():
    with pytest.raises(ValueError, match="sparse_wire must be one of fp32, fp16, bf16, got 'int8'"):
        SyncState(None, "hitopk", sparse_wire="int8")
    with pytest.raises(ValueError, match="sparse_wire='fp16' applies to the algorithms that send "
                                         "their own selection .*hitopk.*; 'oktopk'"):
        SyncState(None, "oktopk", sparse_wire="fp16")
    state = SyncState(None, "hitopk", sparse_wire="bf16")
    assert state.settings["sparse_wire"] == "bf16" and state.sparse_wire_dtype == torch.bfloat16
    assert SyncState(None, "hitopk").sparse_wire_dtype is None  # fp32: as computed
    import pickle
    assert pickle.loads(pickle.dumps(state)).sparse_wire_dtype == torch.bfloat16
