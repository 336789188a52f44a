"""fp32 master weights for a bf16/fp16 model ("ImageNet in Four Minutes", Jia et al. 2018).

The model keeps its low-precision parameters for the forward and backward pass; the optimizer
updates fp32 copies, so that updates smaller than a bf16/fp16 ulp are not rounded away. Per step:
`copy_grads_to_master()` before the optimizer (and before `GradScaler.unscale_`), then
`copy_master_to_model()` after it. See `thinwire.optim.lars` for the whole loop.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor


class MasterWeights:
    """fp32 copies of the parameters in `params` (tensors or param-group dicts, e.g. from
    `thinwire.optim.param_groups`). `param_groups` is the same grouping over the copies: give
    it to the optimizer."""

    def __init__(self, params: Iterable, dtype: torch.dtype = torch.float32) -> None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        if isinstance(params, Tensor):
            raise TypeError("params must be an iterable of tensors or of param-group dicts, "
                            "got a single Tensor")
        groups = list(params)
        if not groups:
            raise ValueError("params is empty: nothing to keep master weights for")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.model_params: list[Tensor] = []
        self.master_params: list[Tensor] = []
        self.param_groups: list[dict] = []
        for group in groups:
            model_params = list(group["params"])
            for p in model_params:
                if not isinstance(p, Tensor) or not p.is_floating_point():
                    raise TypeError(f"parameters must be floating-point tensors, got {p!r}")
            masters = [p.detach().to(dtype, copy=True).requires_grad_(True)
                       for p in model_params]
            self.model_params += model_params
            self.master_params += masters
            self.param_groups.append({**group, "params": masters})

    @torch.no_grad()
    def copy_grads_to_master(self) -> None:
        """Model gradients into the master gradients (converted to the master dtype); a
        parameter without a gradient leaves its master without one."""
        model_grads, master_grads = [], []
        for p, m in zip(self.model_params, self.master_params):
            if p.grad is None:
                m.grad = None
                continue
            if m.grad is None or m.grad.shape != p.grad.shape:
                m.grad = torch.empty_like(m)
            model_grads.append(p.grad)
            master_grads.append(m.grad)
        if master_grads:
            torch._foreach_copy_(master_grads, model_grads)

    @torch.no_grad()
    def copy_master_to_model(self) -> None:
        """Master weights into the model parameters (rounded to the model dtype)."""
        torch._foreach_copy_(self.model_params, self.master_params)

    def state_dict(self) -> dict:
        """The master weights: save them with the optimizer, or the fp32 precision is lost."""
        return {"master_params": [m.detach().clone() for m in self.master_params]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        saved = state["master_params"]
        if len(saved) != len(self.master_params):
            raise ValueError(f"state has {len(saved)} master weights, this object has "
                             f"{len(self.master_params)}")
        for index, (m, s) in enumerate(zip(self.master_params, saved)):
            if m.shape != s.shape:
                raise ValueError(f"master weight {index}: shape {tuple(s.shape)} in the state, "
                                 f"{tuple(m.shape)} here")
            m.copy_(s)
        self.copy_master_to_model()
