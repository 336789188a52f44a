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
from datetime import timedelta

import torch
import torch.distributed as dist

from thinwire.pipeline import schedules
from thinwire.pipeline.config import DTYPES, PipelineConfig, Stream, build_stages, load, optimizer_args
from thinwire.pipeline.stage import StageWorker

log = logging.getLogger(__name__)
TAG_ACTIVATION, TAG_GRADIENT, TAG_EVAL = 1, 2, 3


def init(cfg: PipelineConfig) -> tuple[int, int]:
    """Join the process group (env:// as torchrun sets it) unless already joined."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=cfg.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != cfg.stages:
        raise ValueError(f"stages={cfg.stages} needs one rank per stage, but the world has {world} "
                         f"ranks: launch {cfg.stages} ranks")
    return rank, world


def _shapes(stages, x: torch.Tensor) -> list[torch.Size]:
    """shapes[s] = the input shape of stage s for a micro-batch like ``x`` (last = logits)."""
    shapes = [x.shape]
    with torch.no_grad():
        for mod in stages:
            x = mod(x)
            shapes.append(x.shape)
    return shapes


def _warm_up(module: torch.nn.Module, cfg: PipelineConfig, s: int, S: int, shapes, x, y) -> None:
    """One throw-away forward and backward through the very code path of the run, on a copy of
    the stage: the first backward of a process pays one-off start-up costs (seconds on a loaded
    machine) that are not the schedule's and would otherwise fill the first slots."""
    import copy

    scratch = StageWorker(copy.deepcopy(module), optimizer_args(cfg, s), first=s == 0,
                          last=s == S - 1)
    x = x if s == 0 else torch.zeros(shapes[s], dtype=x.dtype)
    scratch.forward(-1, x, y)
    scratch.backward(-1, None if s == S - 1 else torch.zeros(shapes[s + 1], dtype=x.dtype))
    scratch.update()


class _Sender:
    """isend with the tensor kept alive until the send completes."""

    def __init__(self):
        self.pending: list[tuple[dist.Work, torch.Tensor]] = []

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        tensor = tensor.contiguous()
        self.pending.append((dist.isend(tensor, dst, tag=tag), tensor))
        if len(self.pending) > 64:
            self.pending = [(w, t) for w, t in self.pending if not w.is_completed()]

    def wait_all(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


def train_stage(cfg: PipelineConfig) -> dict:
    """This rank's part of the run: trains its stage, then the pipelined evaluation. Returns
    the stage's summary (timings, events, final parameters; test accuracy on the last stage)."""
    cfg.validate()
    if cfg.schedule == "ticktock":  # two partitions per rank: Wavelet's own loop
        from thinwire.wavelet import pipeline_engine

        return pipeline_engine.train_stage(cfg)
    s, S = init(cfg)
    dtype = DTYPES[cfg.dtype]
    ds = load(cfg)
    stream = Stream(cfg, len(ds))
    stages = build_stages(cfg, ds.train_x[0].numel(), ds.classes)
    shapes = _shapes(stages, ds.train_x[:cfg.micro_batch].to(dtype))
    worker = StageWorker(stages[s], optimizer_args(cfg, s), first=s == 0, last=s == S - 1)
    ops = schedules.build(cfg.schedule, S, stream.total, cfg.group)[s]
    sender = _Sender()
    events: list[tuple[str, int, float, float]] = []

    first = stream.indices(0)
    _warm_up(stages[s], cfg, s, S, shapes, ds.train_x[first].to(dtype), ds.train_y[first])
    dist.barrier()
    t_start, cpu_start = time.time(), time.process_time()
    for kind, i in ops:
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
    sender.wait_all()
    t_end, cpu_s = time.time(), time.process_time() - cpu_start
    log.info("stage %d: %d operations in %.2f s", s, len(ops), t_end - t_start)

    accuracy = _evaluate(worker, s, S, ds.test_x.to(dtype), ds.test_y, tuple(shapes[s][1:]))
    busy = sum(e[3] - e[2] for e in events)
    return {
        "stage": s, "delay": worker.opt.delay, "t_start": t_start, "t_end": t_end,
        "busy_s": busy, "wall_s": t_end - t_start, "cpu_s": cpu_s, "events": events,
        "samples": stream.total * cfg.micro_batch,
        "train_loss": worker.loss_sum / worker.loss_count if worker.loss_count else None,
        "test_accuracy": accuracy, "params": [p.detach().clone() for p in worker.opt.params],
    }


def _evaluate(worker: StageWorker, s: int, S: int, x: torch.Tensor, y: torch.Tensor,
              in_tail: tuple, chunk: int = 512) -> float | None:
    """Forward-only pass of the test set through the pipeline; the last stage counts."""
    correct = 0
    for a in range(0, x.shape[0], chunk):
        b = min(a + chunk, x.shape[0])
        if s == 0:
            h = x[a:b]
        else:
            h = torch.empty((b - a,) + in_tail, dtype=x.dtype)
            dist.recv(h, s - 1, tag=TAG_EVAL)
        out = worker.infer(h)
        if s < S - 1:
            dist.send(out.contiguous(), s + 1, tag=TAG_EVAL)
        else:
            correct += int((out.argmax(1) == y[a:b]).sum())
    return correct / max(1, x.shape[0]) if s == S - 1 else None


def gather(summary: dict) -> list[dict] | None:
    """Every stage's summary on rank 0 (None elsewhere)."""
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(summary, out, dst=0)
    return out
