"""What is kept back: error-feedback residuals, per rank and per bucket.

The residual of a bucket is what its compressor did not send; it is added to the next step's
input before selection. Residuals are keyed by bucket index, with the bucket's layout (which
parameters it holds): a residual whose bucket changed length or layout starts again at zero
(DDP rebuilds its buckets after the first iteration). They are part of the checkpoint:
:meth:`state_dict` holds plain tensors.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class ErrorFeedback:
    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)
        self.residuals: dict[int, torch.Tensor] = {}
        self.layouts: dict[int, tuple] = {}
        self.layout: tuple | None = None  # the current bucket's layout, set by the caller

    def add_residual(self, bucket_index: int, corrected: torch.Tensor) -> torch.Tensor:
        """``corrected = input + residual`` in place (input must be this rank's own copy)."""
        if not self.enabled:
            return corrected
        residual = self.residuals.get(bucket_index)
        if residual is not None and (residual.shape != corrected.shape
                                     or residual.dtype != corrected.dtype
                                     or self.layouts.get(bucket_index) != self.layout):
            log.info("bucket %d changed (%s -> %s elements, layout %s -> %s): its residual "
                     "starts again at zero", bucket_index, residual.numel(), corrected.numel(),
                     self.layouts.get(bucket_index), self.layout)
            residual = None
        if residual is not None:
            corrected.add_(residual.to(corrected.device))
        return corrected

    def keep(self, bucket_index: int, corrected: torch.Tensor, sent: torch.Tensor) -> None:
        """Residual = corrected input with the sent entries zeroed (takes ownership)."""
        if not self.enabled:
            return
        corrected[sent] = 0
        self.residuals[bucket_index] = corrected
        self.layouts[bucket_index] = self.layout

    def reset(self) -> None:
        self.residuals.clear()
        self.layouts.clear()

    def state_dict(self) -> dict:
        return {"enabled": self.enabled,
                "residuals": {i: r.detach().cpu().clone() for i, r in self.residuals.items()},
                "layouts": {i: list(v) if v is not None else None
                            for i, v in self.layouts.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Residuals load where they were saved from (the CPU); the first step moves them."""
        self.enabled = bool(state["enabled"])
        self.residuals = {int(i): r.clone() for i, r in state["residuals"].items()}
        self.layouts = {int(i): tuple(v) if v is not None else None
                        for i, v in state.get("layouts", {}).items()}
