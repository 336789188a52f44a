"""Checkpoints: one file per rank (residuals differ between ranks), written atomically.

A checkpoint holds the model, the optimizer, the schedule, the loss scaler, the hook's state
(thinwire's residuals, or PowerSGD's error and P/Q memories), and the data position (epoch and
step within it; batches are a function of seed and epoch, so that is enough to continue with the
same batches), plus the identity of the run it belongs to, checked before anything is loaded.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from thinwire.train.grad_sync import is_sparse

# Resuming with another value of any of these would silently train something else.
IDENTITY = ("model", "algorithm", "density", "selector", "powersgd_rank", "optimizer",
            "batch_size", "seed", "momentum_correction", "dense_warmup_steps")


def rank_file(directory: str | os.PathLike, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.pt"


def identity(config) -> dict:
    out = {name: getattr(config, name) for name in IDENTITY}
    if not is_sparse(config.algorithm):  # density and selector do not matter to dense ones
        for name in ("density", "selector", "momentum_correction", "dense_warmup_steps"):
            out.pop(name)
    if config.algorithm != "powersgd":
        out.pop("powersgd_rank")
    return out


def save(directory: str | os.PathLike, rank: int, payload: dict) -> Path:
    path = rank_file(directory, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load(directory: str | os.PathLike, rank: int, config, world_size: int) -> dict:
    """This rank's checkpoint, after checking that it belongs to a run like ``config``."""
    path = rank_file(directory, rank)
    if not path.is_file():
        raise FileNotFoundError(f"--resume {directory}: no checkpoint for rank {rank} "
                                f"(expected {path})")
    # weights_only=False: PowerSGD's state holds a numpy RandomState. Load only your own files.
    payload = torch.load(path, map_location="cpu", weights_only=False)
    saved = payload.get("identity", {})
    if is_sparse(config.algorithm):  # written before these options existed: they were off
        saved = {"momentum_correction": False, "dense_warmup_steps": 0, **saved}
    mine = identity(config)
    for key in ("model", "algorithm"):  # the two most likely mistakes get their own message
        if saved.get(key) != mine.get(key):
            raise ValueError(f"--resume {directory}: the checkpoint is for --{key} "
                             f"{saved.get(key)!r}, this run has --{key} {mine.get(key)!r}; "
                             f"resume with --{key} {saved.get(key)} or start a new run")
    if saved != mine:
        diff = {k: (saved.get(k), mine.get(k)) for k in set(saved) | set(mine)
                if saved.get(k) != mine.get(k)}
        raise ValueError(f"--resume {directory}: checkpoint differs from this run in "
                         + ", ".join(f"--{k.replace('_', '-')} (checkpoint {a!r}, now {b!r})"
                                     for k, (a, b) in sorted(diff.items())))
    if payload.get("world_size") != world_size:
        raise ValueError(f"--resume {directory}: the checkpoint was written by "
                         f"{payload.get('world_size')} ranks, this run has {world_size}; "
                         "residuals are per rank, so the world size must match")
    return payload
