"""SyncState, compressors and error feedback without a process group."""

from __future__ import annotations

import pickle
import re

import pytest
import torch

from thinwire import compress
from thinwire.feedback import ErrorFeedback
from thinwire.state import SyncState
from thinwire.sync import buckets


def test_unknown_algorithm_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="algorithm must be one of allreduce, hier_allreduce, "
                                         "dlcp, hitopk, oktopk, topk_a2a, topk_allgather, "
                                         "got 'ring'"):
        SyncState(None, "ring")


@pytest.mark.parametrize("density", [0.0, 1.5, -1.0])
def test_density_outside_unit_interval(density):
    with pytest.raises(ValueError, match=r"density must be in \(0, 1\]"):
        SyncState(None, "hitopk", density)


def test_unknown_selector_and_wire_dtype():
    with pytest.raises(ValueError, match="selector must be one of auto, mstopk, mstopk-carry, exact, sampled"):
        SyncState(None, "hitopk", 0.01, selector="sort")
    with pytest.raises(ValueError, match="wire must be one of none, fp16, bf16, got 'int8'"):
        SyncState(None, "allreduce", wire="int8")


def test_non_float_gradients_are_rejected():
    state = SyncState(object(), "allreduce")
    with pytest.raises(TypeError, match="gradients must have a floating dtype, got torch.int64"):
        state.reduce(0, torch.ones(4, dtype=torch.int64))


def test_a_state_loaded_from_a_checkpoint_asks_for_its_topology():
    state = pickle.loads(pickle.dumps(SyncState(None, "hitopk")))
    with pytest.raises(RuntimeError, match="call state.attach"):
        state.reduce(0, torch.ones(4))


def test_state_dict_of_another_algorithm_is_refused():
    saved = SyncState(None, "hitopk", 0.01).state_dict()
    with pytest.raises(ValueError, match="differs from this SyncState in algorithm"):
        SyncState(None, "topk_allgather", 0.01).load_state_dict(saved)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("k", [1, 3, 8, 13])
@pytest.mark.parametrize("numel", [100, 2**31 + 1])
def test_pack_unpack_round_trip_with_aligned_blocks(dtype, k, numel):
    values = torch.randn(k).to(dtype)
    indices = torch.randperm(99)[:k]  # unique, as a selection's are
    blocks = [compress.pack(values * (j + 1), indices + j, numel) for j in range(3)]
    assert all(b.numel() == compress.packed_bytes(k, dtype, numel) for b in blocks)
    assert compress.packed_bytes(k, dtype, numel) % 8 == 0
    gathered = torch.cat(blocks)
    order = torch.argsort(indices)  # the entries travel in index order
    for j, chunk in enumerate(gathered.chunk(3)):
        got_values, got_indices = compress.unpack(chunk, k, dtype, numel)
        assert torch.equal(got_values, (values * (j + 1))[order])
        assert torch.equal(got_indices, (indices + j)[order])


def test_error_feedback_adds_keeps_and_resets_on_a_new_layout():
    feedback = ErrorFeedback()
    c = feedback.add_residual(0, torch.tensor([1.0, 2.0, 3.0]))
    feedback.keep(0, c, torch.tensor([1]))
    assert torch.equal(feedback.residuals[0], torch.tensor([1.0, 0.0, 3.0]))
    again = feedback.add_residual(0, torch.ones(3))
    assert torch.equal(again, torch.tensor([2.0, 1.0, 4.0]))
    feedback.layout = (2, 3)  # the bucket now holds other parameters
    assert torch.equal(feedback.add_residual(0, torch.ones(3)), torch.ones(3))
    assert torch.equal(feedback.add_residual(0, torch.ones(5)), torch.ones(5))


def test_disabled_error_feedback_keeps_nothing():
    feedback = ErrorFeedback(enabled=False)
    c = feedback.add_residual(0, torch.ones(3))
    feedback.keep(0, c, torch.tensor([0]))
    assert feedback.residuals == {}


def test_buckets_follow_ddp_reverse_order_and_split_by_size_and_dtype():
    params = [torch.zeros(10), torch.zeros(10), torch.zeros(10, dtype=torch.float64),
              torch.zeros(30)]
    groups = buckets(params, bucket_bytes=80)
    assert [[p.numel() for p in g] for g in groups] == [[30], [10], [10, 10]]
    assert groups[1][0].dtype == torch.float64


