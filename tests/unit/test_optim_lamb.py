"""LAMB: fused == per-tensor == the paper's algorithm written plainly; checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch

import thinwire.optim._common as common
from thinwire.optim import LAMB

SHAPES = [(6, 4), (9,), (2, 3, 5), (16,), (1,)]
GROUPS = [
    dict(idx=[0, 1, 3], lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, trust_ratio=True),
    dict(idx=[2], lr=0.002, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.0, trust_ratio=False),
    dict(idx=[4], lr=0.05, betas=(0.5, 0.9), eps=1e-6, weight_decay=0.0, trust_ratio=True),
]


def make_problem(dtype, steps=5, seed=0):
    """Tensor 1 starts at zero weight; tensor 3 has a zero gradient on every step (so its
    update r is 0 unless weight decay makes it non-zero: both 'norm is 0' cases)."""
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    weights[1].zero_()
    grads = []
    for _ in range(steps):
        step = [torch.randn(s, generator=gen, dtype=torch.float64) * 0.1 for s in SHAPES]
        step[3].zero_()
        grads.append(step)
    return [w.to(dtype) for w in weights], [[g.to(dtype) for g in s] for s in grads]


def build(params, foreach):
    groups = [{**{k: v for k, v in g.items() if k != "idx"}, "params": [params[i] for i in g["idx"]]}
              for g in GROUPS]
    return LAMB(groups, foreach=foreach)


def run_lamb(weights, grads, foreach, opt_state=None):
    params = [w.clone().requires_grad_(True) for w in weights]
    opt = build(params, foreach)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params], opt


def lamb_formula(weights, grads):
    """You et al. 2019, Algorithm 2, per tensor, float64, Python floats."""
    ws = [w.double().clone() for w in weights]
    ms = [torch.zeros_like(w) for w in ws]
    vs = [torch.zeros_like(w) for w in ws]
    for t, step in enumerate(grads, start=1):
        for group in GROUPS:
            (b1, b2), lr, eps, wd = group["betas"], group["lr"], group["eps"], group["weight_decay"]
            for i in group["idx"]:
                g = step[i].double()
                ms[i] = b1 * ms[i] + (1 - b1) * g
                vs[i] = b2 * vs[i] + (1 - b2) * g * g
                m_hat = ms[i] / (1 - b1 ** t)
                v_hat = vs[i] / (1 - b2 ** t)
                r = m_hat / (torch.sqrt(v_hat) + eps) + wd * ws[i]
                w_norm, r_norm = ws[i].norm().item(), r.norm().item()
                trust = w_norm / r_norm if group["trust_ratio"] and w_norm > 0 and r_norm > 0 else 1.0
                ws[i] = ws[i] - lr * trust * r
    return ws


def assert_rel_close(actual, expected, rel, atol=0.0):
    for i, (a, e) in enumerate(zip(actual, expected)):
        err = (a.double() - e.double()).norm().item()
        scale = e.double().norm().item()
        assert err <= rel * scale + atol, f"tensor {i}: error {err:.3g}, norm {scale:.3g}"


def test_formula_moves_every_tensor():
    # Tensor 3 has a zero gradient but weight decay: it moves too. A problem that leaves a
    # tensor in place would make the comparisons below weaker.
    weights, grads = make_problem(torch.float64)
    final = lamb_formula(weights, grads)
    for i, (w0, w1) in enumerate(zip(weights, final)):
        assert not torch.equal(w0, w1), i


def test_fused_step_never_reads_a_tensor_on_the_host(monkeypatch):
    params = [torch.randn(6, 4, requires_grad=True), torch.zeros(4, requires_grad=True)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = LAMB(params, lr=0.1, weight_decay=1e-4, foreach=True)

    def refuse(*args, **kwargs):
        raise AssertionError("host synchronisation in the fused step")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    opt.step()
    opt.step()


@pytest.mark.parametrize("foreach", [True, False])
def test_matches_formula_float64(foreach):
    weights, grads = make_problem(torch.float64)
    actual, _ = run_lamb(weights, grads, foreach)
    assert_rel_close(actual, lamb_formula(weights, grads), 1e-12)


@pytest.mark.parametrize("foreach", [True, False])
def test_matches_formula_float32(foreach):
    weights, grads = make_problem(torch.float32)
    actual, _ = run_lamb(weights, grads, foreach)
    assert_rel_close(actual, lamb_formula(weights, grads), 1e-5)


@pytest.mark.parametrize("chunk_elements", [1, 30, 1 << 17])
def test_fused_equals_per_tensor(monkeypatch, chunk_elements):
    monkeypatch.setattr(common, "CPU_CHUNK_ELEMENTS", chunk_elements)
    weights, grads = make_problem(torch.float32, steps=6, seed=2)
    fused, _ = run_lamb(weights, grads, True)
    reference, _ = run_lamb(weights, grads, False)
    assert_rel_close(fused, reference, 1e-6)


def test_step_counts_are_per_tensor():
    # A tensor that misses a step gets its own bias correction, in both paths.
    results = []
    for foreach in (True, False):
        a = torch.ones(4, requires_grad=True)
        b = torch.ones(3, requires_grad=True)
        opt = LAMB([a, b], lr=0.1, foreach=foreach)
        for step in range(3):
            a.grad = torch.full((4,), 0.5)
            b.grad = torch.full((3,), -0.2) if step != 1 else None
            opt.step()
        assert opt.state[a]["step"] == 3 and opt.state[b]["step"] == 2
        results.append([a.detach().clone(), b.detach().clone()])
    assert_rel_close(results[0], results[1], 1e-6)


@pytest.mark.parametrize("foreach", [True, False])
def test_state_dict_round_trip(foreach):
    weights, grads = make_problem(torch.float32, steps=6, seed=4)
    straight, _ = run_lamb(weights, grads, foreach)
    half, opt = run_lamb(weights, grads[:3], foreach)
    saved = copy.deepcopy(opt.state_dict())
    resumed, opt2 = run_lamb(half, grads[3:], foreach, opt_state=saved)
    assert opt2.param_groups[1]["betas"] == (0.8, 0.99)
    for a, b in zip(resumed, straight):
        assert torch.equal(a, b)
