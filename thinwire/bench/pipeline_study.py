"""The accuracy study (single-process emulation): pipelined backpropagation at batch size one,
with and without its repairs, against momentum SGD at batch B on the same samples in the same
order, with the batch-one hyper-parameters from the scaling rule."""

from __future__ import annotations

import logging
import time

import torch

from thinwire.pipeline import split
from thinwire.pipeline.config import DTYPES, PipelineConfig, Stream, scale_for_batch_one
from thinwire.pipeline.emulate import emulate
from thinwire.train.pipeline.data import load

log = logging.getLogger(__name__)


def sgd_baseline(cfg: PipelineConfig, batch: int, lr: float, momentum: float) -> dict:
    """Momentum SGD on the whole model, one step per ``batch`` consecutive samples of the
    batch-one stream of ``cfg`` (so it sees the same samples in the same order as ``pb``)."""
    ds = load(cfg)
    stream = Stream(PipelineConfig(**{**cfg.__dict__, "micro_batch": 1, "schedule": "pb"}),
                    len(ds))
    dtype = DTYPES[cfg.dtype]
    model = split.mlp(ds.train_x[0].numel(), cfg.hidden, ds.classes, seed=cfg.seed, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    start, samples, losses = time.perf_counter(), 0, []
    for epoch in range(cfg.epochs):
        first = epoch * stream.per_epoch
        for a in range(0, stream.per_epoch - batch + 1, batch):
            idx = torch.cat([stream.indices(first + a + j) for j in range(batch)])
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(ds.train_x[idx].to(dtype)),
                                                     ds.train_y[idx])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            samples += batch
    with torch.no_grad():
        acc = float((model(ds.test_x.to(dtype)).argmax(1) == ds.test_y).double().mean())
    return {"run": f"sgd batch {batch}", "schedule": "-", "sc": None, "lwp": None,
            "batch": batch, "lr": lr, "momentum": momentum, "samples": samples,
            "train_loss": sum(losses) / len(losses), "test_accuracy": acc,
            "wall_s": time.perf_counter() - start}


def accuracy_study(dataset: str, hidden: list[int], stages: int, epochs: int, batch: int,
                   lr: float, momentum: float, seeds: list[int],
                   variants=("sc+lwp", "none", "sc", "lwp")) -> list[dict]:
    lr1, m1 = scale_for_batch_one(lr, momentum, batch)
    rows = []
    for seed in seeds:
        base = PipelineConfig(schedule="pb", stages=stages, dataset=dataset, hidden=hidden,
                              micro_batch=1, epochs=epochs, lr=lr1, momentum=m1, seed=seed)
        row = sgd_baseline(base, batch, lr, momentum)
        rows.append({**row, "seed": seed, "delays": None})
        log.info("seed %d %s: %.4f", seed, row["run"], row["test_accuracy"])
        row = sgd_baseline(base, 1, lr1, m1)  # the scaling rule alone, no pipeline
        rows.append({**row, "seed": seed, "delays": None})
        log.info("seed %d %s: %.4f", seed, row["run"], row["test_accuracy"])
        for variant in variants:
            parts = variant.split("+")
            cfg = PipelineConfig(**{**base.__dict__, "sc": "sc" in parts,
                                    "lwp": "lwp" in parts or "lwp-w" in parts,
                                    "lwp_form": "weights" if "lwp-w" in parts else "velocity"})
            r = emulate(cfg, load(cfg))
            rows.append({"run": f"pb batch 1 {variant}", "schedule": "pb", "sc": cfg.sc,
                         "lwp": cfg.lwp, "batch": 1, "lr": lr1, "momentum": m1,
                         "samples": r["samples"], "train_loss": r["train_loss"],
                         "test_accuracy": r["test_accuracy"], "wall_s": r["wall_s"],
                         "seed": seed, "delays": r["delays"]})
            log.info("seed %d pb %s: %.4f", seed, variant, r["test_accuracy"])
    return rows
