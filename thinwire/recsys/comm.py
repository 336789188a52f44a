"""All-to-all with variable splits, and the byte counters every method reports.

A counter records the bytes *this rank sends to other ranks* (what it sends to itself never
touches the network), per tag. Formulas, per call, for a rank r of world N:

* ``counts(c)``: an int64 count per peer: ``8 (N - 1)`` per call of c columns x c;
* ``alltoallv(t, send)``: ``(sum(send) - send[r]) * row_bytes(t)``;
* ``allreduce(t)`` (ring model, what a bandwidth-optimal allreduce sends):
  ``2 (N - 1) / N * t.nbytes``.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist


class ByteCounter:
    def __init__(self) -> None:
        self.bytes: dict[str, float] = defaultdict(float)

    def add(self, tag: str, nbytes: float) -> None:
        self.bytes[tag] += nbytes

    @property
    def total(self) -> float:
        return float(sum(self.bytes.values()))

    def reset(self) -> None:
        self.bytes.clear()


def row_bytes(t: torch.Tensor) -> int:
    return t.element_size() * (t[0].numel() if t.dim() > 1 else 1)


class Comm:
    """The collectives of one rank in `group` (default: the world), counting what they send."""

    def __init__(self, counter: ByteCounter | None = None, group=None):
        self.group = group
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.world = dist.get_world_size(group) if dist.is_initialized() else 1
        self.counter = counter if counter is not None else ByteCounter()

    def counts(self, send: torch.Tensor, tag: str) -> torch.Tensor:
        """Exchange per-peer counts: send[k] (int64, shape [N] or [N, c]) goes to rank k."""
        if self.world == 1:
            return send.clone()
        out = torch.empty_like(send)
        dist.all_to_all_single(out, send.contiguous(), group=self.group)
        self.counter.add(tag, (self.world - 1) * row_bytes(send))
        return out

    def alltoallv(self, t: torch.Tensor, send: list[int], recv: list[int],
                  tag: str) -> torch.Tensor:
        """Rows t[sum(send[:k]):sum(send[:k+1])] go to rank k; returns what every rank sent here,
        in rank order."""
        if self.world == 1:
            return t.clone()
        out = t.new_empty((sum(recv),) + tuple(t.shape[1:]))
        dist.all_to_all_single(out, t.contiguous(), recv, send, group=self.group)
        self.counter.add(tag, (sum(send) - send[self.rank]) * row_bytes(t))
        return out

    def allreduce_(self, t: torch.Tensor, tag: str) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t, group=self.group)
            self.counter.add(tag, 2 * (self.world - 1) / self.world * t.numel() *
                             t.element_size())
        return t

    def allreduce_grads(self, module: torch.nn.Module, tag: str = "dense") -> None:
        """Sum the gradients of a replicated module over ranks (one flat buffer)."""
        params = [p for p in module.parameters() if p.grad is not None]
        if not params or self.world == 1:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self.allreduce_(flat, tag)
        start = 0
        for p in params:
            p.grad.copy_(flat[start:start + p.numel()].view_as(p.grad))
            start += p.numel()


def id_dtype(num_rows: int | None) -> torch.dtype:
    """Ids travel as int32 when the table is fixed and small enough, else int64."""
    return torch.int32 if num_rows is not None and num_rows <= 2**31 - 1 else torch.int64
