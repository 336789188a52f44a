"""Single-process float64 references: what every rank must hold after each algorithm."""

from __future__ import annotations

import math

import torch


def gradient(rank: int, step: int, length: int, seed: int = 0) -> torch.Tensor:
    """The deterministic float64 gradient of ``rank`` at ``step``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randn(length, generator=g, dtype=torch.float64)


def _sparsify(c: torch.Tensor, density: float):
    k = max(1, math.ceil(density * c.numel()))
    chosen = torch.topk(c.abs(), k).indices
    sent = torch.zeros_like(c)
    sent[chosen] = c[chosen]
    residual = c.clone()
    residual[chosen] = 0
    return sent, residual


class Reference:
    """Runs one algorithm over steps on all ranks' gradients at once."""

    def __init__(self, algorithm: str, nodes: int, ranks_per_node: int, density: float,
                 momentum: float = 0.0):
        self.algorithm, self.m, self.n, self.density = algorithm, nodes, ranks_per_node, density
        self.world = nodes * ranks_per_node
        self.residuals: dict = {}
        self.momentum, self.velocities = momentum, {}

    def _feedback(self, key, g: torch.Tensor) -> torch.Tensor:
        """Error feedback on one selector's input; with momentum, DGC's momentum correction
        (velocity u = m u + g accumulated into the residual, both masked where sent)."""
        if self.momentum:
            u = self.momentum * self.velocities.get(key, torch.zeros_like(g)) + g
            c = u + self.residuals.get(key, 0)
            sent, self.residuals[key] = _sparsify(c, self.density)
            self.velocities[key] = torch.where(sent != 0, torch.zeros_like(u), u)
            return sent
        c = g + self.residuals.get(key, 0)
        sent, self.residuals[key] = _sparsify(c, self.density)
        return sent

    def step(self, grads: list[torch.Tensor]) -> torch.Tensor:
        if self.algorithm in ("allreduce", "hier_allreduce"):
            return torch.stack(grads).mean(0)
        if self.algorithm == "topk_allgather":
            total = torch.zeros_like(grads[0])
            for rank, g in enumerate(grads):
                total += self._feedback(rank, g)
            return total / self.world
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
