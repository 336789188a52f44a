"""Single-process float64 references: what every rank must hold after each algorithm."""

from __future__ import annotations

import math

import torch


def gradient(rank: int, step: int, length: int, seed: int = 0) -> torch.Tensor:
    """The deterministic float64 gradient of ``rank`` at ``step``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randn(length, generator=g, dtype=torch.float64)


def _sparsify(c: torch.Tensor, density: float, shards: int = 1):
    """Top-k of |c| (k = ceil(density numel)); with ``shards``, top-k_s inside each of that many
    contiguous shards of length L = ceil(numel / shards), k_s = ceil(density L) (topk_a2a)."""
    if shards > 1:
        length = math.ceil(c.numel() / shards)
        k = max(1, math.ceil(density * length))
        full = torch.zeros(shards * length, dtype=c.dtype)
        full[:c.numel()] = c
        chosen = torch.cat([torch.topk(shard.abs(), k).indices + s * length
                            for s, shard in enumerate(full.view(shards, length))])
        chosen = chosen[chosen < c.numel()]
    else:
        chosen = torch.topk(c.abs(), max(1, math.ceil(density * c.numel()))).indices
    sent = torch.zeros_like(c)
    sent[chosen] = c[chosen]
    residual = c.clone()
    residual[chosen] = 0
    return sent, residual


class Reference:
    """Runs one algorithm over steps on all ranks' gradients at once."""

    def __init__(self, algorithm: str, nodes: int, ranks_per_node: int, density: float,
                 momentum: float = 0.0, sparse_wire: torch.dtype | None = None):
        # sparse_wire: the dtype the selected values travel in (their rounding error stays in
        # the residual); None: they travel as they are
        self.sparse_wire = sparse_wire
        self.algorithm, self.m, self.n, self.density = algorithm, nodes, ranks_per_node, density
        self.world = nodes * ranks_per_node
        self.residuals: dict = {}
        self.momentum, self.velocities = momentum, {}

    def _corrected(self, key, g: torch.Tensor) -> torch.Tensor:
        """The selector's input: g (or with momentum DGC's velocity u = m u + g) + residual."""
        if self.momentum:
            g = self.momentum * self.velocities.get(key, torch.zeros_like(g)) + g
            self.velocities[key] = g
        return g + self.residuals.get(key, 0)

    def _sent(self, key, c: torch.Tensor, sent_mask: torch.Tensor,
              sent: torch.Tensor | None = None) -> None:
        """What was sent (finally applied) leaves the residual and, with momentum, the
        velocity; ``sent`` (where given) is what was applied at the mask, rounded for the
        wire."""
        kept = torch.zeros_like(c) if sent is None else c - sent
        self.residuals[key] = torch.where(sent_mask, kept, c)
        if self.momentum:
            u = self.velocities[key]
            self.velocities[key] = torch.where(sent_mask, torch.zeros_like(u), u)

    def _feedback(self, key, g: torch.Tensor, shards: int = 1) -> torch.Tensor:
        """Error feedback on one selector's input; with momentum, DGC's momentum correction
        (velocity u = m u + g accumulated into the residual, both masked where sent)."""
        c = self._corrected(key, g)
        sent, _ = _sparsify(c, self.density, shards)
        mask = sent != 0  # the test gradients are never exactly 0
        if self.sparse_wire is not None:
            top = torch.finfo(self.sparse_wire).max
            sent = torch.where(mask, sent.clamp(-top, top).to(self.sparse_wire).double(), sent)
        self._sent(key, c, mask, sent)
        return sent

    def step(self, grads: list[torch.Tensor]) -> torch.Tensor:
        if self.algorithm in ("allreduce", "hier_allreduce"):
            return torch.stack(grads).mean(0)
        if self.algorithm == "topk_allgather":
            total = torch.zeros_like(grads[0])
            for rank, g in enumerate(grads):
                total += self._feedback(rank, g)
            return total / self.world
        if self.algorithm == "topk_a2a":
            total = torch.zeros_like(grads[0])
            for rank, g in enumerate(grads):
                total += self._feedback(rank, g, shards=self.world)
            return total / self.world
        if self.algorithm == "oktopk":
            return self._oktopk(grads)
        if self.algorithm == "hitopk":
            d = grads[0].numel()
            s = math.ceil(d / self.n)
            shards = torch.zeros(self.n, s, dtype=torch.float64)
            for node in range(self.m):
                node_sum = torch.zeros(self.n * s, dtype=torch.float64)
                node_sum[:d] = sum(grads[node * self.n + j] for j in range(self.n))
                for j in range(self.n):
                    shards[j] += self._feedback((node, j), node_sum[j * s:(j + 1) * s])
            return (shards.reshape(-1)[:d]) / self.world
        raise AssertionError(self.algorithm)

    def _oktopk(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Ok-Topk with both thresholds and the regions re-derived every step (tau = 1,
        rebalance_every = 1): exact local top-k, regions at the mean of every rank's split
        points, global top-k of the nonzero sums; a rank keeps what it sent unless selected.
        Records what each rank sends (``self.sent_counts[r][s]``, ``self.region_nonzeros``)."""
        p, d = self.world, grads[0].numel()
        k = max(1, math.ceil(self.density * d))
        corrected, chosen = [], []
        for rank, g in enumerate(grads):
            c = self._corrected(rank, g)
            corrected.append(c)
            chosen.append(torch.sort(torch.topk(c.abs(), k).indices).values)
        points = sum(idx[torch.arange(1, p) * (k // p)] if k >= p
                     else torch.arange(1, p) * d // p for idx in chosen)
        self.bounds = [0, *torch.div(points, p, rounding_mode="floor").tolist(), d]
        reduced = torch.zeros(d, dtype=torch.float64)
        for c, idx in zip(corrected, chosen):
            reduced[idx] += c[idx]
        self.sent_counts = [[int(((idx >= lo) & (idx < hi)).sum())
                             for lo, hi in zip(self.bounds, self.bounds[1:])] for idx in chosen]
        self.region_nonzeros = [int(reduced[lo:hi].count_nonzero())
                                for lo, hi in zip(self.bounds, self.bounds[1:])]
        nonzero = torch.nonzero(reduced).squeeze(1)
        top = nonzero[torch.topk(reduced[nonzero].abs(), min(k, nonzero.numel())).indices]
        selected = torch.zeros(d, dtype=torch.bool)
        selected[top] = True
        for rank, (c, idx) in enumerate(zip(corrected, chosen)):
            mine = torch.zeros(d, dtype=torch.bool)
            mine[idx] = True
            self._sent(rank, c, mine & selected)
        out = torch.zeros(d, dtype=torch.float64)
        out[top] = reduced[top] / p
        return out

    def held_back(self, length: int) -> torch.Tensor:
        """Sum of every residual, in gradient coordinates."""
        total = torch.zeros(length, dtype=torch.float64)
        for key, r in self.residuals.items():
            if self.algorithm == "hitopk":
                _, j = key
                s = r.numel()
                piece = torch.zeros(self.n * s, dtype=torch.float64)
                piece[j * s:(j + 1) * s] = r
                total += piece[:length]
            else:
                total += r
        return total


def held_back_by_ranks(results, bucket: int, length: int, algorithm: str,
                       buckets: int) -> torch.Tensor:
    """The residuals every rank holds for bucket ``bucket`` (of ``length`` entries), summed
    over the ranks: hitopk's residual is a rank's shard of its node's sum, the other sparse
    algorithms' a rank's whole bucket. (DDP numbers the ``buckets`` in reverse order.)"""
    held = torch.zeros(length, dtype=torch.float64)
    for result in results:
        residual = result["feedback"]["residuals"][buckets - 1 - bucket]
        if algorithm == "hitopk":
            start = result["topology"][2] * residual.numel()
            piece = residual[:max(0, length - start)]
            held[start:start + piece.numel()] += piece
        else:
            held += residual
    return held
