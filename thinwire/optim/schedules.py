"""The large-batch learning-rate recipe: linear scaling with batch size, linear warm-up, then
polynomial (LARS paper, power 2) or cosine decay.

The schedules are `torch.optim.lr_scheduler.LambdaLR` objects over small picklable factor
classes, so they compose with any optimizer and round-trip through `state_dict()`. Call
`scheduler.step()` once per optimizer step; the factor multiplies each group's initial lr.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from thinwire.optim._common import check_number


def linear_scaled_lr(base_lr: float, batch_size: int, base_batch_size: int = 256) -> float:
    """The linear scaling rule (Goyal et al. 2017): `base_lr * batch_size / base_batch_size`."""
    base_lr = check_number("base_lr", base_lr)
    for name, value in (("batch_size", batch_size), ("base_batch_size", base_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return base_lr * batch_size / base_batch_size


def _check_steps(total_steps: int, warmup_steps: int) -> None:
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps must be an integer >= 1, got {total_steps!r}")
    if (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int)
            or not 0 <= warmup_steps <= total_steps):
        raise ValueError(
            f"warmup_steps must be an integer in [0, total_steps={total_steps}], "
            f"got {warmup_steps!r}")


class WarmupPoly:
    """Factor at `step`: `(step + 1) / warmup_steps` during warm-up, then
    `end + (1 - end) * (1 - progress) ** power`, progress going 0 -> 1 over the remaining steps;
    `end` from `total_steps` on."""

    def __init__(self, total_steps: int, warmup_steps: int = 0, power: float = 2.0,
                 end_factor: float = 0.0) -> None:
        _check_steps(total_steps, warmup_steps)
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.power = check_number("power", power)
        self.end_factor = check_number("end_factor", end_factor, high=1.0)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        decay_steps = self.total_steps - self.warmup_steps
        if step >= self.total_steps or decay_steps == 0:
            return self.end_factor
        progress = (step - self.warmup_steps) / decay_steps
        return self.end_factor + (1.0 - self.end_factor) * self._decay(progress)

    def _decay(self, progress: float) -> float:
        """The decay's shape: 1 at the end of the warm-up (progress 0), 0 at the end."""
        return (1.0 - progress) ** self.power


class WarmupCosine(WarmupPoly):
    """Like `WarmupPoly`, with a half-cosine from 1 to `end_factor` after the warm-up."""

    def __init__(self, total_steps: int, warmup_steps: int = 0, end_factor: float = 0.0) -> None:
        super().__init__(total_steps, warmup_steps, power=1.0, end_factor=end_factor)

    def _decay(self, progress: float) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_poly(optimizer: Optimizer, total_steps: int, warmup_steps: int = 0,
                power: float = 2.0, end_factor: float = 0.0) -> LambdaLR:
    """Linear warm-up over `warmup_steps`, then polynomial decay to `end_factor * lr` at
    `total_steps`."""
    return LambdaLR(optimizer, WarmupPoly(total_steps, warmup_steps, power, end_factor))


def warmup_cosine(optimizer: Optimizer, total_steps: int, warmup_steps: int = 0,
                  end_factor: float = 0.0) -> LambdaLR:
    """Linear warm-up over `warmup_steps`, then cosine decay to `end_factor * lr`."""
    return LambdaLR(optimizer, WarmupCosine(total_steps, warmup_steps, end_factor))
