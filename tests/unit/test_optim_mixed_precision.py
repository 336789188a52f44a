"""GradScaler (unscale_ then step, skipped on inf), fp32 master weights for bf16/fp16 models,
and bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from thinwire.optim import LAMB, LARS, MasterWeights, param_groups


def tiny_model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 1)).to(dtype)


def batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True)


@pytest.mark.parametrize("cls", [LARS, LAMB])
def test_grad_scaler_unscales_then_steps(cls):
    # With a loss scale of 2**10 and unscale_ before step, the step equals the unscaled step.
    x, y = batch()
    plain, scaled = tiny_model(), tiny_model()
    opt_plain = cls(param_groups(plain, weight_decay=1e-4), lr=0.05)
    opt_scaled = cls(param_groups(scaled, weight_decay=1e-4), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    for _ in range(3):
        nn.functional.mse_loss(plain(x), y).backward()
        opt_plain.step()
        opt_plain.zero_grad()
        scaler.scale(nn.functional.mse_loss(scaled(x), y)).backward()
        scaler.unscale_(opt_scaled)
        scaler.step(opt_scaled)
        scaler.update()
        opt_scaled.zero_grad()
    for a, b in zip(plain.parameters(), scaled.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert scaler.get_scale() == 2.0 ** 10


@pytest.mark.parametrize("cls", [LARS, LAMB])
def test_grad_scaler_skips_step_on_inf(cls):
    x, y = batch()
    model = tiny_model()
    opt = cls(param_groups(model), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
    model[0].weight.grad[0, 0] = float("inf")
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert len(opt.state) == 0  # no momentum / moments created by a skipped step
    assert scaler.get_scale() == 2.0 ** 9


def test_master_weights_equal_an_fp32_run_on_the_same_gradients():
    # bf16 model + fp32 masters == LARS on fp32 tensors fed the (bf16) gradients, exactly;
    # the model holds the masters rounded to bf16.
    x, y = batch()
    model = tiny_model(torch.bfloat16)
    master = MasterWeights(param_groups(model, weight_decay=1e-4))
    opt = LARS(master.param_groups, lr=0.1, trust_coefficient=0.01)
    shadow = [p.detach().float().clone().requires_grad_(True) for p in master.model_params]
    shadow_of = dict(zip(map(id, master.master_params), shadow))
    shadow_groups = [{**g, "params": [shadow_of[id(m)] for m in g["params"]]}
                     for g in master.param_groups]
    shadow_opt = LARS(shadow_groups, lr=0.1, trust_coefficient=0.01)
    for _ in range(4):
        model.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x.bfloat16()), y.bfloat16()).backward()
        for s, p in zip(shadow, master.model_params):
            s.grad = p.grad.float()
        master.copy_grads_to_master()
        assert all(m.grad.dtype == torch.float32 for m in master.master_params)
        opt.step()
        master.copy_master_to_model()
        shadow_opt.step()
    for m, s, p in zip(master.master_params, shadow, master.model_params):
        assert torch.equal(m.detach(), s.detach())
        assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), m.detach().bfloat16())


def test_master_weights_keep_updates_that_bf16_rounds_away():
    # Updates far below a bf16 ulp: stepping the bf16 weights directly loses all of them,
    # the fp32 masters accumulate them until the bf16 model moves.
    p_direct = torch.full((64,), 1.0, dtype=torch.bfloat16, requires_grad=True)
    p_model = torch.full((64,), 1.0, dtype=torch.bfloat16, requires_grad=True)
    master = MasterWeights([p_model])
    direct = LARS([{"params": [p_direct], "trust_ratio": False}], lr=1e-4, momentum=0.0)
    opt = LARS([{"params": master.master_params, "trust_ratio": False}], lr=1e-4, momentum=0.0)
    for _ in range(100):
        p_direct.grad = torch.ones(64, dtype=torch.bfloat16)
        p_model.grad = torch.ones(64, dtype=torch.bfloat16)
        direct.step()
        master.copy_grads_to_master()
        opt.step()
        master.copy_master_to_model()
    assert torch.all(p_direct.detach() == 1.0)  # 1 - 1e-4 rounds back to 1 in bf16
    assert torch.allclose(master.master_params[0].detach(), torch.full((64,), 0.99), atol=1e-5)
    assert torch.all(p_model.detach() < 1.0)


def test_fp16_model_with_grad_scaler_and_master_weights_trains():
    # The whole loop of the LARS docstring on CPU: fp16 model, fp32 masters, GradScaler.
    x, y = batch()
    model = tiny_model(torch.float16)
    master = MasterWeights(param_groups(model, weight_decay=1e-4))
    opt = LARS(master.param_groups, lr=0.05, trust_coefficient=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    losses = []
    for _ in range(30):
        loss = nn.functional.mse_loss(model(x.half()).float(), y)
        scaler.scale(loss).backward()
        master.copy_grads_to_master()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        master.copy_master_to_model()
        model.zero_grad(set_to_none=True)
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_autocast_bf16_with_fp32_model():
    x, y = batch()
    model = tiny_model()
    opt = LAMB(param_groups(model, weight_decay=1e-2), lr=0.02)
    losses = []
    for _ in range(30):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses[-1] < 0.2 * losses[0]


def test_master_weights_state_dict_round_trip():
    model = tiny_model(torch.bfloat16)
    master = MasterWeights(model.parameters())
    with torch.no_grad():
        master.master_params[0].add_(1e-4)  # a change bf16 cannot hold
    state = master.state_dict()
    other = MasterWeights(tiny_model(torch.bfloat16, seed=1).parameters())
    other.load_state_dict(state)
    for a, b in zip(master.master_params, other.master_params):
        assert torch.equal(a, b)
    assert torch.equal(other.model_params[0], master.master_params[0].detach().bfloat16())
    with pytest.raises(ValueError, match="state has 1 master weights, this object has 6"):
        other.load_state_dict({"master_params": state["master_params"][:1]})


@pytest.mark.parametrize("cls, kwargs, error, message", [
    (LARS, dict(lr=-1), ValueError, "lr must be >= 0, got -1"),
    (LARS, dict(lr=0.1, momentum=-0.5), ValueError, "momentum must be >= 0, got -0.5"),
    (LARS, dict(lr=0.1, weight_decay=-1e-4), ValueError, "weight_decay must be >= 0, got -0.0001"),
    (LARS, dict(lr=0.1, trust_coefficient=-0.001), ValueError, "trust_coefficient must be >= 0, got -0.001"),
    (LARS, dict(lr=0.1, eps=float("nan")), ValueError, "eps must be >= 0, got nan"),
    (LARS, dict(lr="0.1"), TypeError, "lr must be a real number, got str '0.1'"),
    (LARS, dict(lr=0.1, foreach="yes"), TypeError, "foreach must be True, False or None, got 'yes'"),
    (LAMB, dict(lr=-1), ValueError, "lr must be >= 0, got -1"),
    (LAMB, dict(betas=(0.9, 1.0)), ValueError, r"beta2 must be in \[0, 1\), got 1"),
    (LAMB, dict(betas=0.9), TypeError, r"betas must be a pair \(beta1, beta2\), got 0.9"),
    (LAMB, dict(weight_decay=-0.01), ValueError, "weight_decay must be >= 0, got -0.01"),
])
def test_bad_hyperparameters(cls, kwargs, error, message):
    with pytest.raises(error, match=message):
        cls([torch.zeros(2, requires_grad=True)], **kwargs)


def test_bad_group_override():
    p, q = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="momentum must be >= 0, got -1"):
        LARS([{"params": [p]}, {"params": [q], "momentum": -1}], lr=0.1)
    with pytest.raises(TypeError, match="trust_ratio must be a bool"):
        LARS([{"params": [p], "trust_ratio": "no"}], lr=0.1)


@pytest.mark.parametrize("cls", [LARS, LAMB])
@pytest.mark.parametrize("foreach", [True, False])
def test_sparse_gradient_is_refused(cls, foreach):
    emb = nn.Embedding(10, 4, sparse=True)
    dense = torch.zeros(3, requires_grad=True)
    first = torch.ones(2, requires_grad=True)
    opt = cls([{"params": [first]}, {"params": [dense, emb.weight]}], lr=0.1, foreach=foreach)
    emb(torch.tensor([1, 2])).sum().backward()
    dense.grad = torch.ones(3)
    first.grad = torch.ones(2)
    with pytest.raises(TypeError, match=r"does not support sparse gradients: parameter 1 of "
                                        r"param group 1 \(shape \(10, 4\)\)"):
        opt.step()
    assert len(opt.state) == 0  # refused before any group was updated
    assert torch.equal(first.detach(), torch.ones(2))


def test_master_weights_bad_input():
    with pytest.raises(ValueError, match="params is empty"):
        MasterWeights([])
    with pytest.raises(TypeError, match="got a single Tensor"):
        MasterWeights(torch.zeros(2))
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        MasterWeights([torch.zeros(2)], dtype=torch.int32)
