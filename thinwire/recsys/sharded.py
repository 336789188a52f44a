"""Sharded sparse parameters: one shard of an id-keyed table per rank, and sparse optimizers.

Row ``id`` lives on rank ``owner_of(id, world)``, a fixed hash of the id (never the id itself, so
that contiguous id ranges of one field spread over all ranks). A row's initial value is a pure
function of ``(seed, id, column)``: every rank, and the unsharded reference model, creates the
same row for the same id, which is what makes sharded and unsharded training comparable bit for
bit. Two kinds of table:

* fixed size (``num_rows`` given): ids must lie in ``[0, num_rows)``; the shard's rows are
  allocated up front;
* dynamic (``num_rows=None``): any id >= 0; a row is created the first time it is used.

A shard's ``state_dict()`` holds its ids, rows and optimizer state only (per-shard checkpoints).
"""

from __future__ import annotations

import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x + _GOLDEN).astype(np.uint64)
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
        return x ^ (x >> np.uint64(31))


def check_ids(ids: torch.Tensor, num_rows: int | None, name: str = "ids") -> None:
    """Ids are an int64 vector, >= 0 and (for fixed tables) < num_rows."""
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.dim() != 1:
        raise TypeError(f"{name} must be a 1-d int64 tensor, got "
                        f"{getattr(ids, 'dtype', type(ids).__name__)} "
                        f"with shape {tuple(getattr(ids, 'shape', ()))}")
    if ids.numel() == 0:
        return
    low = int(ids.min())
    if low < 0:
        raise ValueError(f"{name} must be >= 0, got {low}")
    if num_rows is not None:
        high = int(ids.max())
        if high >= num_rows:
            raise ValueError(f"{name} must be in [0, num_rows={num_rows}) for a fixed-size "
                             f"table, got {high}")


