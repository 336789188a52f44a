"""Momentum SGD for one pipeline stage, with Spike Compensation and Linear Weight Prediction.

Plain momentum SGD (PyTorch's form, no dampening): ``v <- m v + g``, ``w <- w - lr v``.

A gradient that arrives D updates late has missed the D steps in which momentum SGD would already
have applied it with weights 1, m, ..., m^(D-1). Spike Compensation (SC) applies that missed
amount at once and leaves the velocity to carry the rest, so the total effect of the gradient over
time is the same as without delay (1 / (1 - m)) and its schedule from now on is the undelayed one:

    v <- m v + g
    w <- w - lr * (m^D v + (1 - m^D) / (1 - m) g)

(D = 0 gives momentum SGD back.) Linear Weight Prediction (LWP) runs the forward with the weights
extrapolated D updates ahead along the last update, ``w + D (w_t - w_(t-1))``, which is where the
weights will be when the backward of that micro-batch runs and its gradient is applied.

Gradients are accumulated between updates and averaged (``gpipe``/``1f1b`` update once per M
micro-batches; ``pb`` after every one).
"""

from __future__ import annotations

from typing import Sequence

import torch


class StageSGD:
    def __init__(self, params: Sequence[torch.Tensor], lr: float, momentum: float = 0.0,
                 delay: int = 0, spike_compensation: bool = True,
                 weight_prediction: bool = True):
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if not isinstance(delay, int) or delay < 0:
            raise ValueError(f"delay must be an integer >= 0, got {delay!r}")
        self.params = list(params)
        self.lr, self.momentum, self.delay = float(lr), float(momentum), delay
        self.spike_compensation, self.weight_prediction = spike_compensation, weight_prediction
        self.velocity = [torch.zeros_like(p) for p in self.params]
        self.last_step = [torch.zeros_like(p) for p in self.params]  # w_t - w_(t-1)
        self.grad_sum = [torch.zeros_like(p) for p in self.params]
        self.accumulated = 0
        self.updates = 0

    def coefficients(self) -> tuple[float, float]:
        """(a, b) of ``w -= lr (a v + b g)``: (1, 0) without SC or without delay."""
        m, d = self.momentum, self.delay
        if not self.spike_compensation or d == 0:
            return 1.0, 0.0
        return m ** d, (1.0 - m ** d) / (1.0 - m)

    def forward_weights(self) -> list[torch.Tensor]:
        """Fresh tensors holding the weights a forward uses now: predicted D updates ahead with
        LWP, else the current ones (one pass over the weights either way)."""
        if not self.predicts() or self.updates == 0:
            return [p.detach().clone() for p in self.params]
        return [torch.add(p.detach(), s, alpha=self.delay)
                for p, s in zip(self.params, self.last_step)]

    def predicts(self) -> bool:
        return self.weight_prediction and self.delay > 0

    def accumulate(self, grads: Sequence[torch.Tensor]) -> None:
        for acc, g in zip(self.grad_sum, grads):
            acc.add_(g)
        self.accumulated += 1

    @torch.no_grad()
    def step(self) -> None:
        if self.accumulated == 0:
            raise RuntimeError("step() without a gradient: the schedule updated before a backward")
        a, b = self.coefficients()
        keep_step = self.predicts()
        for p, v, s, acc in zip(self.params, self.velocity, self.last_step, self.grad_sum):
            g = acc if self.accumulated == 1 else acc.div_(self.accumulated)
            v.mul_(self.momentum).add_(g)
            if keep_step:
                s.copy_(p)
            # a = 1, b = 0 is exactly torch.optim.SGD's step (bitwise equal at D = 0).
            p.add_(v, alpha=-self.lr * a)
            if b != 0.0:
                p.add_(g, alpha=-self.lr * b)
            if keep_step:
                s.sub_(p).neg_()  # w_t - w_(t-1), exactly the step taken
            acc.zero_()
        self.accumulated = 0
        self.updates += 1
