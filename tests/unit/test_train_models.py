"""Every model of `thinwire train` on a batch of its own data set."""

import pytest
import torch

from thinwire.train import data, models


@pytest.mark.parametrize("name", list(models.MODELS))
def test_model_trains_on_its_data(name):
    ds = data.load(models.data_name(name))
    torch.manual_seed(0)
    model = models.build(name, seed=0)
    x, y = ds.train_x[:8], ds.train_y[:8]
    loss, correct, count = models.loss_and_correct(model, x, y)
    assert torch.isfinite(loss) and 0 <= int(correct) <= count
    assert count == (8 * 64 if ds.sequence else 8)
    # Near-uniform predictions at initialisation: loss close to log(classes).
    assert abs(float(loss.detach()) - torch.log(torch.tensor(float(ds.classes)))) < 1.5
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_build_is_deterministic_in_the_seed():
    a, b, c = models.build("lenet", 1), models.build("lenet", 1), models.build("lenet", 2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_compare_default_model_is_large_enough_for_bandwidth_to_decide():
    params = sum(p.numel() for p in models.build("widecnn", 0).parameters())
    assert params >= 3_000_000
