"""Parameter groups for large-batch optimizers: no weight decay, no trust scaling for bias and
normalisation parameters (LARS paper; Goyal et al. 2017; LAMB's BERT recipe)."""

from __future__ import annotations

import torch
from torch import nn

from thinwire.optim._common import check_number

# Modules whose parameters are scales and shifts of a normalisation, not weights of a layer.
NORM_MODULES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,  # BatchNorm*, SyncBatchNorm, InstanceNorm*
    nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.LocalResponseNorm,
)


def is_bias_or_norm(module: nn.Module, param_name: str) -> bool:
    """True for a parameter called `bias` (in any module) and for every parameter of a
    normalisation module."""
    return param_name == "bias" or isinstance(module, NORM_MODULES)


def param_groups(model: nn.Module, weight_decay: float = 0.0) -> list[dict]:
    """Two groups for `LARS`/`LAMB`: weights (`weight_decay`, trust ratio) and bias and
    normalisation parameters (`weight_decay=0`, `trust_ratio=False`).

    Frozen parameters (`requires_grad=False`) are left out; a shared parameter appears once.
    An empty group is left out, so the result always suits `torch.optim.Optimizer`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    weight_decay = check_number("weight_decay", weight_decay)
    seen: set[int] = set()
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            (no_decay if is_bias_or_norm(module, name) else decay).append(param)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "trust_ratio": False})
    if not groups:
        raise ValueError("model has no trainable parameters (all have requires_grad=False)")
    return groups
