"""One rank of `thinwire bench pipeline --part throughput`: several pipeline runs in one process
group (the launch's start-up paid once), results and the timeline figure written by rank 0."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import torch.distributed as dist

from thinwire.bench.report import write_json_atomic
from thinwire.pipeline import config, engine, stage_io, timeline
from thinwire.train.pipeline.data import load
from thinwire.train.pipeline.run import summarise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thinwire.bench.pipeline_worker")
    parser.add_argument("--config", action="append", required=True,
                        help="JSON list: the options of one `thinwire pipeline train` run")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--png", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s rank{os.environ.get('RANK', '?')} %(message)s")
    run_parser = argparse.ArgumentParser()
    config.add_arguments(run_parser)
    cfgs = [config.from_args(run_parser.parse_args(json.loads(c))) for c in args.config]
    results, shown = [], []
    for repeat in range(args.repeats):
        for cfg in cfgs:  # interleaved, so that load drifts hit every schedule alike
            stages = stage_io.gather(engine.train_stage(cfg, load(cfg)) | {"params": None})
            if dist.get_rank() == 0:
                results.append(summarise(cfg, stages) | {"repeat": repeat})
                if repeat == args.repeats - 1:
                    shown.append((f"{cfg.schedule} (m={cfg.micro_batch}"
                                  + (f", M={cfg.group})" if cfg.schedule != "pb" else ")"),
                                  stages))
    if dist.get_rank() == 0:
        write_json_atomic(Path(args.out) / "results.json", results)
        window = max(_first_ops_s(st, 40) for _, st in shown)
        png = Path(args.png)
        tmp = png.with_name(f".{png.name}.tmp.png")
        timeline.plot(shown, str(tmp), window_s=window)
        os.replace(tmp, png)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _first_ops_s(stages: list[dict], operations: int) -> float:
    ev = stages[0]["events"]
    t0 = min(st["t_start"] for st in stages)
    return ev[min(len(ev), operations) - 1][3] - t0


if __name__ == "__main__":
    from thinwire.rank_exit import exit_rank

    exit_rank(main())
