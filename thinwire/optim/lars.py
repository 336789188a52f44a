"""LARS (You, Gitman, Ginsburg 2017): SGD with momentum and a per-layer trust ratio.

Per tensor, exactly:

    trust = eta * ||w|| / (||g|| + wd * ||w|| + eps)      (1 when ||w|| or ||g|| is 0)
    v     = m * v + lr * trust * (g + wd * w)
    w     = w - v

Parameter groups with `trust_ratio=False` (bias and normalisation parameters, see
`thinwire.optim.param_groups`) use trust = 1: plain momentum SGD with the learning rate inside
the momentum buffer.

The fused path (`foreach=True`, the default) updates every tensor of a (device, dtype) bucket in
a few `torch._foreach_*` calls: both norms with `_foreach_norm`, the trust ratios as one vector
computed with `torch.where`, then the update. Nothing reads a tensor value on the host, so a CUDA
step never waits for the device. `foreach=False` is the per-tensor reference: the same
arithmetic, one tensor at a time.

Mixed precision (fp16/bf16 forward and backward, fp32 update)::

    model = model.to(torch.float16)                          # or keep fp32 and use autocast
    master = MasterWeights(param_groups(model, weight_decay=5e-5))
    opt = LARS(master.param_groups, lr=linear_scaled_lr(0.1, batch_size))
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    master.copy_grads_to_master()   # fp16 grads -> fp32 grads of the master weights
    scaler.unscale_(opt)            # LARS must see true gradients: trust ratios use ||g||
    scaler.step(opt)                # skipped when a gradient is inf/NaN
    scaler.update()
    master.copy_master_to_model()
    model.zero_grad(set_to_none=True); opt.zero_grad(set_to_none=True)

With an fp32 model under `torch.autocast` no `MasterWeights` is needed: the parameters already
are the fp32 master weights; call `scaler.unscale_(opt)` before `scaler.step(opt)`.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import Tensor
from torch.optim import Optimizer

from thinwire.optim._common import (check_number, chunks, norm_dtype, params_with_grads,
                                    resolve_foreach, trust_ratio)


class LARS(Optimizer):
    """Layer-wise Adaptive Rate Scaling. See the module docstring for the update and for mixed
    precision. Group options: `lr`, `momentum`, `weight_decay`, `trust_coefficient`, `eps`,
    `trust_ratio` (bool, default True), `foreach`."""

    def __init__(self, params: Iterable, lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust_coefficient: float = 0.001,
                 eps: float = 1e-8, foreach: bool | None = None) -> None:
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, eps=eps, trust_ratio=True,
                        foreach=foreach)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        # Checked per group: a group may override any default.
        for name in ("lr", "weight_decay", "trust_coefficient", "eps"):
            group[name] = check_number(name, group[name])
        group["momentum"] = check_number("momentum", group["momentum"], high=1.0, high_open=True)
        if not isinstance(group["trust_ratio"], bool):
            raise TypeError(f"trust_ratio must be a bool, got {group['trust_ratio']!r}")
        resolve_foreach(group["foreach"])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # All groups checked (sparse gradients) before any group is updated.
        gathered = [params_with_grads("LARS", index, group)
                    for index, group in enumerate(self.param_groups)]
        for group, (params, grads) in zip(self.param_groups, gathered):
            if not params:
                continue
            bufs = []
            for p in params:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(
                        p, memory_format=torch.preserve_format)
                bufs.append(state["momentum_buffer"])
            update = _lars_foreach if resolve_foreach(group["foreach"]) else _lars_per_tensor
            update(params, grads, bufs, lr=group["lr"], momentum=group["momentum"],
                   weight_decay=group["weight_decay"], eta=group["trust_coefficient"],
                   eps=group["eps"], use_trust=group["trust_ratio"])
        return loss


def _lars_per_tensor(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], *,
                     lr: float, momentum: float, weight_decay: float, eta: float, eps: float,
                     use_trust: bool) -> None:
    """The reference: one tensor at a time, the same arithmetic as the fused path."""
    for w, g, v in zip(params, grads, bufs):
        v.mul_(momentum)
        if use_trust:
            dtype = norm_dtype(w.dtype)
            w_norm = torch.linalg.vector_norm(w, dtype=dtype)
            g_norm = torch.linalg.vector_norm(g, dtype=dtype)
            scale = lr * trust_ratio(eta * w_norm, g_norm + weight_decay * w_norm + eps,
                                     w_norm, g_norm)
            v.addcmul_(g, scale)
            if weight_decay != 0:
                v.addcmul_(w, scale * weight_decay)
        else:
            v.add_(g, alpha=lr)
            if weight_decay != 0:
                v.add_(w, alpha=lr * weight_decay)
        w.sub_(v)


def _lars_foreach(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], *,
                  lr: float, momentum: float, weight_decay: float, eta: float, eps: float,
                  use_trust: bool) -> None:
    """The fused update: a handful of `_foreach_*` calls per (device, dtype) bucket.

    `v += lr*trust*g` and `v += lr*trust*wd*w` as two in-place ops rather than building
    `g + wd*w`: no temporary as large as the model. The norms and trust ratios are computed
    for the whole bucket at once; the update then runs chunk by chunk (one chunk on CUDA).
    """
    buckets = Optimizer._group_tensors_by_device_and_dtype([params, grads, bufs])
    for (device, dtype), ((w_all, g_all, v_all), _) in buckets.items():
        if use_trust:
            ndtype = norm_dtype(dtype)
            # One call for both norm lists, then the trust ratios as one vector.
            norms = torch.stack(torch._foreach_norm([*w_all, *g_all], 2, dtype=ndtype))
            w_norm, g_norm = norms[:len(w_all)], norms[len(w_all):]
            scale = lr * trust_ratio(eta * w_norm, g_norm + weight_decay * w_norm + eps,
                                     w_norm, g_norm)
            # Per-tensor factors as 0-d device tensors: nothing goes to the host.
            g_factor = scale.unbind(0)
            w_factor = (scale * weight_decay).unbind(0) if weight_decay != 0 else None
        for part in chunks(w_all, device):
            w, g, v = w_all[part], g_all[part], v_all[part]
            torch._foreach_mul_(v, momentum)
            if use_trust:
                torch._foreach_addcmul_(v, g, g_factor[part])
                if w_factor is not None:
                    torch._foreach_addcmul_(v, w, w_factor[part])
            else:
                torch._foreach_add_(v, g, alpha=lr)
                if weight_decay != 0:
                    torch._foreach_add_(v, w, alpha=lr * weight_decay)
            torch._foreach_sub_(w, v)
