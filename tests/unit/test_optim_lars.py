"""LARS: fused == per-tensor == the formula written plainly; checkpoints; no host syncs."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

import thinwire.optim._common as common
from thinwire.optim import LARS, param_groups

SHAPES = [(7, 5), (13,), (3, 4, 2), (64,), (1,), (20, 10)]


def make_problem(dtype: torch.dtype, steps: int = 4, seed: int = 0):
    """Initial weights and a gradient per step for SHAPES; tensor 1 starts at zero weight,
    tensor 3 always has a zero gradient (the two 'norm is 0' cases)."""
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    weights[1].zero_()
    grads = []
    for _ in range(steps):
        step = [torch.randn(s, generator=gen, dtype=torch.float64) * 0.1 for s in SHAPES]
        step[3].zero_()
        grads.append(step)
    return [w.to(dtype) for w in weights], [[g.to(dtype) for g in step] for step in grads]


# Three groups: trust scaling with weight decay, no trust (bias/norm style), other hyperparameters.
GROUPS = [
    dict(idx=[0, 1, 3], lr=0.5, momentum=0.9, weight_decay=1e-2, trust_coefficient=0.02,
         eps=1e-8, trust_ratio=True),
    dict(idx=[2], lr=0.1, momentum=0.8, weight_decay=0.0, trust_coefficient=0.001, eps=1e-8,
         trust_ratio=False),
    dict(idx=[4, 5], lr=1.5, momentum=0.0, weight_decay=5e-4, trust_coefficient=0.001,
         eps=1e-6, trust_ratio=True),
]


def run_lars(weights, grads, foreach):
    params = [w.clone().requires_grad_(True) for w in weights]
    groups = [{**{k: v for k, v in g.items() if k != "idx"}, "params": [params[i] for i in g["idx"]]}
              for g in GROUPS]
    opt = LARS(groups, lr=999.0, foreach=foreach)  # every group overrides lr
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params], opt


def lars_formula(weights, grads):
    """The update as the issue states it, per tensor, in float64 with Python floats."""
    ws = [w.double().clone() for w in weights]
    vs = [torch.zeros_like(w) for w in ws]
    for step in grads:
        for group in GROUPS:
            lr, m, wd = group["lr"], group["momentum"], group["weight_decay"]
            eta, eps = group["trust_coefficient"], group["eps"]
            for i in group["idx"]:
                w, g = ws[i], step[i].double()
                w_norm, g_norm = w.norm().item(), g.norm().item()
                if group["trust_ratio"] and w_norm > 0 and g_norm > 0:
                    trust = eta * w_norm / (g_norm + wd * w_norm + eps)
                else:
                    trust = 1.0
                vs[i] = m * vs[i] + lr * trust * (g + wd * w)
                ws[i] = w - vs[i]
    return ws


def assert_rel_close(actual, expected, rel):
    for i, (a, e) in enumerate(zip(actual, expected)):
        err = (a.double() - e.double()).norm().item()
        scale = max(e.double().norm().item(), 1e-12)
        assert err <= rel * scale, f"tensor {i}: relative error {err / scale:.3g} > {rel:g}"


def test_formula_is_not_trivial():
    # The problem must move every tensor, or the comparisons below would prove little.
    weights, grads = make_problem(torch.float64)
    final = lars_formula(weights, grads)
    for w0, w1 in zip(weights, final):
        assert not torch.equal(w0, w1)


@pytest.mark.parametrize("foreach", [True, False])
def test_matches_formula_float64(foreach):
    weights, grads = make_problem(torch.float64)
    actual, _ = run_lars(weights, grads, foreach)
    assert_rel_close(actual, lars_formula(weights, grads), 1e-12)


@pytest.mark.parametrize("foreach", [True, False])
def test_matches_formula_float32(foreach):
    weights, grads = make_problem(torch.float32)
    actual, _ = run_lars(weights, grads, foreach)
    assert_rel_close(actual, lars_formula(weights, grads), 1e-5)


@pytest.mark.parametrize("chunk_elements", [1, 50, 1 << 17])
def test_fused_equals_per_tensor(monkeypatch, chunk_elements):
    # Chunk sizes from one tensor per chunk to one chunk for all: the same result.
    monkeypatch.setattr(common, "CPU_CHUNK_ELEMENTS", chunk_elements)
    weights, grads = make_problem(torch.float32, steps=6, seed=3)
    fused, _ = run_lars(weights, grads, True)
    reference, _ = run_lars(weights, grads, False)
    assert_rel_close(fused, reference, 1e-6)


def test_mixed_dtypes_in_one_group():
    # float32 and float64 tensors in one group: two (device, dtype) buckets, same answer.
    gen = torch.Generator().manual_seed(1)
    results = []
    for foreach in (True, False):
        params = [torch.randn(5, 3, generator=gen).requires_grad_(True),
                  torch.randn(4, generator=gen, dtype=torch.float64).requires_grad_(True)]
        opt = LARS(params, lr=0.3, weight_decay=1e-3, trust_coefficient=0.01, foreach=foreach)
        for _ in range(3):
            for p in params:
                p.grad = torch.ones_like(p) * 0.5
            opt.step()
        results.append([p.detach() for p in params])
        gen.manual_seed(1)
    assert_rel_close(results[0], results[1], 1e-6)
    assert results[0][1].dtype == torch.float64


def test_parameters_without_grad_are_untouched():
    a = torch.randn(4, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    before = b.detach().clone()
    opt = LARS([a, b], lr=0.1)
    a.grad = torch.ones(4)
    opt.step()
    assert torch.equal(b.detach(), before)
    assert b not in opt.state and "momentum_buffer" in opt.state[a]


@pytest.mark.parametrize("foreach", [True, False])
def test_state_dict_round_trip(foreach):
    weights, grads = make_problem(torch.float32, steps=6, seed=5)
    # Straight through: 6 steps.
    straight, _ = run_lars(weights, grads, foreach)
    # 3 steps, checkpoint, a fresh optimizer on fresh tensors, load, 3 more steps.
    half, opt = run_lars(weights, grads[:3], foreach)
    saved = copy.deepcopy(opt.state_dict())
    params = [w.clone().requires_grad_(True) for w in half]
    groups = [{**{k: v for k, v in g.items() if k != "idx"}, "params": [params[i] for i in g["idx"]]}
              for g in GROUPS]
    resumed = LARS(groups, lr=999.0, foreach=foreach)
    resumed.load_state_dict(saved)
    assert resumed.param_groups[1]["trust_ratio"] is False
    for step in grads[3:]:
        for p, g in zip(params, step):
            p.grad = g.clone()
        resumed.step()
    for a, b in zip(params, straight):
        assert torch.equal(a.detach(), b)


class _CountTorchCalls(TorchFunctionMode):
    """Counts torch calls that do work; attribute reads (`p.grad`) and `numel()` are metadata
    the bookkeeping loop may read per tensor."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name not in ("__get__", "numel"):
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _calls_for(n_tensors: int, foreach: bool) -> int:
    params = [torch.randn(3, requires_grad=True) for _ in range(n_tensors)]
    for p in params:
        p.grad = torch.randn(3)
    opt = LARS(param_groups_like(params), lr=0.1, weight_decay=1e-4, foreach=foreach)
    opt.step()  # state created
    with _CountTorchCalls() as mode:
        opt.step()
    return mode.calls


