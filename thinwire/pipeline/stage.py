"""One pipeline stage's computation, shared by the engine (one process per stage) and the
single-process emulation, so that both compute exactly the same thing.

The forward of micro-batch i stores its input, output and the weight tensors it used; its backward
runs later, after whatever updates the schedule put in between. Like the paper's pipelined
backpropagation, the backward uses the stage's weights *as they are at backward time* with the
activations *stored at forward time* (weight inconsistency): before the backward the stored weight
tensors are overwritten in place with the current weights. In the flushed schedules nothing
changes between forward and backward, so this is ordinary backpropagation.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from thinwire.pipeline.optim import StageSGD


class StageWorker:
    def __init__(self, module: nn.Module, optimizer_args: dict, first: bool, last: bool):
        self.module = module
        self.names = [n for n, _ in module.named_parameters()]
        if not self.names:
            raise ValueError(f"stage {module} has no parameters; put it together with a "
                             f"neighbouring layer (choose other cut points)")
        params = [p for _, p in module.named_parameters()]
        for p in params:
            p.requires_grad_(False)  # updated by StageSGD only
        self.opt = StageSGD(params, **optimizer_args)
        self.first, self.last = first, last
        self.stash: dict[int, tuple] = {}
        self.loss_sum, self.loss_count = 0.0, 0

    def forward(self, i: int, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """The stage's output for micro-batch i (detached); the last stage returns the loss."""
        leaves = [w.requires_grad_(True) for w in self.opt.forward_weights()]
        x = x.detach()
        if not self.first:
            x.requires_grad_(True)
        with torch.enable_grad():
            out = functional_call(self.module, dict(zip(self.names, leaves)), (x,))
            if self.last:
                if y is None:
                    raise ValueError("the last stage needs the labels")
                out = F.cross_entropy(out, y)
        self.stash[i] = (x, out, leaves)
        if self.last:
            self.loss_sum += float(out.detach())
            self.loss_count += 1
        return out.detach()

    def backward(self, i: int, grad_out: torch.Tensor | None = None) -> torch.Tensor | None:
        """Accumulates micro-batch i's weight gradient; returns the gradient for the previous
        stage (None on the first stage)."""
        x, out, leaves = self.stash.pop(i)
        for leaf, current in zip(leaves, self.opt.params):
            # .data: the same storage autograd saved, without bumping its version counter.
            leaf.data.copy_(current)
        with torch.enable_grad():
            if self.last:
                out.backward()
            else:
                out.backward(grad_out)
        self.opt.accumulate([leaf.grad for leaf in leaves])
        return None if self.first else x.grad

    def update(self) -> None:
        self.opt.step()

    @torch.no_grad()
    def infer(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)
