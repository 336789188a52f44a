"""Model-parallel tick-tock on the pipeline engine: the weights after training equal a
single-process float64 reference that applies, per group of M micro-batches, momentum SGD with
the mean gradient of those micro-batches (what the tick and tock waves compute together); the
two copies of every partition stay bitwise equal."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from harness import run_ranks
from thinwire.pipeline.config import DTYPES, PipelineConfig, Stream, build_stages
from thinwire.train.pipeline.data import load
from thinwire.pipeline.split import mlp

BASE = dict(schedule="ticktock", hidden=[16, 12, 10], micro_batch=3, train_samples=48, lr=0.05,
            momentum=0.9, dtype="float64", timeout_s=120)


def _reference(cfg: PipelineConfig) -> list[list[torch.Tensor]]:
    """Per stage, its parameters after training the whole model in one process."""
    ds = load(cfg)
    dtype = DTYPES[cfg.dtype]
    stream = Stream(cfg, len(ds))
    model = mlp(ds.train_x[0].numel(), cfg.hidden, ds.classes, seed=cfg.seed, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    M = cfg.group
    for g in range(stream.total // M):
        opt.zero_grad()
        for i in range(g * M, (g + 1) * M):
            idx = stream.indices(i)
            (F.cross_entropy(model(ds.train_x[idx].to(dtype)), ds.train_y[idx]) / M).backward()
        opt.step()
    flat = [p.detach() for p in model.parameters()]
    stages = build_stages(cfg, ds.train_x[0].numel(), ds.classes)
    out, at = [], 0
    for stage in stages:
        n = len(list(stage.parameters()))
        out.append(flat[at:at + n])
        at += n
    return out


@pytest.mark.parametrize("stages,group", [(4, 4), (3, 2)])
def test_ticktock_equals_single_process_float64_reference(stages, group):
    kwargs = dict(BASE, stages=stages, group=group)
    by_rank = run_ranks(_fn(), stages, kwargs)
    want = _reference(PipelineConfig(**kwargs))
    for r, got in enumerate(by_rank):
        assert len(got["params"]) == len(want[r])
        for a, b in zip(got["params"], want[r]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        mate = by_rank[stages - 1 - r]
        assert got["tock_partition"] == stages - 1 - r
        for a, b in zip(got["params"], mate["tock_params"]):
            assert torch.equal(a, b), f"the two copies of partition {r} differ"
    # both waves ran: the tock wave's forwards are on every rank too
    M = group
    for got in by_rank:
        waves = {(i % M) < M // 2 for k, i, *_ in got["events"] if k == "F"}
        assert waves == {True, False}
    assert by_rank[-1]["test_accuracy"] is not None


def _fn():
    import pipeline_workers

    return pipeline_workers.train_ticktock
