"""Single-process emulation of a pipeline schedule: the same stages, operation lists, delays and
update order as the multi-process engine, without processes or messages.

Operations run in any order that respects the data dependencies (a forward needs the previous
stage's forward of the same micro-batch, a backward the next stage's backward); each stage's own
list is kept in order. Because a stage's arithmetic depends only on its own order, the result is
bit-for-bit what the engine computes (tested), and fast enough for accuracy studies.
"""

from __future__ import annotations

import logging
import time

import torch

from thinwire.pipeline import schedules
from thinwire.pipeline.config import DTYPES, PipelineConfig, Stream, build_stages, optimizer_args
from thinwire.pipeline.stage import StageWorker

log = logging.getLogger(__name__)


def make_workers(cfg: PipelineConfig, stages: list[torch.nn.Module]) -> list[StageWorker]:
    S = len(stages)
    return [StageWorker(mod, optimizer_args(cfg, s), first=s == 0, last=s == S - 1)
            for s, mod in enumerate(stages)]


def run_ops(ops: list[list[schedules.Op]], workers: list[StageWorker], batch) -> None:
    """Execute every stage's list; ``batch(i)`` gives micro-batch i's (x, y)."""
    S = len(workers)
    pos = [0] * S
    acts: list[dict[int, torch.Tensor]] = [{} for _ in range(S)]   # inputs waiting at stage s
    grads: list[dict[int, torch.Tensor]] = [{} for _ in range(S)]  # output grads waiting at s
    remaining = sum(map(len, ops))
    while remaining:
        progressed = False
        for s in range(S):
            while pos[s] < len(ops[s]):
                kind, i = ops[s][pos[s]]
                if kind == "F":
                    if s == 0:
                        x, _ = batch(i)
                    elif i in acts[s]:
                        x = acts[s].pop(i)
                    else:
                        break
                    y = batch(i)[1] if s == S - 1 else None
                    out = workers[s].forward(i, x, y)
                    if s < S - 1:
                        acts[s + 1][i] = out
                elif kind == "B":
                    if s == S - 1:
                        g = workers[s].backward(i)
                    elif i in grads[s]:
                        g = workers[s].backward(i, grads[s].pop(i))
                    else:
                        break
                    if s > 0:
                        grads[s - 1][i] = g
                else:
                    workers[s].update()
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule deadlocks: stages stuck at operations "
                               f"{[ops[s][pos[s]] if pos[s] < len(ops[s]) else None for s in range(S)]}")


def evaluate(workers: list[StageWorker], x: torch.Tensor, y: torch.Tensor,
             chunk: int = 512) -> float:
    correct = 0
    for a in range(0, x.shape[0], chunk):
        h = x[a:a + chunk]
        for w in workers:
            h = w.infer(h)
        correct += int((h.argmax(1) == y[a:a + chunk]).sum())
    return correct / max(1, x.shape[0])


def emulate(cfg: PipelineConfig, ds) -> dict:
    """Train as the engine would on data set ``ds``, in this process; returns the summary and
    the workers."""
    cfg.validate()
    if cfg.schedule == "ticktock":
        raise ValueError("schedule 'ticktock' runs on the multi-process engine only (two "
                         "partitions per rank); it computes what gpipe with the same M does")
    dtype = DTYPES[cfg.dtype]
    stream = Stream(cfg, len(ds))
    stages = build_stages(cfg, ds.train_x[0].numel(), ds.classes)
    workers = make_workers(cfg, stages)
    ops = schedules.build(cfg.schedule, cfg.stages, stream.total, cfg.group)

    def batch(i):
        idx = stream.indices(i)
        return ds.train_x[idx].to(dtype), ds.train_y[idx]

    start = time.perf_counter()
    run_ops(ops, workers, batch)
    wall = time.perf_counter() - start
    acc = evaluate(workers, ds.test_x.to(dtype), ds.test_y)
    last = workers[-1]
    return {
        "schedule": cfg.schedule, "stages": cfg.stages, "sc": cfg.sc, "lwp": cfg.lwp,
        "micro_batch": cfg.micro_batch, "group": cfg.group, "lr": cfg.lr,
        "momentum": cfg.momentum, "samples": stream.total * cfg.micro_batch,
        "delays": [w.opt.delay for w in workers], "measured_delays": schedules.measured_delays(ops),
        "train_loss": last.loss_sum / max(1, last.loss_count), "test_accuracy": acc,
        "wall_s": wall, "workers": workers,
    }
