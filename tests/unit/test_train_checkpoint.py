"""Checkpoint and resume of a tiny run in a world of one: the resumed run ends bit-identical to
an uninterrupted one (model, optimizer, schedule, residuals and data position restored)."""

import pytest
import torch

from thinwire.train import TrainConfig, train
from thinwire.train import checkpoint
from thinwire.train.checkpoint import rank_file
from thinwire.train.grad_sync import is_sparse


def _run(tmp_path, name, **changes):
    cfg = dict(model="mlp", algorithm="hitopk", density=0.05, max_iters=8, epochs=1,
               batch_size=16, eval_every=4, progress=False, compute_probe_iters=0,
               checkpoint=str(tmp_path / name), log_every=1)
    cfg.update(changes)
    if not is_sparse(cfg["algorithm"]) and "density" not in changes:
        del cfg["density"]  # a dense run refuses a --density (it used to ignore it)
    return train(TrainConfig(**cfg))


def _weights(directory):
    return checkpoint.read(rank_file(directory, 0), 0)


@pytest.mark.parametrize("algorithm", ["hitopk", "allreduce"])
def test_resume_continues_exactly(tmp_path, algorithm):
    straight = _run(tmp_path, "straight", algorithm=algorithm)
    first = _run(tmp_path, "resumed", algorithm=algorithm, stop_after=5)
    assert first["steps"] == 5 and first["stopped_early"]
    saved = _weights(tmp_path / "resumed")
    assert saved["step"] == 5 and saved["position"] == 5
    if algorithm == "hitopk":  # the residuals travel in the checkpoint
        assert saved["hook"]["feedback"]
    resumed = _run(tmp_path, "resumed", algorithm=algorithm, resume=str(tmp_path / "resumed"))
    _same_as_straight(tmp_path, straight, resumed, "resumed")


def _same_as_straight(tmp_path, straight: dict, resumed: dict, name: str) -> None:
    """The resumed run ended where the uninterrupted one did: steps, weights, curve."""
    assert resumed["steps"] == straight["steps"] == 8
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / name)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert [p["test_accuracy"] for p in straight["curve"]] == \
        [p["test_accuracy"] for p in resumed["curve"]]


def test_powersgd_resume_restores_its_memory(tmp_path):
    """PowerSGD keeps its error and P/Q memory per DDP bucket index; they are checkpointed and
    restored (reset only for a bucket whose parameters moved when DDP rebuilt its buckets)."""
    _run(tmp_path, "straight", algorithm="powersgd")
    _run(tmp_path, "resumed", algorithm="powersgd", stop_after=5)
    saved = _weights(tmp_path / "resumed")["hook"]
    assert saved["iter"] == 5 and saved["error_dict"] and saved["layouts"]
    _run(tmp_path, "resumed", algorithm="powersgd", resume=str(tmp_path / "resumed"))
    after = _weights(tmp_path / "resumed")["hook"]
    straight = _weights(tmp_path / "straight")["hook"]
    assert after["iter"] == straight["iter"] == 8
    a, b = _weights(tmp_path / "straight")["model"], _weights(tmp_path / "resumed")["model"]
    for key in a:  # same data, same schedule, same compressor: close, if not bit-identical
        assert torch.allclose(a[key], b[key], atol=5e-3), key


def test_resume_from_another_model_or_algorithm_fails_clearly(tmp_path):
    _run(tmp_path, "ck", max_iters=2)
    with pytest.raises(ValueError, match=r"checkpoint is for --algorithm 'hitopk', this run has "
                                         r"--algorithm 'allreduce'"):
        _run(tmp_path, "other", algorithm="allreduce", resume=str(tmp_path / "ck"))
    with pytest.raises(ValueError, match=r"checkpoint is for --model 'mlp', this run has "
                                         r"--model 'lenet'"):
        _run(tmp_path, "other", model="lenet", resume=str(tmp_path / "ck"))
    with pytest.raises(ValueError, match=r"--density \(checkpoint 0.05, now 0.1\)"):
        _run(tmp_path, "other", density=0.1, resume=str(tmp_path / "ck"))
    # a missing folder fails in the load, where every rank agrees (checked alone before the
    # process group, one node's missing folder would leave the others waiting in its init)
    with pytest.raises(FileNotFoundError, match="no checkpoint for rank 0"):
        _run(tmp_path, "other", resume=str(tmp_path / "missing"))


def test_lars_and_bf16_autocast_train(tmp_path):
    out = _run(tmp_path, "lars", algorithm="allreduce", optimizer="lars", lr=2.0, amp="bf16",
               max_iters=0, epochs=2, eval_every=0, checkpoint=None,
               metrics=str(tmp_path / "m.jsonl"))
    assert out["steps"] == 2 * (1437 // 16)
    assert out["test_accuracy"] > 0.5  # learnt something in two epochs, in bf16, with LARS
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert lines[-1].startswith('{"event": "summary"') and len(lines) > 10


def test_resume_if_present_starts_afresh_then_resumes_with_the_same_command_line(tmp_path):
    """What torchrun's restarts need: one configuration for the first start and every restart."""
    straight = _run(tmp_path, "straight")
    first = _run(tmp_path, "again", stop_after=5, resume_if_present=True)  # empty: afresh
    assert first["steps"] == 5
    resumed = _run(tmp_path, "again", resume_if_present=True)  # holds step 5: resumes
    _same_as_straight(tmp_path, straight, resumed, "again")


@pytest.mark.parametrize("changes, message", [
    (dict(resume_if_present=True, checkpoint=None), "--resume-if-present needs --checkpoint"),
    (dict(resume_if_present=True, resume="elsewhere"), "or --resume-if-present, not both"),
])
def test_resume_if_present_is_checked(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        _run(tmp_path, "x", **changes)
