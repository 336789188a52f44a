"""Momentum SGD for one pipeline stage, with Spike Compensation and Linear Weight Prediction.

Plain momentum SGD (PyTorch's form, no dampening): ``v <- m v + g``, ``w <- w - lr v``.

A gradient that arrives D updates late has missed the D steps in which momentum SGD would already
have applied it with weights 1, m, ..., m^(D-1). Spike Compensation (SC) applies that missed
amount at once and leaves the velocity to carry the rest, so the total effect of the gradient over
time is the same as without delay (1 / (1 - m)) and its schedule from now on is the undelayed one:

    v <- m v + g
    w <- w - lr * (m^D v + (1 - m^D) / (1 - m) g)

(D = 0 gives momentum SGD back.) Linear Weight Prediction (LWP) runs the forward with the weights
extrapolated D updates ahead, which is where they will be when the backward of that micro-batch
runs and its gradient is applied. Two forms:

* ``velocity`` (default): ``w - lr D v``, D more steps of the smooth part of the update;
* ``weights``: ``w + D (w_t - w_(t-1))`` along the last step actually taken.

Without SC the two are the same (the last step is ``-lr v``). With SC the last step also holds the
one-off spike ``-lr b g`` of a single gradient, which the ``weights`` form extrapolates D times
(noise amplified by about D b, ~D^2 for momentum near 1); measured in docs/benchmarks.md.

Gradients are accumulated between updates and averaged (``gpipe``/``1f1b`` update once per M
micro-batches; ``pb`` after every one).
"""

from __future__ import annotations

from typing import Sequence

import torch


class StageSGD:
    def __init__(self, params: Sequence[torch.Tensor], lr: float, momentum: float = 0.0,
                 delay: int = 0, spike_compensation: bool = True,
                 weight_prediction: bool = True, prediction: str = "velocity"):
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if not isinstance(delay, int) or delay < 0:
            raise ValueError(f"delay must be an integer >= 0, got {delay!r}")
        if prediction not in ("velocity", "weights"):
            raise ValueError(f"prediction must be 'velocity' or 'weights', got {prediction!r}")
        self.prediction = prediction
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
        if not self.weight_prediction or self.delay == 0 or self.updates == 0:
            return [p.detach().clone() for p in self.params]
        if self.prediction == "velocity":
            return [torch.add(p.detach(), v, alpha=-self.lr * self.delay)
                    for p, v in zip(self.params, self.velocity)]
        return [torch.add(p.detach(), s, alpha=self.delay)
                for p, s in zip(self.params, self.last_step)]

    def accumulate(self, grads: Sequence[torch.Tensor]) -> None:
        for acc, g in zip(self.grad_sum, grads):
            acc.add_(g)
        self.accumulated += 1

    @torch.no_grad()
    def step(self) -> None:
        if self.accumulated == 0:
            raise RuntimeError("step() without a gradient: the schedule updated before a backward")
        a, b = self.coefficients()
        keep_step = self.weight_prediction and self.delay > 0 and self.prediction == "weights"
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
