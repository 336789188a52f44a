"""Cutting a model into pipeline stages, and the small MLP the studies and tests use.

A stage is an ``nn.Sequential`` of consecutive layers of the whole model. Cut points are layer
indices: cuts ``[2, 4]`` on a six-layer model give stages ``[0:2]``, ``[2:4]`` and ``[4:6]``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def balanced_cuts(layers: int, stages: int) -> list[int]:
    """Cut points that give every stage ``layers // stages`` layers (the first ones one more)."""
    check_stages(layers, stages)
    base, extra = divmod(layers, stages)
    cuts, at = [], 0
    for s in range(stages - 1):
        at += base + (1 if s < extra else 0)
        cuts.append(at)
    return cuts


def check_stages(layers: int, stages: int) -> None:
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be an integer >= 1, got {stages!r}")
    if stages > layers:
        raise ValueError(f"stages must be <= the number of layers ({layers}): every stage needs "
                         f"at least one layer, got stages={stages}")


def split_sequential(model: nn.Sequential, cuts: Sequence[int]) -> list[nn.Sequential]:
    """The stages of ``model`` between the cut points (strictly increasing, in 1..len-1)."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be an nn.Sequential to be cut, got {type(model).__name__}")
    layers = len(model)
    cuts = list(cuts)
    check_stages(layers, len(cuts) + 1)
    for c in cuts:
        if not isinstance(c, int) or not 1 <= c <= layers - 1:
            raise ValueError(f"cut point {c!r} out of range: cut points must be integers in "
                             f"1..{layers - 1} (layer indices of a {layers}-layer model)")
    if any(b <= a for a, b in zip(cuts, cuts[1:])):
        raise ValueError(f"cut points must be strictly increasing, got {cuts}")
    bounds = [0] + cuts + [layers]
    return [nn.Sequential(*model[a:b]) for a, b in zip(bounds, bounds[1:])]


def as_stages(model: nn.Sequential | Sequence[nn.Module], stages: int | None = None,
              cuts: Sequence[int] | None = None) -> list[nn.Module]:
    """Stages from a list of modules (taken as they are) or an ``nn.Sequential`` (cut at ``cuts``,
    or into ``stages`` balanced parts)."""
    if isinstance(model, nn.Sequential):
        if cuts is None:
            if stages is None:
                raise ValueError("give stages or cuts to split an nn.Sequential")
            cuts = balanced_cuts(len(model), stages)
        elif stages is not None and len(cuts) + 1 != stages:
            raise ValueError(f"cuts {list(cuts)} make {len(cuts) + 1} stages, but stages={stages}")
        return list(split_sequential(model, cuts))
    mods = list(model)
    if not mods or not all(isinstance(m, nn.Module) for m in mods):
        raise TypeError("model must be an nn.Sequential or a non-empty list of nn.Module stages")
    if stages is not None and stages != len(mods):
        raise ValueError(f"stages={stages} but the list holds {len(mods)} stage modules")
    return mods


def mlp(in_features: int, hidden: Sequence[int], classes: int, seed: int = 0,
        dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Flatten, then one ``Linear+ReLU`` block per hidden width, then the classifier: each block
    is one layer for the cut points (len(hidden) + 1 layers)."""
    if in_features < 1 or classes < 1 or any(h < 1 for h in hidden):
        raise ValueError(f"mlp sizes must be >= 1, got in={in_features} hidden={list(hidden)} "
                         f"classes={classes}")
    torch.manual_seed(seed)
    widths = [in_features] + list(hidden)
    blocks: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        first = [nn.Flatten()] if i == 0 else []
        blocks.append(nn.Sequential(*first, nn.Linear(a, b), nn.ReLU()))
    last = [nn.Flatten()] if not hidden else []
    blocks.append(nn.Sequential(*last, nn.Linear(widths[-1], classes)))
    return nn.Sequential(*blocks).to(dtype)