def owner_of(ids: torch.Tensor, world: int) -> torch.Tensor:
    """The rank that owns each id: ``hash(id) mod world`` (int64 tensor)."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    h = _splitmix(ids.numpy().astype(np.uint64))
    return torch.from_numpy((h % np.uint64(world)).astype(np.int64))


def init_rows(ids: torch.Tensor, dim: int, seed: int, scale: float,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Initial rows for ``ids``: uniform in [-scale, scale), a pure function of (seed, id, col)."""
    base = ids.numpy().astype(np.uint64)[:, None] * np.uint64(dim + 1)
    cols = np.arange(dim, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        key = base + cols + _splitmix(np.array([seed], dtype=np.uint64))
    bits = _splitmix(key) >> np.uint64(11)  # 53 random bits
    unit = bits.astype(np.float64) / float(1 << 53)
    return torch.from_numpy((2.0 * unit - 1.0) * scale).to(dtype)


class EmbeddingShard:
    """The rows of one table that one rank owns, looked up by id.

    ``lookup(ids)`` returns local row indices (creating rows for a dynamic table); the rows
    themselves are ``self.rows[index]``. ``owned_ids`` restricts a fixed table to a given set
    (default: the ids that hash to ``rank``)."""

    def __init__(self, dim: int, rank: int = 0, world: int = 1, num_rows: int | None = None,
                 seed: int = 0, init_scale: float = 0.01, dtype: torch.dtype = torch.float32,
                 check_owner: bool = True):
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, world={world}), got {rank}")
        if num_rows is not None and num_rows < 1:
            raise ValueError(f"num_rows must be >= 1 or None (dynamic), got {num_rows}")
        self.dim, self.rank, self.world = dim, rank, world
        self.num_rows, self.seed, self.init_scale, self.dtype = num_rows, seed, init_scale, dtype
        self.check_owner = check_owner
        self.optimizer_state: dict[str, torch.Tensor] = {}
        if num_rows is not None:
            all_ids = torch.arange(num_rows, dtype=torch.int64)
            keys = all_ids[owner_of(all_ids, world) == rank] if check_owner else all_ids
            self.keys = keys  # sorted
            self.rows = init_rows(keys, dim, seed, init_scale, dtype)
        else:
            self.keys = torch.empty(0, dtype=torch.int64)
            self.rows = torch.empty(0, dim, dtype=dtype)
        self._slot = torch.arange(len(self.keys))  # slot of sorted key i in self.rows

    def __len__(self) -> int:
        return len(self.keys)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Local row index of each id (rows of a dynamic table are created on first use)."""
        check_ids(ids, self.num_rows)
        if self.check_owner and self.world > 1 and ids.numel():
            wrong = owner_of(ids, self.world) != self.rank
            if bool(wrong.any()):
                bad = int(ids[wrong][0])
                raise ValueError(f"id {bad} is owned by rank {int(owner_of(ids[wrong][:1], self.world))}"
                                 f", not by this shard (rank {self.rank})")
        pos = torch.searchsorted(self.keys, ids)
        found = pos < len(self.keys)
        found[found.clone()] = self.keys[pos[found]] == ids[found]
        if not bool(found.all()):
            self._create(torch.unique(ids[~found]))
            pos = torch.searchsorted(self.keys, ids)
        return self._slot[pos]

    def _create(self, new_ids: torch.Tensor) -> None:
        start = len(self.rows)
        fresh = init_rows(new_ids, self.dim, self.seed, self.init_scale, self.dtype)
        self.rows = torch.cat([self.rows, fresh])
        for name, value in self.optimizer_state.items():
            self.optimizer_state[name] = torch.cat([value, torch.zeros_like(fresh)])
        keys = torch.cat([self.keys, new_ids])
        slots = torch.cat([self._slot, torch.arange(start, start + len(new_ids))])
        order = torch.argsort(keys)
        self.keys, self._slot = keys[order], slots[order]

    def state_dict(self) -> dict:
        order = torch.argsort(self._slot)  # ids in row order
        return {"ids": self.keys[order].clone(), "rows": self.rows.clone(),
                "optimizer_state": {k: v.clone() for k, v in self.optimizer_state.items()},
                "dim": self.dim, "rank": self.rank, "world": self.world,
                "num_rows": self.num_rows, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        for key in ("dim", "rank", "world", "num_rows"):
            if state[key] != getattr(self, key):
                raise ValueError(f"shard state has {key}={state[key]!r}, this shard has "
                                 f"{getattr(self, key)!r}")
        ids, rows = state["ids"], state["rows"]
        if rows.shape != (len(ids), self.dim):
            raise ValueError(f"shard state rows have shape {tuple(rows.shape)}, expected "
                             f"({len(ids)}, {self.dim})")
        check_rows_state(rows, state["optimizer_state"], "shard state")
        order = torch.argsort(ids)
        self.keys, self._slot = ids[order].clone(), order.clone()
        self.rows = rows.to(self.dtype).clone()
        self.optimizer_state = {k: v.clone() for k, v in state["optimizer_state"].items()}


def check_rows_state(rows: torch.Tensor, optimizer_state, where: str) -> None:
    """Rows and their optimizer state, as a checkpoint holds them, checked for meaning before
    they are used: finite rows, and each optimizer tensor finite and of the rows' shape (one
    of shape (1, dim) would broadcast over every row it is written to, silently)."""
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or \
            not bool(torch.isfinite(rows).all()):
        raise ValueError(f"{where}: rows must be a 2-D tensor of finite values")
    if not isinstance(optimizer_state, dict):
        raise ValueError(f"{where}: optimizer_state must be a dict of tensors, got "
                         f"{type(optimizer_state).__name__}")
    for name, value in optimizer_state.items():
        if not isinstance(value, torch.Tensor) or value.shape != rows.shape or \
                not bool(torch.isfinite(value).all()):
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else value
            raise ValueError(f"{where}: optimizer_state[{name!r}] must be finite and of the "
                             f"rows' shape {tuple(rows.shape)}, got {got!r}")


class SparseOptimizer:
    """Updates only the rows that received gradients; duplicates are summed first."""

    def __init__(self, kind: str = "sgd", lr: float = 0.05, eps: float = 1e-10):
        if kind not in ("sgd", "adagrad"):
            raise ValueError(f"optimizer must be 'sgd' or 'adagrad', got {kind!r}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        self.kind, self.lr, self.eps = kind, lr, eps

    def step(self, rows: torch.Tensor, state: dict, index: torch.Tensor,
             grad: torch.Tensor, distinct: bool = False) -> None:
        """In place on ``rows``: rows[index] -= update(sum of grad per index). ``distinct``:
        the caller guarantees no index repeats (skips summing duplicates)."""
        if index.numel() == 0:
            return
        if distinct:
            unique, summed = index, grad.to(rows.dtype)
        else:
            unique, inverse = torch.unique(index, return_inverse=True)
            summed = torch.zeros(len(unique), rows.shape[1], dtype=rows.dtype)
            summed.index_add_(0, inverse, grad.to(rows.dtype))
        if self.kind == "sgd":
            rows.index_add_(0, unique, -self.lr * summed)
            return
        if "accumulator" not in state:  # zeros; grown with the rows by EmbeddingShard
            state["accumulator"] = torch.zeros_like(rows)
        acc = state["accumulator"]
        acc.index_add_(0, unique, summed * summed)
        rows.index_add_(0, unique, -self.lr * summed / (acc[unique].sqrt() + self.eps))

    def step_shard(self, shard: EmbeddingShard, index: torch.Tensor, grad: torch.Tensor,
                   distinct: bool = False) -> None:
        self.step(shard.rows, shard.optimizer_state, index, grad, distinct)
