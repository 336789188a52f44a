"""param_groups, the warm-up schedules and the linear scaling rule."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from thinwire.optim import (LARS, WarmupCosine, WarmupPoly, linear_scaled_lr, param_groups,
                            warmup_cosine, warmup_poly)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.ln = nn.LayerNorm(8)
        self.gn = nn.GroupNorm(2, 8)
        self.fc = nn.Linear(8, 4)
        self.head = nn.Linear(4, 2)
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)


def ids(params):
    return {id(p) for p in params}


def test_param_groups_split():
    model = Block()
    decay, no_decay = param_groups(model, weight_decay=5e-5)
    assert decay["weight_decay"] == 5e-5 and "trust_ratio" not in decay
    assert no_decay["weight_decay"] == 0.0 and no_decay["trust_ratio"] is False
    assert ids(decay["params"]) == ids([model.conv.weight, model.fc.weight, model.head.weight])
    assert ids(no_decay["params"]) == ids([
        model.bn.weight, model.bn.bias, model.ln.weight, model.ln.bias, model.gn.weight,
        model.gn.bias, model.fc.bias, model.head.bias])


def test_param_groups_shared_parameter_once():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    decay, no_decay = param_groups(model)
    assert len(decay["params"]) == 1 and len(no_decay["params"]) == 2
    LARS(param_groups(model), lr=0.1)  # torch.optim refuses duplicates: must not raise


def test_param_groups_bad_input():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        param_groups([torch.zeros(2)])
    with pytest.raises(ValueError, match="weight_decay must be >= 0, got -0.1"):
        param_groups(nn.Linear(2, 2), weight_decay=-0.1)
    with pytest.raises(ValueError, match="no trainable parameters"):
        param_groups(nn.Linear(2, 2).requires_grad_(False))


def test_linear_scaled_lr():
    assert linear_scaled_lr(0.1, 8192) == pytest.approx(3.2)
    assert linear_scaled_lr(0.1, 1024, base_batch_size=1024) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        linear_scaled_lr(0.1, 0)
    with pytest.raises(ValueError, match="base_lr must be >= 0, got -1"):
        linear_scaled_lr(-1, 256)


def test_warmup_poly_values():
    f = WarmupPoly(total_steps=10, warmup_steps=4, power=2.0, end_factor=0.1)
    assert [f(s) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f(4) == pytest.approx(1.0)
    # step 7: progress 3/6 -> 0.1 + 0.9 * 0.5**2
    assert f(7) == pytest.approx(0.1 + 0.9 * 0.25)
    assert f(10) == pytest.approx(0.1) and f(1000) == pytest.approx(0.1)
    decay = [f(s) for s in range(4, 11)]
    assert all(a > b for a, b in zip(decay, decay[1:]))


def test_warmup_cosine_values():
    f = WarmupCosine(total_steps=12, warmup_steps=2)
    assert f(0) == pytest.approx(0.5) and f(2) == pytest.approx(1.0)
    assert f(7) == pytest.approx(0.5)  # half way through the decay
    assert f(12) == 0.0


def test_no_warmup_starts_at_full_lr():
    assert WarmupPoly(5)(0) == 1.0 and WarmupCosine(5)(0) == 1.0


def test_schedulers_drive_the_optimizer_and_round_trip():
    p = torch.zeros(2, requires_grad=True)
    opt = LARS([p], lr=2.0)
    sched = warmup_poly(opt, total_steps=8, warmup_steps=2)
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == pytest.approx([1.0, 2.0, 2.0])
    state = sched.state_dict()
    opt2 = LARS([p], lr=2.0)
    sched2 = warmup_poly(opt2, total_steps=8, warmup_steps=2)
    sched2.load_state_dict(state)
    sched.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])
    cos = warmup_cosine(LARS([p], lr=1.0), total_steps=4)
    assert cos.get_last_lr() == [1.0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(total_steps=0), "total_steps must be an integer >= 1, got 0"),
    (dict(total_steps=10, warmup_steps=11), r"warmup_steps must be an integer in \[0, total_steps=10\], got 11"),
    (dict(total_steps=10, power=-1.0), "power must be >= 0, got -1"),
    (dict(total_steps=10, end_factor=1.5), r"end_factor must be in \[0, 1\], got 1.5"),
])
def test_schedule_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WarmupPoly(**kwargs)
