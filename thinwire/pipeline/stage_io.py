"""What a pipeline rank needs around its schedule, whatever the schedule: joining the group,
the activation shapes between stages, a warm-up outside the timed run, non-blocking sends that
keep their tensors alive, the pipelined evaluation and the summaries' gather. The engines
(``engine`` for one stage per rank, ``ticktock_engine`` for two) both build on it.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from thinwire.pipeline.config import PipelineConfig, optimizer_args
from thinwire.pipeline.stage import StageWorker

OP_DOING = {"F": "in a forward", "B": "in a backward", "U": "in an update"}  # a note's words
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


def activation_shapes(stages, x: torch.Tensor) -> list[torch.Size]:
    """shapes[s] = the input shape of stage s for a micro-batch like ``x`` (last = logits)."""
    shapes = [x.shape]
    with torch.no_grad():
        for mod in stages:
            x = mod(x)
            shapes.append(x.shape)
    return shapes


def warm_up(module: torch.nn.Module, cfg: PipelineConfig, s: int, S: int, shapes, x, y) -> None:
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


class Sender:
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


def evaluate(worker: StageWorker, s: int, S: int, x: torch.Tensor, y: torch.Tensor,
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