def test_momentum_correction_velocity_masking_and_state_dict():
    """DGC: u = m u + g; selected = residual + u; both zeroed where sent; survives state_dict."""
    from thinwire.feedback import ErrorFeedback

    fb = ErrorFeedback(True, momentum=0.5)
    g1, g2 = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 1.0, 1.0])
    c = fb.add_residual(0, g1.clone())
    assert torch.equal(c, g1)  # first step: u = g, no residual
    fb.keep(0, c, torch.tensor([2]))  # sent entry 2
    assert torch.equal(fb.residuals[0], torch.tensor([1.0, 2.0, 0.0]))
    assert torch.equal(fb.velocities[0], torch.tensor([1.0, 2.0, 0.0]))
    c = fb.add_residual(0, g2.clone())
    # u = 0.5 * [1, 2, 0] + 1 = [1.5, 2, 1]; plus residual [1, 2, 0]
    assert torch.equal(c, torch.tensor([2.5, 4.0, 1.0]))
    fb.keep(0, c, torch.tensor([1]))
    restored = ErrorFeedback()
    restored.load_state_dict(fb.state_dict())
    assert restored.momentum == 0.5
    assert torch.equal(restored.velocities[0], torch.tensor([1.5, 0.0, 1.0]))
    assert torch.equal(restored.residuals[0], torch.tensor([2.5, 0.0, 1.0]))


@pytest.mark.parametrize("momentum", [-0.1, 1.0, "0.9"])
def test_momentum_correction_out_of_range(momentum):
    with pytest.raises(ValueError, match="momentum_correction must be a number in \\[0, 1\\)"):
        SyncState(None, "hitopk", momentum_correction=momentum)


def test_momentum_correction_needs_a_sparse_algorithm():
    with pytest.raises(ValueError, match="momentum_correction needs a sparse algorithm"):
        SyncState(None, "allreduce", momentum_correction=0.9)


@pytest.mark.parametrize("setting, value, message", [
    ("dense_iterations", True, "dense_iterations must be an int >= 0, got True"),
    ("dense_iterations", -1, "dense_iterations must be an int >= 0, got -1"),
    ("weight_decay", float("inf"), "weight_decay must be a finite number >= 0.0, got inf"),
    ("weight_decay", -0.1, "weight_decay must be a finite number >= 0.0, got -0.1"),
    ("dense_below_bytes", 1.5, "dense_below_bytes must be an int >= 0, got 1.5"),
    ("nonfinite", "ignore", "nonfinite must be one of raise, skip, got 'ignore'"),
    ("error_feedback", "yes", "error_feedback must be True or False, got 'yes'"),
])
def test_every_setting_is_checked_where_it_enters(setting, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SyncState(None, "hitopk", **{setting: value})


@pytest.mark.parametrize("settings, message", [
    (dict(density_warmup_steps=-2), "density_warmup_steps must be an int >= 0, got -2"),
    (dict(density_warmup_steps=4, density_warmup_from=0.001),
     "density_warmup_from must be a number in [density, 1] (density=0.01), got 0.001"),
    (dict(density_warmup_steps=4, density_warmup_from=1.5),
     "density_warmup_from must be a number in [density, 1] (density=0.01), got 1.5"),
    (dict(algorithm="allreduce", density_warmup_steps=4),
     "density_warmup_steps applies to the sparse algorithms"),
])
def test_density_warmup_settings_are_checked(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SyncState(None, **{"algorithm": "hitopk", **settings})


def test_density_warmup_falls_exponentially_after_the_dense_steps():
    state = SyncState(None, "hitopk", 0.01, dense_iterations=2, density_warmup_steps=4,
                      density_warmup_from=0.16)
    got = [state.density_at(step) for step in range(8)]
    # dense steps 0-1 (density unused), then 0.16 * (1/16) ** (t/4): 0.16, 0.08, 0.04, 0.02
    assert got[2:] == pytest.approx([0.16, 0.08, 0.04, 0.02, 0.01, 0.01])
    assert state.settings["density_warmup_steps"] == 4
    assert SyncState(None, "hitopk", 0.5).density_at(0) == 0.5  # no warm-up: the density


def test_dense_warmup_is_refused_for_a_dense_algorithm():
    with pytest.raises(ValueError, match="dense_iterations applies to the sparse algorithms"):
        SyncState(None, "allreduce", dense_iterations=3)


def test_state_dict_holds_every_setting():
    state = SyncState(None, "hitopk", 0.05, "exact", wire="bf16", momentum_correction=0.9,
                      dense_iterations=2, weight_decay=1e-4, nonfinite="skip")
    saved = state.state_dict()
    assert {k: saved[k] for k in state.settings} == state.settings
    assert saved["wire"] == "bf16" and saved["dense_iterations"] == 2
    restored = SyncState(None, "hitopk", 0.05, "exact", momentum_correction=0.9)
    restored.load_state_dict(saved)
    assert restored.steps == 0
    with pytest.raises(ValueError, match=r"steps must be an int >= 0, got -7"):
        restored.load_state_dict({**saved, "steps": -7})


def test_the_finite_check_is_exact_also_where_the_fast_sum_overflows():
    from thinwire.state import _all_finite

    assert _all_finite(torch.full((10,), 3e38))  # the sum overflows; every entry is finite
    assert _all_finite(torch.randn(1000, dtype=torch.float64))
    assert not _all_finite(torch.tensor([1.0, float("nan")]))
    assert not _all_finite(torch.tensor([float("inf"), -float("inf")]))  # the sum is NaN
    assert not _all_finite(torch.tensor([3e38, 3e38, float("inf")], dtype=torch.float32))