def param_groups_like(params):
    half = len(params) // 2
    return [{"params": params[:half]},
            {"params": params[half:], "weight_decay": 0.0, "trust_ratio": False}]


def test_fused_issues_a_fixed_number_of_torch_calls():
    # The fused path has no Python loop over tensors: 10 or 200 tensors, the same calls.
    # (All tensors are tiny, so they fall in one CPU chunk.)
    assert _calls_for(10, True) == _calls_for(200, True)
    # The reference does loop, which is what makes it the reference.
    assert _calls_for(200, False) > _calls_for(10, False)


def test_fused_step_never_reads_a_tensor_on_the_host(monkeypatch):
    params = [torch.randn(6, 4, requires_grad=True), torch.zeros(4, requires_grad=True)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = LARS(params, lr=0.1, weight_decay=1e-4, foreach=True)

    def refuse(*args, **kwargs):
        raise AssertionError("host synchronisation in the fused step")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    opt.step()
    opt.step()


def test_closure_is_called_and_returned():
    p = torch.tensor([1.0, 2.0], requires_grad=True)
    opt = LARS([p], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (p ** 2).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert math.isclose(loss.item(), 5.0)
    assert not torch.equal(p.detach(), torch.tensor([1.0, 2.0]))


def test_param_groups_model_trains():
    # A real model through param_groups: the loss goes down.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 1))
    x = torch.randn(64, 8)
    y = x.sum(dim=1, keepdim=True)
    opt = LARS(param_groups(model, weight_decay=1e-4), lr=0.05, trust_coefficient=1.0)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0]
