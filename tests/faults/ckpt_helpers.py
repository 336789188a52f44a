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


CLI_ARGS = ["--model", "mlp", "--algorithm", "hitopk", "--density", "0.05", "--max-iters", "6",
            "--batch-size", "16", "--no-progress", "--compute-probe-iters", "0",
            "--log-every", "100", "--eval-every", "0"]


def launch(world: int, args: list[str], timeout_s: float = 300.0) -> list[tuple[int, str]]:
    """``python -m thinwire.train ARGS`` on ``world`` ranks on loopback (the environment
    torchrun gives, without its agent); (exit status, stderr) per rank. A rank still running
    after ``timeout_s`` is killed and reported with status None (a hang: without the ranks'
    agreement a rank would wait in its next collective for gloo's 30 minutes; the limit is
    generous because the machines the tests run on may be shared and loaded)."""
    import socket
    import signal
    import subprocess
    import sys
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-m", "thinwire.train", *CLI_ARGS, *args],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
    deadline = time.monotonic() + timeout_s
    out = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            out.append((proc.returncode, err))
        except subprocess.TimeoutExpired:
            # python -m thinwire.train writes every thread's stack on SIGUSR1: the caller's
            # failure message then shows where the rank stood
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2.0)
            proc.kill()
            _, err = proc.communicate()
            out.append((None, err))
    return out


def damages() -> dict:
    """name -> (damage applied to a checkpoint file, what the refusal must say)."""
    def set_field(field, value):
        return lambda p: rewrite(p, lambda d: d.__setitem__(field, value))

    def model_shape(p):
        def change(d):
            key = next(iter(d["model"]))
            d["model"][key] = torch.zeros(3, 3)
        rewrite(p, change)

    def optimizer_shape(p):
        def change(d):
            d["optimizer"]["state"] = {0: {"momentum_buffer": torch.zeros(7)}}
        rewrite(p, change)

    def residual_type(p):
        rewrite(p, lambda d: d["hook"]["feedback"]["residuals"].__setitem__(0, "junk"))

    def nan_in(path_of):  # a NaN where the checksum is still right (issue 33, item 4)
        def damage(p):
            def change(d):
                tensor = path_of(d)
                tensor.view(-1)[0] = float("nan")
            rewrite(p, change)
        return damage

    def nan_base_lr(p):
        rewrite(p, lambda d: d["scheduler"].__setitem__("base_lrs", [float("nan")]))

    def huge_lr(p):
        rewrite(p, lambda d: d["optimizer"]["param_groups"][0].__setitem__("lr", float("inf")))

    return {
        "flipped-bytes": (flip_bytes, "checksum mismatch"),
        "truncated": (lambda p: p.write_bytes(p.read_bytes()[:1000]), "checksum mismatch"),
        "empty": (lambda p: p.write_bytes(b""), "empty file"),
        "foreign-bytes": (lambda p: p.write_bytes(b"\x89PNG\r\n" + bytes(500)), "bad header"),
        "plain-torch-save": (lambda p: torch.save({"model": {}}, p), "bad header"),
        "other-rank-file": (lambda p: p.write_bytes(safefile.encode(
            checkpoint.read(p, 0), checkpoint.MAGIC, checkpoint.file_key(1))),
            "belongs to 'train/rank1'"),
        "position-1e9": (set_field("position", 10 ** 9), "'position'"),
        "step-negative": (set_field("step", -7), "'step'"),
        "step-float": (set_field("step", 4.5), "'step'"),
        "model-shape": (model_shape, "shape"),
        "optimizer-shape": (optimizer_shape, "optimizer.state[0].momentum_buffer"),
        "hook-residual-not-tensor": (residual_type, "hook.feedback.residuals[0]"),
        "metrics-missing": (lambda p: rewrite(p, lambda d: d.pop("metrics")), "'metrics'"),
        "scheduler-setting-type": (lambda p: rewrite(p, lambda d: d["scheduler"]["lr_lambdas"][0]
                                                     .__setitem__("total_steps", "six")),
                                   "scheduler.lr_lambdas[0]"),
        "scheduler-nan-base-lr": (nan_base_lr, "scheduler.base_lrs"),
        "optimizer-inf-lr": (huge_lr, "optimizer.param_groups[0].lr"),
        "model-nan-weight": (nan_in(lambda d: next(iter(d["model"].values()))), "finite values"),
        "optimizer-nan-momentum": (nan_in(lambda d: next(iter(d["optimizer"]["state"].values()))
                                          ["momentum_buffer"]), "finite values"),
        "larger-than-the-model-allows": (lambda p: p.write_bytes(p.read_bytes() + bytes(
            70 * 2**20)), "more than a checkpoint of this model can hold"),
        "hook-nan-residual": (nan_in(lambda d: next(iter(
            d["hook"]["feedback"]["residuals"].values()))), "hook.feedback.residuals"),
        # checked before the fields: raised as a TypeError, it ended the rank before the ranks
        # agreed on a step
        "identity-not-a-dict": (set_field("identity", [1]), "its identity is a list"),
        # GradScaler's state loads after the model: a NaN scale was accepted, a missing key
        # failed there, half-way through the resume
        "scaler-nan-scale": (set_field("scaler", {"scale": float("nan"), "growth_factor": 2.0,
                                                  "backoff_factor": 0.5, "growth_interval": 2000,
                                                  "_growth_tracker": 0}), "'scaler'"),
        "scaler-missing-key": (set_field("scaler", {"scale": 1024.0}), "'scaler'"),
    }


def steps_per_epoch() -> int:
    from thinwire.train import data, models
    return len(data.rank_batches(len(data.load(models.data_name("mlp"))), 16, 0, 1, 0, 0))


def model_and_optimizer():
    from thinwire.train import loop, models
    cfg = config()
    module = models.build(cfg.model, cfg.seed)
    opt, sched = loop._optimizer(cfg, module, 6)
    return module, (opt, sched)


def fits(module, opt_and_sched):
    from thinwire.train import loop
    return loop._fits(config(), module, *opt_and_sched)
