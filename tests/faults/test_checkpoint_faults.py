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


def _fallback_case(name):
    """(damage applied to rank0.pt, message expected in the warning)."""
    def set_field(field, value):
        return lambda p: H.rewrite(p, lambda d: d.__setitem__(field, value))

    def model_shape(p):
        def change(d):
            key = next(iter(d["model"]))
            d["model"][key] = torch.zeros(3, 3)
        H.rewrite(p, change)

    def optimizer_shape(p):
        def change(d):
            d["optimizer"]["state"] = {0: {"momentum_buffer": torch.zeros(7)}}
        H.rewrite(p, change)

    def residual_type(p):
        H.rewrite(p, lambda d: d["hook"]["feedback"]["residuals"].__setitem__(0, "junk"))

    return {
        "flipped-bytes": (H.flip_bytes, "checksum mismatch"),
        "truncated": (lambda p: p.write_bytes(p.read_bytes()[:1000]), "checksum mismatch"),
        "empty": (lambda p: p.write_bytes(b""), "empty file"),
        "foreign-bytes": (lambda p: p.write_bytes(b"\x89PNG\r\n" + bytes(500)), "bad header"),
        "plain-torch-save": (lambda p: torch.save({"model": {}}, p), "bad header"),
        "other-rank-file": (lambda p: p.write_bytes(safefile.encode(
            checkpoint.read(p, 0), checkpoint.MAGIC, checkpoint.file_key(1))),
            "belongs to 'train/rank1'"),
        "position-1e9": (set_field("position", 10 ** 9), "'position'"),
        "step-negative": (set_field("step", -7), "'step'"),
        "step-float": (set_field("step", 4.5), "'step'"),
        "model-shape": (model_shape, "shape"),
        "optimizer-shape": (optimizer_shape, "optimizer.state[0].momentum_buffer"),
        "hook-residual-not-tensor": (residual_type, "hook.feedback.residuals[0]"),
        "metrics-missing": (lambda p: H.rewrite(p, lambda d: d.pop("metrics")), "'metrics'"),
    }[name]


FALLBACK_CASES = ["flipped-bytes", "truncated", "empty", "foreign-bytes", "plain-torch-save",
                  "other-rank-file", "position-1e9", "step-negative", "step-float",
                  "model-shape", "optimizer-shape", "hook-residual-not-tensor",
                  "metrics-missing"]


@pytest.mark.parametrize("case", FALLBACK_CASES)
def test_damaged_newest_falls_back_to_previous(run_dir, case, caplog):
    damage, reason = _fallback_case(case)
    damage(rank_file(run_dir, 0))
    module, opt = _model_and_optimizer()
    with caplog.at_level(logging.WARNING):
        payload = checkpoint.load(run_dir, 0, H.config(), 1, steps_per_epoch=_steps(),
                                  check=_check(module, opt))
    assert payload["step"] == 2  # the previous checkpoint, not the damaged one
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert str(rank_file(run_dir, 0)) in warned and reason in warned


@pytest.mark.parametrize("case", ["flipped-bytes", "truncated", "position-1e9", "model-shape"])
def test_both_damaged_is_a_clear_error(run_dir, case):
    damage, reason = _fallback_case(case)
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


def _steps() -> int:
    from thinwire.train import data, models
    return len(data.rank_batches(len(data.load(models.data_name("mlp"))), 16, 0, 1, 0, 0))


def _model_and_optimizer():
    from thinwire.train import loop, models
    cfg = H.config()
    module = models.build(cfg.model, cfg.seed)
    opt, _ = loop._optimizer(cfg, module, 6)
    return module, opt


def _check(module, opt):
    from thinwire.train import loop
    return loop._fits(H.config(), module, opt)
