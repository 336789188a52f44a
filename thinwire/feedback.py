"""What is kept back: error-feedback residuals, per rank and per bucket.

The residual of a bucket is what its compressor did not send; it is added to the next step's
input before selection. Residuals are keyed by bucket index, with the bucket's layout (which
parameters it holds): a residual whose bucket changed length or layout starts again at zero
(DDP rebuilds its buckets after the first iteration). They are part of the checkpoint:
:meth:`state_dict` holds plain tensors.

``momentum > 0`` is DGC's momentum correction (Lin et al., 2018): momentum SGD on a sparsified
gradient loses most of its momentum, because a coordinate held back for many steps re-enters
with the plain sum of its gradients. Instead each bucket keeps a velocity ``u = m u + g`` and the
residual accumulates ``u`` (what is selected is ``residual + u``); the entries that were sent are
zeroed in both (DGC's factor masking, so a sent coordinate's old momentum does not keep pushing).
The optimizer then runs without momentum: the momentum is already in what was sent.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def check_momentum(momentum: float) -> float:
    if not (isinstance(momentum, (int, float)) and 0 <= momentum < 1):
        raise ValueError(f"momentum_correction must be a number in [0, 1), got {momentum!r}")
    return float(momentum)


class ErrorFeedback:
    def __init__(self, enabled: bool = True, momentum: float = 0.0):
        self.enabled = bool(enabled)
        self.momentum = check_momentum(momentum)
        self.residuals: dict[int, torch.Tensor] = {}
        self.velocities: dict[int, torch.Tensor] = {}
        self.layouts: dict[int, tuple] = {}
        self.layout: tuple | None = None  # the current bucket's layout, set by the caller

    def _stored(self, store: dict, bucket_index: int, like: torch.Tensor, what: str):
        """The bucket's stored tensor, or None where the bucket changed since it was kept."""
        kept = store.get(bucket_index)
        if kept is not None and (kept.shape != like.shape or kept.dtype != like.dtype
                                 or self.layouts.get(bucket_index) != self.layout):
            # Expected once after the first step: DDP rebuilds its buckets then, so a bucket
            # index names other parameters. Not a fault, hence debug.
            log.debug("bucket %d now holds other parameters (%s -> %s elements, layout %s -> "
                      "%s), as after DDP's bucket rebuild: its %s starts again at zero",
                      bucket_index, kept.numel(), like.numel(),
                      self.layouts.get(bucket_index), self.layout, what)
            return None
        return kept

    def _velocity(self, bucket_index: int, grad: torch.Tensor) -> torch.Tensor:
        """u = m u + grad for this bucket (stored), returned as the stored tensor."""
        velocity = self._stored(self.velocities, bucket_index, grad, "velocity")
        if velocity is None:
            velocity = grad.clone()
        else:
            velocity = velocity.to(grad.device).mul_(self.momentum).add_(grad)
        self.velocities[bucket_index] = velocity
        return velocity

    def add_residual(self, bucket_index: int, corrected: torch.Tensor) -> torch.Tensor:
        """``corrected = input + residual`` in place (input must be this rank's own copy);
        with momentum correction ``corrected = velocity + residual``."""
        if not self.enabled:
            return corrected
        if self.momentum:
            corrected.copy_(self._velocity(bucket_index, corrected))
        residual = self._stored(self.residuals, bucket_index, corrected, "residual")
        if residual is not None:
            corrected.add_(residual.to(corrected.device))
        return corrected

    def keep(self, bucket_index: int, corrected: torch.Tensor, sent: torch.Tensor,
             sent_values: torch.Tensor | None = None) -> None:
        """Residual = corrected input minus what was sent (takes ownership): the sent entries
        zeroed, or, where ``sent_values`` (as they travelled, e.g. rounded to fp16) are given,
        left with their rounding error. ``x - fp32(fp16(x))`` is exact in x's dtype, so what
        is applied plus the residual is exactly the corrected input."""
        if not self.enabled:
            return
        # index_fill_/index_add_ rather than x[sent] -= v: one pass over the sent entries, not
        # a gather, a subtraction and a scatter (the indices are unique: same result)
        if sent_values is None or sent_values.dtype == corrected.dtype:
            corrected.index_fill_(0, sent, 0)
        else:
            corrected.index_add_(0, sent, sent_values.to(corrected.dtype), alpha=-1)
        self.residuals[bucket_index] = corrected
        if self.momentum:
            self.velocities[bucket_index].index_fill_(0, sent, 0)
        self.layouts[bucket_index] = self.layout

    def convert_velocity(self, bucket_index: int, like: torch.Tensor, convert) -> None:
        """A velocity of this bucket kept in another form (over the whole bucket during a dense
        warm-up, where the sparse algorithm keeps one per shard) is converted with
        ``convert(velocity)`` instead of starting again at zero."""
        velocity = self.velocities.get(bucket_index)
        if (self.momentum and velocity is not None and velocity.shape != like.shape
                and self.layouts.get(bucket_index) == self.layout):
            converted = convert(velocity)
            if converted.shape == like.shape:
                self.velocities[bucket_index] = converted.to(like.dtype)

    def dense_momentum(self, bucket_index: int, average: torch.Tensor) -> torch.Tensor:
        """A bucket that went dense (small, or a dense warm-up step) still gets its momentum
        here when the optimizer's has moved into the hook: returns ``u = m u + average``."""
        if not (self.enabled and self.momentum):
            return average
        velocity = self._velocity(bucket_index, average)
        self.layouts[bucket_index] = self.layout
        return velocity.clone()

    def snapshot(self) -> dict:
        """What :meth:`restore` needs to undo the steps after it (a step the fault-tolerant
        quorum does not commit). Residuals are not copied: ``keep`` replaces a bucket's
        residual with a new tensor and never changes a kept one after its step, so holding the
        references is enough. Velocities are updated in place, so they are cloned."""
        return {"residuals": dict(self.residuals),
                "velocities": {i: v.clone() for i, v in self.velocities.items()},
                "layouts": dict(self.layouts)}

    def restore(self, snapshot: dict) -> None:
        self.residuals = dict(snapshot["residuals"])
        self.velocities = {i: v.clone() for i, v in snapshot["velocities"].items()}
        self.layouts = dict(snapshot["layouts"])

    def mass(self) -> dict:
        """This rank's residual mass: what it has held back and not yet sent (L1 norm and
        signed sum over every bucket). A rank that leaves takes it with it."""
        l1 = sum(float(r.double().abs().sum()) for r in self.residuals.values())
        total = sum(float(r.double().sum()) for r in self.residuals.values())
        return {"l1": l1, "sum": total, "elements": sum(r.numel()
                                                        for r in self.residuals.values())}

    def reset(self) -> None:
        self.residuals.clear()
        self.velocities.clear()
        self.layouts.clear()

    def state_dict(self) -> dict:
        return {"enabled": self.enabled, "momentum": self.momentum,
                "residuals": {i: r.detach().cpu().clone() for i, r in self.residuals.items()},
                "velocities": {i: v.detach().cpu().clone() for i, v in self.velocities.items()},
                "layouts": {i: list(v) if v is not None else None
                            for i, v in self.layouts.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Residuals load where they were saved from (the CPU); the first step moves them."""
        self.enabled = bool(state["enabled"])
        self.momentum = check_momentum(state.get("momentum", 0.0))
        self.residuals = {int(i): r.clone() for i, r in state["residuals"].items()}
        self.velocities = {int(i): v.clone() for i, v in state.get("velocities", {}).items()}
        self.layouts = {int(i): tuple(v) if v is not None else None
                        for i, v in state.get("layouts", {}).items()}
