"""LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2).

Per tensor, at step t (t counts the steps this tensor was updated):

    m = b1 * m + (1 - b1) * g                 v = b2 * v + (1 - b2) * g^2
    r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * w
    trust = ||w|| / ||r||                     (1 when ||w|| or ||r|| is 0)
    w = w - lr * trust * r

Groups with `trust_ratio=False` (bias and normalisation parameters) use trust = 1 (AdamW-like).
The fused path (`foreach=True`, the default) works like LARS's: `_foreach_*` updates per
(device, dtype) bucket, the trust ratios one vector from `_foreach_norm`, no host
synchronisation (the bias corrections come from the step counts, which are host integers).
Mixed precision: exactly as for `thinwire.optim.LARS` (see its module docstring).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import Tensor
from torch.optim import Optimizer

from thinwire.optim._common import (check_number, chunks, norm_dtype, params_with_grads,
                                    resolve_foreach, trust_ratio)


class LAMB(Optimizer):
    """Layer-wise adaptive moments. Group options: `lr`, `betas`, `eps`, `weight_decay`,
    `trust_ratio` (bool, default True), `foreach`."""

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, foreach: bool | None = None) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        trust_ratio=True, foreach=foreach)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for name in ("lr", "eps", "weight_decay"):
            group[name] = check_number(name, group[name])
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        group["betas"] = (check_number("beta1", betas[0], high=1.0, high_open=True),
                          check_number("beta2", betas[1], high=1.0, high_open=True))
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
        gathered = [params_with_grads("LAMB", index, group)
                    for index, group in enumerate(self.param_groups)]
        for group, (params, grads) in zip(self.param_groups, gathered):
            if not params:
                continue
            exp_avgs, exp_avg_sqs, steps = [], [], []
            for p in params:
                state = self.state[p]
                if "step" not in state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            update = _lamb_foreach if resolve_foreach(group["foreach"]) else _lamb_per_tensor
            beta1, beta2 = group["betas"]
            update(params, grads, exp_avgs, exp_avg_sqs, steps, lr=group["lr"], beta1=beta1,
                   beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
                   use_trust=group["trust_ratio"])
        return loss


def _lamb_per_tensor(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                     exp_avg_sqs: list[Tensor], steps: list[int], *, lr: float, beta1: float,
                     beta2: float, eps: float, weight_decay: float, use_trust: bool) -> None:
    """The reference: one tensor at a time, the same arithmetic as the fused path."""
    for w, g, m, v, t in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = v.div(1 - beta2 ** t).sqrt_().add_(eps)
        r = m.div(1 - beta1 ** t).div_(denom)
        if weight_decay != 0:
            r.add_(w, alpha=weight_decay)
        if use_trust:
            dtype = norm_dtype(w.dtype)
            w_norm = torch.linalg.vector_norm(w, dtype=dtype)
            r_norm = torch.linalg.vector_norm(r, dtype=dtype)
            w.addcmul_(r, trust_ratio(w_norm, r_norm, w_norm, r_norm) * -lr)
        else:
            w.add_(r, alpha=-lr)


def _lamb_foreach(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                  exp_avg_sqs: list[Tensor], steps: list[int], *, lr: float, beta1: float,
                  beta2: float, eps: float, weight_decay: float, use_trust: bool) -> None:
    """The fused update: `_foreach_*` calls per (device, dtype) bucket, chunk by chunk on CPU
    (see `chunks`), so that the temporaries `r` and `denom` stay small there."""
    buckets = Optimizer._group_tensors_by_device_and_dtype(
        [params, grads, exp_avgs, exp_avg_sqs], with_indices=True)
    for (device, dtype), ((w_all, g_all, m_all, v_all), indices) in buckets.items():
        # Host floats (steps are host ints), passed as scalar lists: no device round trip.
        bc1_all = [1 - beta1 ** steps[i] for i in indices]
        bc2_all = [1 - beta2 ** steps[i] for i in indices]
        for part in chunks(w_all, device):
            w, g, m, v = w_all[part], g_all[part], m_all[part], v_all[part]
            torch._foreach_lerp_(m, g, 1 - beta1)
            torch._foreach_mul_(v, beta2)
            torch._foreach_addcmul_(v, g, g, value=1 - beta2)
            denom = torch._foreach_div(v, bc2_all[part])
            torch._foreach_sqrt_(denom)
            torch._foreach_add_(denom, eps)
            r = torch._foreach_div(m, bc1_all[part])
            torch._foreach_div_(r, denom)
            if weight_decay != 0:
                torch._foreach_add_(r, w, alpha=weight_decay)
            if use_trust:
                norms = torch.stack(torch._foreach_norm([*w, *r], 2, dtype=norm_dtype(dtype)))
                w_norm, r_norm = norms[:len(w)], norms[len(w):]
                trust = trust_ratio(w_norm, r_norm, w_norm, r_norm)
                torch._foreach_addcmul_(w, r, (trust * -lr).unbind(0))
            else:
                torch._foreach_add_(w, r, alpha=-lr)
