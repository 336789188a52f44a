"""Damaged, crafted and foreign training checkpoints: never code execution, never a silent
resume from a bad file, never a raw traceback; a fallback to the previous good checkpoint with a
warning naming the refused file, or a clear error when none is good."""

from __future__ import annotations

import logging

import pytest
import torch

from thinwire import safefile
from thinwire.train import checkpoint, train
from thinwire.train.checkpoint import NoUsableCheckpoint, previous_file, rank_file

import ckpt_helpers as H


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return H.make(tmp_path_factory.mktemp("ckpt") / "run")


@pytest.fixture
def run_dir(saved, tmp_path):
    return H.copy(saved, tmp_path / "run")


def _resume(directory, **changes):
    return train(H.config(resume=str(directory), checkpoint=str(directory), **changes))


def test_saved_files_are_plain_data_and_keyed(saved):
    current, previous = checkpoint.read(rank_file(saved, 0), 0), \
        checkpoint.read(previous_file(saved, 0), 0)
    assert (current["step"], previous["step"]) == (4, 2)
    with pytest.raises(safefile.CorruptFile, match="belongs to 'train/rank0', expected "
                                                   "'train/rank1'"):
        checkpoint.read(rank_file(saved, 0), 1)


@pytest.mark.parametrize("framed", [False, True], ids=["raw-pickle", "valid-checksum"])
def test_crafted_pickle_does_not_run(run_dir, tmp_path, framed):
    marker = tmp_path / "pwned"
    for path in (rank_file(run_dir, 0), previous_file(run_dir, 0)):
        (H.evil_framed if framed else H.evil_raw)(path, marker)
    with pytest.raises(NoUsableCheckpoint, match="no usable checkpoint") as err:
        _resume(run_dir)
    assert not marker.exists()
    assert "rank0.pt" in str(err.value)


def test_whatever_torch_load_raises_on_a_checksummed_payload_is_a_corrupt_file(saved,
                                                                               monkeypatch):
    # the checksum has no key: an edited payload's can be recomputed, and torch.load then
    # raised KeyError, IndexError or AssertionError, which ended the rank before the
    # agreement on a step instead of falling back to the previous file
    data = rank_file(saved, 0).read_bytes()
    for error in (KeyError(275870735), IndexError("list index"), AssertionError()):
        def load(*args, error=error, **kwargs):
            raise error
        monkeypatch.setattr(torch, "load", load)
        with pytest.raises(safefile.CorruptFile, match="payload is not plain tensors"):
            safefile.decode(data, checkpoint.MAGIC, "rank0.pt")


FALLBACK_CASES = list(H.damages())


@pytest.mark.parametrize("case", FALLBACK_CASES)
def test_damaged_newest_falls_back_to_previous(run_dir, case, caplog):
    damage, reason = H.damages()[case]
    damage(rank_file(run_dir, 0))
    module, opt = _model_and_optimizer()
    with caplog.at_level(logging.WARNING):
        payload = checkpoint.load(run_dir, 0, H.config(), 1, steps_per_epoch=_steps(),
                                  check=_check(module, opt),
                                  max_bytes=checkpoint.size_limit(module))
    assert payload["step"] == 2  # the previous checkpoint, not the damaged one
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert str(rank_file(run_dir, 0)) in warned and reason in warned


@pytest.mark.parametrize("case", ["flipped-bytes", "truncated", "position-1e9", "model-shape"])
def test_both_damaged_is_a_clear_error(run_dir, case):
    damage, reason = H.damages()[case]
    damage(rank_file(run_dir, 0))
    damage(previous_file(run_dir, 0))
    module, opt = _model_and_optimizer()
    with pytest.raises(NoUsableCheckpoint) as err:
        checkpoint.load(run_dir, 0, H.config(), 1, steps_per_epoch=_steps(),
                        check=_check(module, opt))
    assert reason in str(err.value) and str(previous_file(run_dir, 0)) in str(err.value)


def test_resume_after_fallback_trains_from_the_previous_step(run_dir, tmp_path):
    H.flip_bytes(rank_file(run_dir, 0))
    out = _resume(run_dir)
    straight = train(H.config(checkpoint=str(tmp_path / "straight")))
    assert out["steps"] == straight["steps"] == 6
    a = checkpoint.read(rank_file(run_dir, 0), 0)["model"]
    b = checkpoint.read(rank_file(tmp_path / "straight", 0), 0)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)  # resumed exactly from step 2


def test_orphaned_temp_files_are_removed_on_open_and_on_save(run_dir):
    orphan = run_dir / ".rank0.pt.12345.tmp"
    orphan.write_bytes(bytes(1000))
    other = run_dir / ".rank1.pt.12345.tmp"  # another rank's: not ours to delete
    other.write_bytes(b"x")
    module, opt = _model_and_optimizer()
    checkpoint.load(run_dir, 0, H.config(), 1, steps_per_epoch=_steps(), check=_check(module, opt))
    assert not orphan.exists() and other.exists()
    orphan.write_bytes(bytes(1000))
    checkpoint.save(run_dir, 0, checkpoint.read(rank_file(run_dir, 0), 0))
    assert not orphan.exists()
    assert checkpoint.read(previous_file(run_dir, 0), 0)["step"] == 4  # the replaced one kept


def test_kill_between_renames_leaves_a_loadable_previous(run_dir):
    rank_file(run_dir, 0).replace(previous_file(run_dir, 0))  # the state after the first rename
    module, opt = _model_and_optimizer()
    payload = checkpoint.load(run_dir, 0, H.config(), 1, steps_per_epoch=_steps(),
                              check=_check(module, opt))
    assert payload["step"] == 4


_steps, _model_and_optimizer, _check = H.steps_per_epoch, H.model_and_optimizer, H.fits


def test_powersgd_generator_round_trips_and_bad_state_is_refused():
    import numpy as np

    from thinwire.train.checkpoint_checks import CheckpointMismatch, rng_from_plain, rng_to_plain
    rng = np.random.RandomState(7)
    rng.standard_normal(5)  # leaves a cached Gaussian behind
    plain = rng_to_plain(rng)
    again = rng_from_plain(plain)
    assert np.array_equal(again.standard_normal(9), rng.standard_normal(9))
    for change in ({"pos": 10 ** 6}, {"keys": torch.zeros(3, dtype=torch.int64)},
                   {"bit_generator": "PCG64"}, {"cached_gaussian": "x"}):
        with pytest.raises(CheckpointMismatch, match="hook.rng"):
            rng_from_plain({**plain, **change})
    broken = dict(plain)
    broken.pop("has_gauss")
    with pytest.raises(CheckpointMismatch, match="hook.rng"):
        rng_from_plain(broken)
