"""Rank functions for tests/distributed/test_des.py (imported by name in spawned processes)."""

from __future__ import annotations

import torch

from thinwire.recsys.baselines import make_method
from thinwire.recsys.comm import Comm
from thinwire.recsys.data import Batch, synthetic

FIELDS, K, HIDDEN, VOCAB = 3, 4, (8,), 40
GLOBAL_BATCH, STEPS = 12, 2


def global_batch(step: int, with_values: bool) -> Batch:
    """The same global batch on every rank and in the test: multi-hot, some empty bags."""
    data = synthetic(GLOBAL_BATCH * STEPS, fields=FIELDS, vocab_per_field=VOCAB,
                     mean_multi_hot=2.0, multi_hot_fields=2, seed=5)
    batch = data.batch(list(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)))
    lengths = batch.offsets.diff()
    lengths[3] = 0  # an empty bag (sample 1, field 0)
    ids = torch.cat([batch.ids[int(batch.offsets[b]):int(batch.offsets[b]) + int(lengths[b])]
                     for b in range(len(lengths))])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    values = None
    if with_values:
        values = 0.5 + torch.arange(len(ids), dtype=torch.float64).remainder(7) / 7
    return Batch(ids, offsets, batch.labels, FIELDS, values)


def run_method(rank: int, world: int, config: dict) -> dict:
    from thinwire.recsys.models import make_model

    model = make_model(config["model"], FIELDS, k=K, hidden=HIDDEN, seed=3,
                       dtype=torch.float64)
    method = make_method(config["method"], model, Comm(), FIELDS * VOCAB, config["optimizer"],
                         lr=0.1, seed=11, init_scale=0.3, dynamic=config["dynamic"])
    per_rank = GLOBAL_BATCH // world
    steps = []
    for step in range(STEPS):
        batch = global_batch(step, config["values"]).slice(rank * per_rank,
                                                           (rank + 1) * per_rank)
        method.counter.reset()
        logits, loss = method.train_step(batch, GLOBAL_BATCH)
        ids, grad = method.last_row_grad
        steps.append({"logits": logits, "loss": loss, "row_ids": ids, "row_grad": grad,
                      "dense_grad": {n: p.grad.clone() for n, p in
                                     model.dense.named_parameters()},
                      "bytes": dict(method.counter.bytes)})
    state = method.shard.state_dict()
    return {"steps": steps, "shard_ids": state["ids"], "shard_rows": state["rows"],
            "dense": {n: p.detach().clone() for n, p in model.dense.named_parameters()}}


def equivalence(rank: int, world: int, configs: list[dict]) -> list[dict]:
    torch.set_default_dtype(torch.float64)
    return [run_method(rank, world, config) for config in configs]
