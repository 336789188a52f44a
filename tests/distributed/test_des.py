"""DES and its baselines on 3 gloo ranks equal the unsharded single-process model (float64).

One launch runs every (model, method) configuration: starting ranks is the slow part."""

from __future__ import annotations

import itertools

import pytest
import torch

import des_workers as W
from harness import run_ranks
from thinwire.recsys.models import MODELS, ReferenceModel, dense_optimizer, make_model
from thinwire.recsys.sharded import SparseOptimizer

WORLD = 3
TOL = 1e-10

CONFIGS = [dict(model=m, method=meth, optimizer=opt, dynamic=dyn, values=vals)
           for m in MODELS
           for meth, opt, dyn, vals in (("des", "sgd", False, True),
                                        ("des", "adagrad", True, False),
                                        ("ps", "adagrad", False, True),
                                        ("torchrec_tw", "sgd", False, False),
                                        ("torchrec_rw", "adagrad", True, True))]


@pytest.fixture(scope="module")
def results():
    return run_ranks(W.equivalence, WORLD, CONFIGS)


def reference(config: dict):
    model = make_model(config["model"], W.FIELDS, k=W.K, hidden=W.HIDDEN, seed=3,
                       dtype=torch.float64)
    ref = ReferenceModel(model, W.FIELDS * W.VOCAB, seed=11, init_scale=0.3)
    sparse = SparseOptimizer(config["optimizer"], 0.1)
    dense = dense_optimizer(model, config["optimizer"], 0.1)
    steps = []
    for step in range(W.STEPS):
        logits, loss = ref.train_step(W.global_batch(step, config["values"]), sparse, dense)
        steps.append({"logits": logits, "loss": loss, "table_grad": ref.table_grad,
                      "dense_grad": {n: p.grad.clone() for n, p in
                                     model.dense.named_parameters()}})
    return ref, model, steps


@pytest.mark.parametrize("index", range(len(CONFIGS)),
                         ids=[f"{c['model']}-{c['method']}-{c['optimizer']}" for c in CONFIGS])
def test_equals_single_process(results, index):
    config = CONFIGS[index]
    ranks = [r[index] for r in results]
    ref, model, steps = reference(config)
    for step, expected in enumerate(steps):
        logits = torch.cat([r["steps"][step]["logits"] for r in ranks])
        torch.testing.assert_close(logits, expected["logits"], atol=TOL, rtol=0)
        loss = sum(r["steps"][step]["loss"] for r in ranks)
        assert abs(loss - expected["loss"]) < TOL
        grad = torch.zeros_like(ref.table)
        for r in ranks:  # each owner's row gradients, summed over the ranks that sent them
            grad.index_add_(0, r["steps"][step]["row_ids"], r["steps"][step]["row_grad"])
        torch.testing.assert_close(grad, expected["table_grad"], atol=TOL, rtol=0)
        assert expected["table_grad"].abs().sum() > 0
        for r in ranks:
            for name, g in expected["dense_grad"].items():
                torch.testing.assert_close(r["steps"][step]["dense_grad"][name], g,
                                           atol=TOL, rtol=0)
    # after the updates: every shard's rows equal the reference table's, and shards are disjoint
    seen = torch.cat([r["shard_ids"] for r in ranks])
    assert len(torch.unique(seen)) == len(seen)
    for r in ranks:
        torch.testing.assert_close(r["shard_rows"], ref.table[r["shard_ids"]], atol=TOL, rtol=0)
        for name, p in model.dense.named_parameters():
            torch.testing.assert_close(r["dense"][name], p.detach(), atol=TOL, rtol=0)


def test_des_sends_no_rows(results):
    """DES moves ids, partials and their gradients (and dense gradients), never rows."""
    for index, config in enumerate(CONFIGS):
        tags = set(results[0][index]["steps"][0]["bytes"])
        if config["method"] == "ps":
            assert {"ids", "rows", "row_grads"} <= tags
        else:
            assert tags <= {"ids", "partials", "partial_grads", "dense"}
            assert {"ids", "partials", "partial_grads"} <= tags


@pytest.mark.parametrize("index", range(len(CONFIGS)),
                         ids=[f"{c['model']}-{c['method']}" for c in CONFIGS])
def test_byte_counters_match_formulas(results, index):
    from thinwire.recsys.costs import expected_bytes

    config = CONFIGS[index]
    model = make_model(config["model"], W.FIELDS, k=W.K, hidden=W.HIDDEN, seed=3,
                       dtype=torch.float64)
    per_rank = W.GLOBAL_BATCH // WORLD
    for step in range(W.STEPS):
        batch = W.global_batch(step, config["values"])
        batches = [batch.slice(r * per_rank, (r + 1) * per_rank) for r in range(WORLD)]
        expected = expected_bytes(config["method"], model, batches, W.FIELDS * W.VOCAB)
        for rank in range(WORLD):
            measured = results[rank][index]["steps"][step]["bytes"]
            assert measured.keys() == expected[rank].keys()
            for tag, value in expected[rank].items():
                assert measured[tag] == pytest.approx(value, rel=1e-12), (rank, tag)
