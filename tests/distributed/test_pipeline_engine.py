"""The multi-process pipeline engine equals the single-process emulation (same schedule, same
delays, same update order), bit for bit, on a tiny MLP."""

from __future__ import annotations

import pytest
import torch

from harness import run_ranks
from thinwire.pipeline.config import PipelineConfig
from thinwire.pipeline.emulate import emulate
from thinwire.train.pipeline.data import load

BASE = dict(stages=3, hidden=[16, 12], train_samples=18, lr=0.05, momentum=0.9,
            dtype="float64", timeout_s=120)
CONFIGS = [
    dict(BASE, schedule="pb", micro_batch=1),                        # SC + LWP on
    dict(BASE, schedule="pb", micro_batch=2, sc=False, lwp=False),
    dict(BASE, schedule="gpipe", micro_batch=2, group=3),
    dict(BASE, schedule="1f1b", micro_batch=2, group=3),
]


def test_engine_equals_emulation():
    by_rank = run_ranks(_fn(), 3, CONFIGS)
    for k, kwargs in enumerate(CONFIGS):
        cfg = PipelineConfig(**kwargs)
        want = emulate(cfg, load(cfg))
        for s, worker in enumerate(want["workers"]):
            got = by_rank[s][k]
            assert got["delay"] == worker.opt.delay
            for a, b in zip(got["params"], worker.opt.params):
                assert torch.equal(a, b), (kwargs["schedule"], s)
        assert by_rank[-1][k]["test_accuracy"] == want["test_accuracy"]
        assert by_rank[-1][k]["train_loss"] == pytest.approx(want["train_loss"], rel=1e-12)
    assert [r[0]["delay"] for r in by_rank] == [4, 2, 0]


def test_world_size_must_match_stages():
    with pytest.raises(RuntimeError, match="stages=3 needs one rank per stage, but the world "
                                           "has 2 ranks"):
        run_ranks(_fn("train_once"), 2, dict(BASE, schedule="pb"))


def _fn(name: str = "train_each_schedule"):
    import pipeline_workers

    return getattr(pipeline_workers, name)


def test_the_command_launches_one_rank_per_stage(tmp_path):
    """`thinwire pipeline train` end to end on loopback: its torchruns start the application's
    rank entry (python -m thinwire.train.pipeline), which writes results.json and the timeline."""
    import json

    from thinwire.cli import main

    out = tmp_path / "run"
    assert main(["pipeline", "train", "--stages", "2", "--train-samples", "64", "--epochs", "1",
                 "--schedule", "gpipe", "--group", "4", "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["schedule"] == "gpipe" and result["stages"] == 2 and result["samples"] == 64
    assert (out / "timeline.png").is_file()
