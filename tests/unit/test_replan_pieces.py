"""auto's re-planning pieces that need no cluster: the flush applied once inside the next
optimizer step, when a check is due, and its settings checked by name."""

import pytest
import torch

from thinwire.train import replan
from thinwire.train.config import TrainConfig


def test_the_flush_is_added_inside_the_next_step_only():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=1.0)
    replan.add_once_before_step(opt, [p], [torch.tensor([1.0, 2.0, 3.0])])
    for expected in ([-1.5, -2.5, -3.5], [-2.0, -3.0, -4.0]):  # then only the gradient
        p.grad = torch.full((3,), 0.5)
        opt.step()
        assert p.detach().tolist() == expected


def test_a_flush_kept_at_a_loss_scale_is_added_unscaled():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=1.0)
    replan.add_once_before_step(opt, [p], [torch.tensor([65536.0, -131072.0])], scale=65536.0)
    p.grad = torch.zeros(2)
    opt.step()
    assert p.detach().tolist() == [-1.0, 2.0]


def test_a_new_choice_starts_from_the_runs_own_settings_not_the_last_choices():
    original = TrainConfig(algorithm="auto", plan_from="x.json")
    first = replan.resolved(original, {"algorithm": "hitopk", "density": 0.05,
                                       "sparse_wire": "fp16", "selector": "mstopk-carry"})
    assert (first.sparse_wire, first.selector, first.plan_from) == ("fp16", "mstopk-carry", "")
    second = replan.resolved(original, {"algorithm": "oktopk", "density": 0.05})
    assert (second.algorithm, second.sparse_wire, second.selector) == ("oktopk", "fp32", "auto")


def test_a_parameter_without_a_flush_or_a_gradient_is_left_alone():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([a, b], lr=1.0)
    replan.add_once_before_step(opt, [a, b], [None, torch.ones(2)])
    a.grad = torch.ones(2)
    opt.step()
    assert a.detach().tolist() == [-1.0, -1.0] and b.detach().tolist() == [0.0, 0.0]


def _curve(*points):
    return [{"step": step, "train_time_s": t} for step, t in points]


def test_a_check_is_due_every_so_many_seconds_of_training():
    cfg = TrainConfig(algorithm="auto", plan_from="x.json", replan_every_s=10.0)
    planner = replan.Replanner(cfg, {"probe": {"goodput_Bps": 1e7}, "choice": "allreduce"})
    assert not planner.due(_curve((2, 9.9))) and planner.due(_curve((2, 10.0)))
    planner.checked_at_s = 10.0
    steady = [(2 * i, 10.0 + i) for i in range(1, 10)]  # 0.5 s a step throughout
    assert not any(planner.due(_curve(*steady[:n])) for n in range(1, 9))
    assert planner.due(_curve(*steady, (20, 20.5)))
    off = replan.Replanner(TrainConfig(algorithm="auto", plan_from="x.json",
                                       replan_every_s=0.0),
                           {"probe": {"goodput_Bps": 1e7}, "choice": "allreduce"})
    assert not off.due(_curve((2, 1e9)))


@pytest.mark.parametrize("then", [2.0, 0.1])  # 4x slower, or 5x faster
def test_a_jump_in_the_pace_of_steps_makes_a_check_due_at_once(then):
    cfg = TrainConfig(algorithm="auto", plan_from="x.json", replan_every_s=100.0,
                      replan_share=0.3)
    planner = replan.Replanner(cfg, {"probe": {"goodput_Bps": 1e7}, "choice": "allreduce"})
    curve = _curve((2, 1.0), (4, 2.0))  # 0.5 s a step: the pace the plan is compared with
    assert not planner.due(curve)
    curve += _curve((6, 2.0 + 2 * 0.6))  # +20%: inside the share
    assert not planner.due(curve)
    curve += _curve((8, curve[-1]["train_time_s"] + 2 * then))
    assert planner.due(curve)


@pytest.mark.parametrize("field, value, message", [
    ("replan_share", 0.0, "replan-share"), ("replan_every_s", -1.0, "replan-every-s")])
def test_bad_settings_are_refused_by_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(algorithm="auto", plan_from="x.json", **{field: value}).validate()


def test_replan_settings_apply_to_auto_only():
    with pytest.raises(ValueError, match="--algorithm auto"):
        TrainConfig(algorithm="hitopk", replan_share=0.5).validate()


def test_a_recheck_the_host_bound_keeps_the_choice_and_says_why(world_of_one, monkeypatch):
    from thinwire.train import auto

    untrusted = {"nodes": 2, "goodput_Bps": 1e9, "trusted": False, "bound_by": "host",
                 "why": "the host's CPUs were 99% busy during the probe"}
    monkeypatch.setattr(auto, "probe_inter_node", lambda *a, **k: dict(untrusted))
    cfg = TrainConfig(algorithm="auto", plan_from="x.json", ranks_per_node=1)
    planner = replan.Replanner(cfg, {"probe": {"goodput_Bps": 1e7}, "choice": "hitopk"})
    # a 100x faster link would re-plan (x.json does not exist: planning would fail loudly)
    assert planner.check(train_time_s=5.0, step=3) is None
    event = planner.events[-1]
    assert event["kept"] == "hitopk" and event["bound_by"] == "host"
    assert "99% busy" in event["reason"]
    assert planner.basis == 1e7  # the plan's basis stays the trusted probe's
