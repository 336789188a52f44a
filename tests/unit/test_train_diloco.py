"""`thinwire train --algorithm diloco` in a world of one: outer steps happen, the run resumes
bit-identical (anchor, outer momentum and an exchange in flight in the checkpoint), bad options
are named."""

import pytest
import torch

from thinwire.train import TrainConfig, train
from thinwire.train import checkpoint
from thinwire.train.checkpoint import rank_file


def _run(tmp_path, name, **changes):
    cfg = dict(model="mlp", algorithm="diloco", sync_every=3, max_iters=8, epochs=1,
               batch_size=16, eval_every=4, progress=False, compute_probe_iters=0,
               checkpoint=str(tmp_path / name), log_every=1)
    cfg.update(changes)
    return train(TrainConfig(**cfg))


def _saved(directory):
    return checkpoint.read(rank_file(directory, 0), 0)


@pytest.mark.parametrize("changes,stop,exchanges", [
    ({}, 5, 2),
    # fragment 0 syncs after steps 2 and 6, fragment 1 after 4 and 8: the stop at 6 leaves
    # fragment 0's exchange in flight (checkpointed); the last one lands at the end (flush)
    (dict(fragments=2, overlap=True, sync_every=4, outer_algorithm="hitopk", density=0.1), 6, 4),
    (dict(outer_algorithm="sparseloco", density=0.1, outer_chunk=64, outer_bits=2,
          outer_decay=0.9, outer_momentum=0.0, outer_lr=1.0), 4, 2),
], ids=["dense", "streaming-overlap-hitopk", "sparseloco"])
def test_diloco_train_resumes_exactly(tmp_path, changes, stop, exchanges):
    straight = _run(tmp_path, "straight", **changes)
    _run(tmp_path, "resumed", stop_after=stop, **changes)
    _run(tmp_path, "resumed", resume=str(tmp_path / "resumed"), **changes)
    a, b = _saved(tmp_path / "straight"), _saved(tmp_path / "resumed")
    assert a["hook"]["format"] == "thinwire.diloco/1"
    assert sum(a["hook"]["outer_steps"]) == exchanges
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert straight["steps"] == 8


@pytest.mark.parametrize("changes,message", [
    (dict(sync_every=0), "--sync-every must be an integer >= 1 with --algorithm diloco, got 0"),
    (dict(outer_algorithm="ring"), "--outer-algorithm must be one of"),
    (dict(fragments=0), "--fragments must be an integer >= 1, got 0"),
    (dict(outer_momentum=1.0), "--outer-momentum must be a number in [0, 1), got 1.0"),
    (dict(outer_lr=1e30), "--outer-lr must be a number in (0, 10], got 1e+30"),
    (dict(outer_algorithm="sparseloco", outer_bits=3), "bits must be None (float32 values) or "
                                                       "one of 2, 4, 8, got 3"),
    (dict(outer_algorithm="sparseloco", outer_decay=-0.1),
     "--outer-decay must be a number in [0, 1], got -0.1"),
    (dict(outer_bits=3), "--outer-bits applies to --outer-algorithm sparseloco; this run "
                         "(--algorithm diloco) does not use it, got --outer-bits 3"),
])
def test_diloco_train_bad_options(changes, message):
    cfg = dict(model="mlp", algorithm="diloco", sync_every=3)
    cfg.update(changes)
    with pytest.raises(ValueError) as info:
        TrainConfig(**cfg).validate()
    assert message in str(info.value)


@pytest.mark.parametrize("changes,message", [
    (dict(sync_every=0), "--sync-every must be an integer >= 1 with --algorithm diloco, got 0"),
    (dict(fragments=2), "--fragments must be 1 and --overlap off, got --fragments 2"),
    (dict(overlap=True), "--fragments must be 1 and --overlap off, got --fragments 1 --overlap"),
    (dict(outer_algorithm="hitopk"), "--outer-algorithm must be allreduce or hier_allreduce, "
                                     "got 'hitopk'"),
    (dict(checkpoint="ckpt"), "--algorithm torchft-diloco does not checkpoint"),
])
def test_torchft_diloco_train_bad_options(changes, message):
    pytest.importorskip("torchft")
    cfg = dict(model="mlp", algorithm="torchft-diloco", sync_every=3)
    cfg.update(changes)
    with pytest.raises(ValueError) as info:
        TrainConfig(**cfg).validate()
    assert message in str(info.value)
