"""A small real checkpoint (two files per rank: steps 4 and 2) and ways to damage it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from thinwire import safefile
from thinwire.train import TrainConfig, checkpoint, train

BASE = dict(model="mlp", algorithm="hitopk", density=0.05, max_iters=6, epochs=1,
            batch_size=16, eval_every=0, progress=False, compute_probe_iters=0, log_every=100)


def config(**changes) -> TrainConfig:
    return TrainConfig(**{**BASE, **changes})


def make(directory: Path, **changes) -> Path:
    """Train 4 steps saving every 2: rank0.pt is step 4, rank0.prev.pt step 2."""
    train(config(checkpoint=str(directory), checkpoint_every=2, stop_after=4, **changes))
    return directory


def copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def rewrite(path: Path, change, rank: int = 0) -> None:
    """Decode, change the payload, encode again with a valid checksum (a crafted file)."""
    payload = checkpoint.read(path, rank)
    change(payload)
    path.write_bytes(safefile.encode(payload, checkpoint.MAGIC, checkpoint.file_key(rank)))


def flip_bytes(path: Path, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(count):
        data[middle + i] ^= 0xFF
    path.write_bytes(bytes(data))


class Evil:
    """Unpickling this runs a shell command (what a crafted rank0.pt would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def evil_raw(path: Path, marker: Path) -> None:
    torch.save({"model": Evil(marker)}, path)


def evil_framed(path: Path, marker: Path, rank: int = 0) -> None:
    """The same pickle inside a valid thinwire header and checksum."""
    import hashlib
    import io
    buffer = io.BytesIO()
    torch.save({"key": checkpoint.file_key(rank), "data": {"model": Evil(marker)}}, buffer)
    payload = buffer.getvalue()
    path.write_bytes(checkpoint.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n"
                     + payload)
