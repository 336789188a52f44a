"""Which parameters form each fragment, and at which inner step each fragment synchronises.

Streaming DiLoCo splits the model into ``F`` fragments and synchronises them at staggered steps,
so that the inter-node link carries 1/F of the model at a time instead of all of it every H
steps. thinwire splits the parameter list (in the model's order) into F contiguous runs of about
equal element counts; fragment ``f`` (0-based) synchronises after inner step ``s`` when
``s % H == ((f + 1) * H // F) % H``, so with F = 1 the single fragment synchronises every H
steps exactly as plain DiLoCo does, and with F > 1 the last fragment keeps that phase and the
others come evenly spaced before it.
"""

from __future__ import annotations

import torch


def split(parameters: list[torch.Tensor], fragments: int) -> list[list[int]]:
    """Indices into ``parameters``: ``fragments`` contiguous, non-empty runs of about equal
    element counts (greedy: a run closes once it holds its share of what is left)."""
    if not isinstance(fragments, int) or isinstance(fragments, bool) or fragments < 1:
        raise ValueError(f"fragments must be an int >= 1, got {fragments!r}")
    if fragments > len(parameters):
        raise ValueError(f"fragments must be at most the number of parameter tensors "
                         f"({len(parameters)}), got {fragments}")
    sizes = [p.numel() for p in parameters]
    runs: list[list[int]] = []
    start = 0
    for f in range(fragments):
        left_runs = fragments - f
        if left_runs == 1:
            runs.append(list(range(start, len(sizes))))
            break
        share = sum(sizes[start:]) / left_runs
        end, taken = start, 0
        # keep at least one tensor for every later run
        while end < len(sizes) - (left_runs - 1) and (end == start or taken + sizes[end] / 2 <= share):
            taken += sizes[end]
            end += 1
        runs.append(list(range(start, end)))
        start = end
    return runs


def phase(fragment: int, fragments: int, sync_every: int) -> int:
    """The step residue (mod ``sync_every``) after which ``fragment`` starts its exchange."""
    return ((fragment + 1) * sync_every // fragments) % sync_every


def check_schedule(sync_every, fragments: int, overlap: bool, delay) -> None:
    """Clear errors for a schedule that cannot work (names the parameter and what is allowed)."""
    if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
        raise ValueError(f"sync_every must be an int >= 1, got {sync_every!r}")
    if fragments > sync_every:
        raise ValueError(f"fragments must be at most sync_every ({sync_every}) so that every "
                         f"fragment gets its own step, got {fragments}")
    if not isinstance(delay, int) or isinstance(delay, bool) or delay < 0:
        raise ValueError(f"delay must be an int >= 0, got {delay!r}")
    if overlap:
        gap = sync_every // fragments  # the fewest steps between two fragments' starts
        if not 1 <= delay < gap:
            raise ValueError(f"with overlap, delay must be in [1, sync_every // fragments - 1] = "
                             f"[1, {gap - 1}] (one exchange in flight at a time), got {delay}"
                             + (" (sync_every // fragments is 1: no room to overlap)"
                                if gap == 1 else ""))
