"""The multi-process engine: one stage per rank, activations forward and gradients backward with
torch.distributed point-to-point calls (gloo), each rank running its stage's operation list.

Sends are non-blocking (``isend``; the tensor is kept alive until the send completes), receives
block until the input a compute operation needs has arrived. Every operation list is a valid
schedule (the emulation runs the same lists), so this never deadlocks, and a stage computes the
same thing however its messages are timed. Timings are wall-clock around the compute of each
operation only (waiting for a message is idle time).
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

from thinwire.peer_failure import noting
from thinwire.pipeline import schedules, ticktock_engine
from thinwire.pipeline.config import DTYPES, PipelineConfig, Stream, build_stages, optimizer_args
from thinwire.pipeline.stage import StageWorker
from thinwire.pipeline.stage_io import (OP_DOING, TAG_ACTIVATION, TAG_GRADIENT, Sender,
                                        activation_shapes, evaluate, init, warm_up)

log = logging.getLogger(__name__)


def train_stage(cfg: PipelineConfig, ds) -> dict:
    """This rank's part of the run on data set ``ds`` (``train_x``/``train_y``/``test_x``/
    ``test_y``/``classes``; the same on every rank): trains its stage, then the pipelined
    evaluation. Returns the stage's summary (timings, events, final parameters; test accuracy
    on the last stage)."""
    cfg.validate()
    if cfg.schedule == "ticktock":  # two partitions per rank: Wavelet's own loop
        return ticktock_engine.train_stage(cfg, ds)
    s, S = init(cfg)
    dtype = DTYPES[cfg.dtype]
    stream = Stream(cfg, len(ds))
    stages = build_stages(cfg, ds.train_x[0].numel(), ds.classes)
    shapes = activation_shapes(stages, ds.train_x[:cfg.micro_batch].to(dtype))
    worker = StageWorker(stages[s], optimizer_args(cfg, s), first=s == 0, last=s == S - 1)
    ops = schedules.build(cfg.schedule, S, stream.total, cfg.group)[s]
    sender = Sender()
    events: list[tuple[str, int, float, float]] = []

    first = stream.indices(0)
    warm_up(stages[s], cfg, s, S, shapes, ds.train_x[first].to(dtype), ds.train_y[first])
    dist.barrier()
    t_start, cpu_start = time.time(), time.process_time()
    for kind, i in ops:
        with noting(s, OP_DOING[kind], i + 1, "micro-batch"):  # a lost peer: stage, op, i
            if kind == "F":
                if s == 0:
                    x = ds.train_x[stream.indices(i)].to(dtype)
                else:
                    x = torch.empty(shapes[s], dtype=dtype)
                    dist.recv(x, s - 1, tag=TAG_ACTIVATION)
                y = ds.train_y[stream.indices(i)] if s == S - 1 else None
                tb = time.time()
                out = worker.forward(i, x, y)
                events.append(("F", i, tb, time.time()))
                if s < S - 1:
                    sender.send(out, s + 1, TAG_ACTIVATION)
            elif kind == "B":
                if s == S - 1:
                    tb = time.time()
                    g = worker.backward(i)
                else:
                    grad = torch.empty(shapes[s + 1], dtype=dtype)
                    dist.recv(grad, s + 1, tag=TAG_GRADIENT)
                    tb = time.time()
                    g = worker.backward(i, grad)
                events.append(("B", i, tb, time.time()))
                if s > 0:
                    sender.send(g, s - 1, TAG_GRADIENT)
            else:
                tb = time.time()
                worker.update()
                events.append(("U", i, tb, time.time()))
    with noting(s, "finishing its sends", stream.total, "micro-batch"):
        sender.wait_all()
    t_end, cpu_s = time.time(), time.process_time() - cpu_start
    log.info("stage %d: %d operations in %.2f s", s, len(ops), t_end - t_start)

    with noting(s, "evaluating", stream.total, "micro-batch"):
        accuracy = evaluate(worker, s, S, ds.test_x.to(dtype), ds.test_y,
                            tuple(shapes[s][1:]))
    busy = sum(e[3] - e[2] for e in events)
    return {
        "stage": s, "delay": worker.opt.delay, "t_start": t_start, "t_end": t_end,
        "busy_s": busy, "wall_s": t_end - t_start, "cpu_s": cpu_s, "events": events,
        "samples": stream.total * cfg.micro_batch,
        "train_loss": worker.loss_sum / worker.loss_count if worker.loss_count else None,
        "test_accuracy": accuracy, "params": [p.detach().clone() for p in worker.opt.params],
    }
