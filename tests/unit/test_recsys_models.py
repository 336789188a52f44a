"""Single-process parts of thinwire.recsys: models against textbook formulas, the sharded store,
sparse optimizers, bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from thinwire.recsys.data import Batch
from thinwire.recsys.models import ReferenceModel, make_model, roc_auc
from thinwire.recsys.sharded import EmbeddingShard, SparseOptimizer, init_rows, owner_of


def small_batch(values: bool = True) -> Batch:
    # 2 samples x 2 fields; sample 0 field 1 multi-hot, sample 1 field 0 empty
    ids = torch.tensor([0, 3, 4, 5, 2])
    offsets = torch.tensor([0, 1, 3, 3, 5])
    vals = torch.tensor([1.0, 0.5, 2.0, 1.5, 0.25], dtype=torch.float64) if values else None
    return Batch(ids, offsets, torch.tensor([1.0, 0.0]), 2, vals)


def test_fm_matches_pairwise_formula():
    model = make_model("fm", 2, k=3, dtype=torch.float64)
    ref = ReferenceModel(model, 6, seed=1, init_scale=0.5)
    batch = small_batch()
    logits, _ = ref.forward(batch)
    for s, (lo, hi) in enumerate([(0, 3), (3, 5)]):
        rows, x = ref.table[batch.ids[lo:hi]], batch.values[lo:hi]
        expect = float(model.dense.bias.detach()) + float((rows[:, 0] * x).sum())
        for i, j in itertools.combinations(range(hi - lo), 2):
            expect += float(rows[i, 1:] @ rows[j, 1:]) * float(x[i] * x[j])
        assert abs(float(logits[s]) - expect) < 1e-12


def test_deepfm_and_wide_deep_pool_per_field():
    batch = small_batch(values=False)
    for name in ("wide_deep", "deepfm"):
        model = make_model(name, 2, k=3, hidden=(4,), dtype=torch.float64)
        ref = ReferenceModel(model, 6, seed=2, init_scale=0.5)
        logits, _ = ref.forward(batch)
        t = ref.table
        e = torch.stack([torch.stack([t[0, 1:], t[3, 1:] + t[4, 1:]]),
                         torch.stack([torch.zeros(3, dtype=torch.float64),
                                      t[5, 1:] + t[2, 1:]])])
        lin = torch.stack([t[[0, 3, 4], 0].sum(), t[[5, 2], 0].sum()])
        expect = lin + model.dense.bias + model.dense.mlp(e.reshape(2, -1))[:, 0]
        if name == "deepfm":
            for s, members in enumerate([[0, 3, 4], [5, 2]]):
                for i, j in itertools.combinations(members, 2):
                    expect[s] = expect[s] + t[i, 1:] @ t[j, 1:]
        torch.testing.assert_close(logits, expect, atol=1e-12, rtol=0)


def test_lr_is_a_sum_of_weights():
    model = make_model("lr", 2, dtype=torch.float64)
    ref = ReferenceModel(model, 6, seed=0, init_scale=0.5)
    logits, _ = ref.forward(small_batch(values=False))
    assert abs(float(logits[1]) - float(ref.table[[5, 2], 0].sum())) < 1e-12


def test_rows_are_deterministic_and_owner_hash_spreads():
    ids = torch.arange(1000)
    torch.testing.assert_close(init_rows(ids, 4, 7, 0.1), init_rows(ids, 4, 7, 0.1))
    assert not torch.equal(init_rows(ids, 4, 7, 0.1), init_rows(ids, 4, 8, 0.1))
    assert init_rows(ids, 4, 7, 0.1).abs().max() <= 0.1
    counts = torch.bincount(owner_of(ids, 4), minlength=4)
    assert counts.min() > 200  # contiguous ids spread over all owners


def test_dynamic_and_fixed_shards_agree_and_round_trip():
    fixed = EmbeddingShard(3, rank=1, world=3, num_rows=50, seed=4)
    dynamic = EmbeddingShard(3, rank=1, world=3, seed=4)
    mine = torch.arange(50)[owner_of(torch.arange(50), 3) == 1]
    ids = mine[[3, 0, 3, 5]]
    index = dynamic.lookup(ids)  # creates the rows: read dynamic.rows after the lookup
    torch.testing.assert_close(fixed.rows[fixed.lookup(ids)], dynamic.rows[index])
    assert len(dynamic) == 3
    opt = SparseOptimizer("adagrad", 0.1)
    opt.step_shard(dynamic, dynamic.lookup(ids), torch.ones(4, 3))
    state = dynamic.state_dict()
    restored = EmbeddingShard(3, rank=1, world=3, seed=4)
    restored.load_state_dict(state)
    index = restored.lookup(ids)
    torch.testing.assert_close(restored.rows[index], dynamic.rows[dynamic.lookup(ids)])
    torch.testing.assert_close(restored.optimizer_state["accumulator"],
                               dynamic.optimizer_state["accumulator"])
    with pytest.raises(ValueError, match="shard state has rank=1, this shard has 0"):
        EmbeddingShard(3, rank=0, world=3).load_state_dict(state)


def test_sparse_optimizers_sum_duplicates():
    rows = torch.zeros(3, 2, dtype=torch.float64)
    SparseOptimizer("sgd", 0.5).step(rows, {}, torch.tensor([1, 1]),
                                     torch.ones(2, 2, dtype=torch.float64))
    assert rows[1].tolist() == [-1.0, -1.0] and rows[0].tolist() == [0.0, 0.0]
    rows, state = torch.zeros(2, 1, dtype=torch.float64), {}
    SparseOptimizer("adagrad", 0.5, eps=0.0).step(rows, state, torch.tensor([0, 0]),
                                                 torch.tensor([[1.0], [2.0]], dtype=torch.float64))
    assert rows[0, 0] == pytest.approx(-0.5) and state["accumulator"][0, 0] == 9.0


def test_bad_input_names_parameter_value_and_allowed():
    model = make_model("fm", 2, dtype=torch.float64)
    ref = ReferenceModel(model, 6)
    with pytest.raises(ValueError, match=r"batch.ids must be in \[0, num_rows=6\).*got 9"):
        ref.forward(Batch(torch.tensor([9, 1]), torch.tensor([0, 1, 2]), torch.tensor([1.0]), 2))
    with pytest.raises(ValueError, match="ids must be >= 0, got -3"):
        Batch(torch.tensor([-3, 1]), torch.tensor([0, 1, 2]), torch.tensor([1.0]), 2)
    with pytest.raises(ValueError, match="batch is empty"):
        Batch(torch.tensor([], dtype=torch.int64), torch.tensor([0]), torch.tensor([]), 2)
    with pytest.raises(ValueError, match=r"offsets must have .* = 5 entries, got 3"):
        Batch(torch.tensor([1, 2]), torch.tensor([0, 1, 2]), torch.tensor([1.0, 0.0]), 2)
    with pytest.raises(ValueError, match="num_fields=3, the model was built for fields=2"):
        ref.forward(Batch(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2, 3]),
                          torch.tensor([1.0]), 3))
    with pytest.raises(ValueError, match="model must be one of"):
        make_model("xgboost", 2)
    with pytest.raises(ValueError, match="optimizer must be 'sgd' or 'adagrad', got 'adam'"):
        SparseOptimizer("adam")
    with pytest.raises(ValueError, match="owned by rank"):
        other = int(torch.arange(20)[owner_of(torch.arange(20), 2) == 0][0])
        EmbeddingShard(2, rank=1, world=2, num_rows=20).lookup(torch.tensor([other]))


def test_roc_auc():
    assert roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert roc_auc(np.array([0, 1]), np.array([0.2, 0.9])) == 1.0
