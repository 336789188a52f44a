"""Pipeline schedules, delays, SC/LWP arithmetic, stage semantics and the emulation's baselines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thinwire.pipeline import schedules, split
from thinwire.pipeline.config import PipelineConfig, Stream, scale_for_batch_one
from thinwire.train.pipeline.data import load
from thinwire.pipeline.emulate import emulate
from thinwire.pipeline.optim import StageSGD
from thinwire.pipeline.stage import StageWorker


@pytest.mark.parametrize("S", [2, 3, 4, 5, 6])
def test_pb_delays_equal_formula(S):
    ops = schedules.build("pb", S, 5 * S)
    assert schedules.measured_delays(ops) == [2 * (S - 1 - s) for s in range(S)]
    assert [schedules.delay_formula("pb", S, s) for s in range(S)] == [2 * (S - 1 - s)
                                                                       for s in range(S)]
    # One forward, one backward and one update per micro-batch on every stage.
    for stage_ops in ops:
        assert sorted(i for k, i in stage_ops if k == "F") == list(range(5 * S))
        assert sorted(i for k, i in stage_ops if k == "B") == list(range(5 * S))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("S", [2, 4, 6])
def test_flushed_schedules_have_no_delay_and_one_update_per_group(schedule, S):
    ops = schedules.build(schedule, S, 12, group=4)
    assert schedules.measured_delays(ops) == [0] * S
    for stage_ops in ops:
        assert [i for k, i in stage_ops if k == "U"] == [0, 1, 2]


def test_1f1b_keeps_few_micro_batches_in_flight():
    ops = schedules.build("1f1b", 4, 8, group=8)[0]
    in_flight = peak = 0
    for kind, _ in ops:
        in_flight += {"F": 1, "B": -1, "U": 0}[kind]
        peak = max(peak, in_flight)
    assert peak == 4  # S - 1 warm-up forwards + the one of the steady state (gpipe: 8)


def _reference_sc_lwp(w0, grads, lr, m, D, sc, lwp, form):
    """float64 transcription of the update formulas, independent of StageSGD."""
    w, v, prev = w0.copy(), np.zeros_like(w0), None
    predicted = []
    for g in grads:
        if not lwp or prev is None:
            predicted.append(w.copy())
        elif form == "weights":
            predicted.append(w + D * (w - prev))
        else:
            predicted.append(w - lr * D * v)
        v = m * v + g
        step = (m ** D * v + (1 - m ** D) / (1 - m) * g) if sc else v
        prev, w = w, w - lr * step
    return w, predicted


@pytest.mark.parametrize("form", ["velocity", "weights"])
@pytest.mark.parametrize("sc,lwp", [(True, True), (True, False), (False, True), (False, False)])
def test_sc_and_lwp_equal_float64_transcription(sc, lwp, form):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(7)
    grads = [rng.standard_normal(7) for _ in range(6)]
    lr, m, D = 0.1, 0.9, 3
    want, want_pred = _reference_sc_lwp(w0, grads, lr, m, D, sc, lwp, form)
    p = torch.tensor(w0)
    opt = StageSGD([p], lr=lr, momentum=m, delay=D, spike_compensation=sc, weight_prediction=lwp,
                   prediction=form)
    for g, pred in zip(grads, want_pred):
        np.testing.assert_allclose(opt.forward_weights()[0].numpy(), pred, rtol=1e-13, atol=1e-13)
        opt.accumulate([torch.tensor(g)])
        opt.step()
    np.testing.assert_allclose(p.numpy(), want, rtol=1e-13, atol=1e-13)


def test_lwp_forms_agree_without_sc():
    torch.manual_seed(0)
    a = torch.randn(5, dtype=torch.float64)
    b = a.clone()
    va = StageSGD([a], lr=0.1, momentum=0.9, delay=4, spike_compensation=False)
    wb = StageSGD([b], lr=0.1, momentum=0.9, delay=4, spike_compensation=False,
                  prediction="weights")
    for _ in range(3):
        g = torch.randn(5, dtype=torch.float64)
        for opt in (va, wb):
            opt.accumulate([g])
            opt.step()
        torch.testing.assert_close(va.forward_weights()[0], wb.forward_weights()[0],
                                   rtol=1e-13, atol=1e-13)


def test_sc_without_delay_is_momentum_sgd():
    torch.manual_seed(0)
    a = torch.randn(5, dtype=torch.float64)
    b = a.clone().requires_grad_(True)
    opt = StageSGD([a], lr=0.1, momentum=0.9, delay=0)
    ref = torch.optim.SGD([b], lr=0.1, momentum=0.9)
    for _ in range(4):
        g = torch.randn(5, dtype=torch.float64)
        opt.accumulate([g])
        opt.step()
        b.grad = g.clone()
        ref.step()
    assert torch.equal(a, b.detach())


def test_backward_uses_current_weights_and_stored_activations():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, bias=False).double()
    w0 = lin.weight.detach().clone()
    worker = StageWorker(lin, dict(lr=0.5, momentum=0.0), first=False, last=False)
    x = torch.randn(4, 3, dtype=torch.float64)
    worker.forward(0, x)
    worker.opt.accumulate([torch.ones_like(w0)])
    worker.update()  # the weights move between this micro-batch's forward and its backward
    w1 = lin.weight.detach().clone()
    assert not torch.equal(w0, w1)
    g = torch.randn(4, 2, dtype=torch.float64)
    grad_x = worker.backward(0, g)
    torch.testing.assert_close(grad_x, g @ w1, rtol=0, atol=1e-14)
    torch.testing.assert_close(worker.opt.grad_sum[0], g.T @ x, rtol=0, atol=1e-14)


def _plain_sgd(cfg: PipelineConfig, batch_of: int) -> list[torch.Tensor]:
    """Single-process momentum SGD on the whole model, ``batch_of`` consecutive micro-batches of
    the run's stream per step."""
    ds = load(cfg)
    stream = Stream(cfg, len(ds))
    model = split.mlp(ds.train_x[0].numel(), cfg.hidden, ds.classes, seed=cfg.seed,
                      dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    for start in range(0, stream.total, batch_of):
        idx = torch.cat([stream.indices(i) for i in range(start, start + batch_of)])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(ds.train_x[idx].double()), ds.train_y[idx]).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _params(result) -> list[torch.Tensor]:
    return [p for w in result["workers"] for p in w.opt.params]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_flushed_schedules_equal_single_process_training_with_the_same_batch(schedule):
    cfg = PipelineConfig(schedule=schedule, stages=3, hidden=[16, 12, 8], micro_batch=4, group=3,
                         train_samples=48, epochs=2, lr=0.1, momentum=0.9, dtype="float64")
    got = _params(emulate(cfg, load(cfg)))
    want = _plain_sgd(cfg, batch_of=3)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_gpipe_and_1f1b_are_bitwise_equal():
    kw = dict(stages=4, hidden=[16, 12, 8], micro_batch=2, group=4, train_samples=32,
              dtype="float32")
    gpipe = PipelineConfig(schedule="gpipe", **kw)
    one_f_one_b = PipelineConfig(schedule="1f1b", **kw)
    a = _params(emulate(gpipe, load(gpipe)))
    b = _params(emulate(one_f_one_b, load(one_f_one_b)))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_pb_on_one_stage_is_sgd_at_the_micro_batch():
    cfg = PipelineConfig(schedule="pb", stages=1, hidden=[], micro_batch=3, train_samples=30,
                         lr=0.1, momentum=0.9, dtype="float64")
    got = _params(emulate(cfg, load(cfg)))
    for a, b in zip(got, _plain_sgd(cfg, batch_of=1)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_batch_one_scaling_rule():
    lr1, m1 = scale_for_batch_one(0.05, 0.9, 32)
    assert m1 ** 32 == pytest.approx(0.9, rel=1e-12)
    assert lr1 / (1 - m1) == pytest.approx(0.05 / (32 * (1 - 0.9)), rel=1e-12)
    assert scale_for_batch_one(0.05, 0.9, 1) == pytest.approx((0.05, 0.9))


@pytest.mark.parametrize("kwargs,message", [
    (dict(stages=5, hidden=[8, 8]), "stages must be <= the number of layers"),
    (dict(micro_batch=0), "micro_batch must be an integer >= 1, got 0"),
    (dict(stages=3, hidden=[8, 8, 8], cuts=[1, 4]), "cut point 4 out of range"),
    (dict(stages=3, hidden=[8, 8, 8], cuts=[2, 1]), "strictly increasing"),
    (dict(stages=2, hidden=[8, 8, 8], cuts=[1, 2]), "make 3 stages, but stages=2"),
    (dict(schedule="zigzag"), "schedule must be one of pb, gpipe, 1f1b"),
    (dict(group=0, schedule="gpipe"), "group (M, micro-batches per update) must be >= 1"),
    (dict(dataset="cifar"), "dataset must be one of"),
    (dict(momentum=1.0), "momentum must be in [0, 1)"),
    (dict(lr=float("nan")), "lr must be a number in (0, 1000], got nan"),
    (dict(lr=0.0), "lr must be a number in (0, 1000], got 0.0"),
    (dict(timeout_s=float("inf")), "timeout must be > 0 seconds, got inf"),
    (dict(lwp_form="quadratic"), "lwp_form must be 'velocity' or 'weights', got 'quadratic'"),
])
def test_bad_input_is_refused_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        emulate(PipelineConfig(train_samples=8, **kwargs), load(PipelineConfig()))


def test_split_checks_its_arguments():
    model = split.mlp(4, [3, 3], 2)
    with pytest.raises(ValueError, match="cut point 0 out of range"):
        split.split_sequential(model, [0])
    with pytest.raises(TypeError, match="nn.Sequential"):
        split.split_sequential([model], [1])
    assert [len(s) for s in split.split_sequential(model, [1])] == [1, 2]
    assert split.balanced_cuts(7, 3) == [3, 5]


def test_cli_refuses_bad_input_with_one_line(capsys):
    from thinwire.cli import main

    assert main(["pipeline", "train", "--micro-batch", "0"]) == 2
    assert "--micro-batch must be an integer >= 1, got 0" in capsys.readouterr().err
    assert main(["pipeline", "train", "--stages", "4", "--cuts", "1,9,10"]) == 2
    assert "cut point 9 out of range" in capsys.readouterr().err
    assert main(["pipeline", "train", "--stages", "4", "--nodes", "3"]) == 2
    assert "must equal --stages 4" in capsys.readouterr().err


def test_options_round_trip_to_the_ranks():
    import argparse

    from thinwire.pipeline import config

    cfg = PipelineConfig(schedule="1f1b", stages=3, cuts=[1, 3], hidden=[5, 6, 7], sc=False,
                         lwp_form="weights",
                         micro_batch=2, group=3, out="/x", dtype="float64", timeout_s=7.0)
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    assert config.from_args(parser.parse_args(config.to_argv(cfg))) == cfg
