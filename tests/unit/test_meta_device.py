"""Compression code that must run wherever the gradient lives: run on the ``meta`` device
(shapes and dtypes, no data), where a tensor made on the CPU and mixed in fails just as it
would on a GPU. (A GPU run of the same code is the `device` tool's, when one is lent.)

Covered: SparseLoCo's chunked top-k with its 2/4/8-bit packing (its bit shifts were made on
the CPU: "Tensor on device cpu is not on the expected device meta", a crash on CUDA too), its
outer step on a shard, the wire casts, error feedback (residuals, momentum correction, the
dense path's momentum), and the hook's non-finite check, which must stay on the device (a host
read there would hold the autograd thread on CUDA). Not coverable on ``meta``: the selectors
and `compress.pack`, which read values on the host (a threshold search, an order check); on
CUDA those reads run on the hook's worker thread, off the autograd thread (thinwire.ddp).
"""

import pytest
import torch

from thinwire import compress
from thinwire.feedback import ErrorFeedback
from thinwire.state import SyncState
from thinwire.local_sgd import chunked, sparse_outer

META = torch.device("meta")


@pytest.mark.parametrize("bits", [None, 2, 4, 8])
def test_chunked_top_k_and_its_packing_stay_on_the_gradients_device(bits):
    x = torch.empty(10_000, device=META)
    payload, sent = chunked.compress(x, 0.05, 1024, bits)
    assert payload.device == META and payload.dtype == torch.uint8
    assert payload.numel() == chunked.payload_bytes(x.numel(), 0.05, 1024, bits)
    assert sent.device == META and sent.shape == x.shape
    dense = chunked.decompress(payload, x.numel(), 0.05, 1024, bits)
    assert dense.device == META and dense.shape == x.shape


def test_sparseloco_outer_step_on_a_shard_stays_on_its_device():
    shard = torch.empty(5_000, device=META)
    for residual in (None, torch.empty(5_000, device=META)):
        payload, sent, kept = sparse_outer.step_shard(residual, shard, 0.05, 1024, 2, 0.9)
        assert (payload.device, sent.device, kept.device) == (META, META, META)
        assert sent.shape == kept.shape == shard.shape


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_wire_casts_keep_the_device(name):
    x = torch.empty(100, device=META)
    assert compress.to_wire(x, compress.wire_dtype(name)).device == META
    assert compress.to_sparse_wire(x, compress.sparse_wire_dtype(name)).device == META


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_error_feedback_stays_on_the_gradients_device(momentum):
    feedback = ErrorFeedback(True, momentum)
    for _ in range(2):  # the second step finds a residual (and a velocity) kept on META
        corrected = feedback.add_residual(0, torch.empty(1000, device=META))
        assert corrected.device == META
        sent = torch.empty(10, dtype=torch.int64, device=META)
        feedback.keep(0, corrected, sent, torch.empty(10, dtype=torch.float16, device=META))
        assert feedback.residuals[0].device == META
    assert feedback.dense_momentum(1, torch.empty(50, device=META)).device == META


def test_the_non_finite_check_of_policy_raise_never_reads_the_host():
    """On ``meta`` any read of a value fails, so passing here means the check, the bucket's
    cleaning and the step's flag all stay on the device until end_step."""
    state = SyncState(None, "hitopk")
    flat = torch.empty(1000, device=META)
    for index in range(3):
        cleaned = state._note_nonfinite(index, flat)
        assert cleaned.device == META and cleaned.shape == flat.shape
    assert state._first_bad.device == META
