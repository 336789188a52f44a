"""Rank functions for the pipeline engine tests (spawned processes import them by name)."""

from __future__ import annotations

from thinwire.pipeline import engine
from thinwire.pipeline.config import PipelineConfig
from thinwire.train.pipeline.data import load


def _train(cfg: PipelineConfig) -> dict:
    return engine.train_stage(cfg, load(cfg))


def train_each_schedule(rank: int, world: int, configs: list[dict]) -> list[dict]:
    """Run the engine once per configuration in the same process group; the stage's final
    parameters and summary come back to the test."""
    results = []
    for kwargs in configs:
        summary = _train(PipelineConfig(**kwargs))
        results.append({"params": summary["params"], "delay": summary["delay"],
                        "test_accuracy": summary["test_accuracy"],
                        "train_loss": summary["train_loss"],
                        "operations": len(summary["events"])})
    return results


def train_once(rank: int, world: int, kwargs: dict) -> dict:
    return _train(PipelineConfig(**kwargs))


def train_ticktock(rank: int, world: int, kwargs: dict) -> dict:
    """One ``ticktock`` run: both copies this rank holds (tick partition = rank, tock partition
    = world - 1 - rank) come back to the test."""
    summary = _train(PipelineConfig(**kwargs))
    return {k: summary[k] for k in ("params", "tock_params", "tock_partition", "test_accuracy",
                                    "train_loss", "events")}
