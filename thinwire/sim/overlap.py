"""DDP-style buckets and the timeline that overlaps their communication with the backward pass.

Buckets: parameters in reverse layer order (the order their gradients become ready), a bucket
closed as soon as it reaches its cap, with the layer that crossed it inside; the first bucket is
capped at 1 MiB and the others at ``bucket_bytes`` (DDP's ``bucket_cap_mb``, 25 MiB), as DDP's
``_compute_bucket_assignment_by_size`` does. Where the cap falls matters for overlap: a model
whose big layer is near its output (a CNN's classifier) has that layer's gradients in the
*first* bucket, ready early, and its all-reduce runs behind the rest of the backward pass.
Grouping is by layer, not by tensor: a layer's weight and bias share a bucket (DDP splits them
only when a cap falls between them, a difference of one tensor per bucket).

Timeline: one communication track. Bucket ``b`` is ready when the backward pass has gone
through its last layer; its collectives start at ``max(ready_b, end_(b-1))`` and take
``cost_b``. The iteration takes ``forward + max(backward, end of the last bucket)``; without
overlap, ``forward + backward + sum(cost)``. Either way it lies between
``forward + max(backward, sum(cost))`` and ``forward + backward + sum(cost)``.
"""

from __future__ import annotations

from typing import Sequence

from thinwire.sim.compute import TimedLayer
from thinwire.sync import DEFAULT_BUCKET_BYTES

FIRST_BUCKET_BYTES = 1024 * 1024  # DDP's _DEFAULT_FIRST_BUCKET_BYTES


def buckets(layers: Sequence[TimedLayer], bucket_bytes: int = DEFAULT_BUCKET_BYTES,
            first_bucket_bytes: int = FIRST_BUCKET_BYTES, element_size: int = 4
            ) -> list[list[int]]:
    """Indices into ``layers`` per bucket, buckets in launch order, layers in backward order.
    Layers without parameters belong to no bucket."""
    for name, value in (("bucket_bytes", bucket_bytes), ("first_bucket_bytes", first_bucket_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(layers))):
        nbytes = layers[i].params * element_size
        if not nbytes:
            continue
        current.append(i)
        size += nbytes
        if size >= (first_bucket_bytes if not groups else bucket_bytes):
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


def ready_times(layers: Sequence[TimedLayer], groups: Sequence[Sequence[int]]) -> list[float]:
    """Seconds after the backward pass starts at which each bucket's gradients are all ready."""
    done_at = {}
    clock = 0.0
    for i in reversed(range(len(layers))):
        clock += layers[i].backward_s
        done_at[i] = clock
    return [max(done_at[i] for i in group) for group in groups]


def iteration_time(layers: Sequence[TimedLayer], groups: Sequence[Sequence[int]],
                   costs: Sequence[float], overlap: bool = True) -> float:
    """Seconds for forward + backward + the buckets' costs on one track (see module doc)."""
    if len(costs) != len(groups):
        raise ValueError(f"costs must have one entry per bucket ({len(groups)}), "
                         f"got {len(costs)}")
    if any(c < 0 for c in costs):
        raise ValueError(f"costs must be >= 0 seconds, got {min(costs)}")
    forward = sum(l.forward_s for l in layers)
    backward = sum(l.backward_s for l in layers)
    if not overlap:
        return forward + backward + sum(costs)
    end = 0.0
    for ready, cost in zip(ready_times(layers, groups), costs):
        end = max(ready, end) + cost
    return forward + max(backward, end)
