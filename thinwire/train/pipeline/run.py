"""What every rank of a launched pipeline run executes: train the stage, then rank 0 gathers the
summaries and writes ``results.json`` (atomically) and ``timeline.png`` into ``--out``."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch.distributed as dist

from thinwire.pipeline import engine, stage_io, timeline
from thinwire.pipeline.config import PipelineConfig
from thinwire.train.pipeline.data import load

log = logging.getLogger(__name__)


def summarise(cfg: PipelineConfig, stages: list[dict]) -> dict:
    util = timeline.utilisation(stages)
    wall = util[0]["wall_s"]
    samples = stages[0]["samples"]
    return {
        "schedule": cfg.schedule, "stages": cfg.stages, "micro_batch": cfg.micro_batch,
        "group": cfg.group if cfg.schedule != "pb" else None, "sc": cfg.sc, "lwp": cfg.lwp,
        "dataset": cfg.dataset, "hidden": cfg.hidden, "lr": cfg.lr, "momentum": cfg.momentum,
        "samples": samples, "wall_s": wall, "samples_per_s": samples / wall if wall else 0.0,
        "test_accuracy": stages[-1]["test_accuracy"], "train_loss": stages[-1]["train_loss"],
        "delays": [st["delay"] for st in stages], "per_stage": util,
        # process CPU time (all threads, gloo's included) over the run: what a node budget counts
        "cpu_s": [st.get("cpu_s") for st in stages],
        "cluster_shaped": os.environ.get("THINWIRE_CLUSTER_SHAPED"),
    }


def main(cfg: PipelineConfig) -> dict | None:
    from thinwire.output import write_json_atomic

    summary = engine.train_stage(cfg, load(cfg))
    stages = stage_io.gather({k: v for k, v in summary.items() if k != "params"})
    result = None
    if dist.get_rank() == 0:
        result = summarise(cfg, stages)
        if cfg.out:
            out = Path(cfg.out)
            out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(out / "results.json", {**result, "events": [st["events"] for st in stages]})
            tmp = out / ".timeline.png.tmp.png"
            timeline.plot([(f"{cfg.schedule}, {cfg.stages} stages", stages)], str(tmp),
                          window_s=_window(stages))
            os.replace(tmp, out / "timeline.png")
    dist.barrier()
    dist.destroy_process_group()
    return result


def _window(stages: list[dict], operations: int = 60) -> float:
    """Show about the first ``operations`` operations of stage 0: enough to see the pattern."""
    ev = stages[0]["events"]
    t0 = min(st["t_start"] for st in stages)
    return ev[min(len(ev), operations) - 1][3] - t0 if ev else 0.0
