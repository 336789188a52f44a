"""auto's re-planning pieces that need no cluster: the residuals handed over to the next
gradients in equal shares, when a check is due, and its settings checked by name."""

import re

import pytest
import torch

from thinwire.train import checkpoint_checks, replan
from thinwire.train.config import TrainConfig


def test_the_hand_over_is_added_to_the_next_gradient_once_before_it_is_accumulated():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=1.0)
    replan.HandOver(opt, [p], [torch.tensor([1.0, 2.0, 3.0])])
    seen = []  # what a DDP reducer's hook after accumulation would read
    p.register_post_accumulate_grad_hook(lambda param: seen.append(param.grad.tolist()))
    for expected in ([-1.5, -2.5, -3.5], [-2.0, -3.0, -4.0]):  # then only the gradient
        opt.zero_grad()
        (0.5 * p.sum()).backward()
        opt.step()
        assert p.detach().tolist() == expected
    assert seen == [[1.5, 2.5, 3.5], [0.5, 0.5, 0.5]]


def test_the_hand_over_is_spread_over_its_steps_and_what_is_left_is_pending():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=1.0)
    handover = replan.HandOver(opt, [p], [torch.tensor([4.0, -8.0])], steps=4)
    assert handover.pending()[0].tolist() == [4.0, -8.0]
    for taken in range(1, 5):
        opt.zero_grad()
        p.sum().backward()
        assert p.grad.tolist() == [2.0, -1.0]  # the gradient (1) and a quarter of the owed
        opt.step()
        left = handover.pending()
        assert (left is None) if taken == 4 else left[0].tolist() == [4.0 - taken, -8.0 + 2 * taken]
    opt.zero_grad()
    p.sum().backward()
    assert p.grad.tolist() == [1.0, 1.0]  # all delivered: the hooks are gone


def test_a_hand_over_taken_over_delivers_nothing_more():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    scale = [1024.0]
    handover = replan.HandOver(opt, [p], [torch.tensor([4096.0])], 1024.0,
                                            lambda: scale[0], steps=2)
    (1024.0 * p.sum()).backward()
    opt.step()
    scale[0] = 512.0  # what is left follows the loss scale, as a flush's residuals do
    assert handover.pending()[0].tolist() == [1024.0]
    handover.cancel()
    assert handover.pending() is None
    opt.zero_grad()
    (512.0 * p.sum()).backward()
    assert p.grad.tolist() == [512.0]


def test_a_hand_over_resumed_without_a_scaler_is_taken_unscaled():
    """Kept under fp16's loss scale (owed in scaled units), resumed with --amp none: the
    shares are the owed mass unscaled, not 65536 times too large."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    saved = {"owed": [torch.tensor([4 * 65536.0])], "steps": 4, "left": 2, "scale": 65536.0}
    handover = replan.HandOver.restored(opt, [p], saved)
    assert handover.pending()[0].tolist() == [2.0]  # half of the owed 4, unscaled
    p.sum().backward()
    assert p.grad.tolist() == [2.0]  # the gradient (1) and a quarter of the owed 4


@pytest.mark.parametrize("steps", [0, 1.5, None])
def test_a_hand_over_needs_a_whole_number_of_steps(steps):
    p = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match=f"steps must be an integer >= 1, got {steps!r}"):
        replan.HandOver(torch.optim.SGD([p], lr=1.0), [p], [torch.ones(1)],
                                     steps=steps)


def test_a_step_the_scaler_skips_gets_the_hand_over_again_at_the_next_backward():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=1.0)
    replan.HandOver(opt, [p], [torch.tensor([4.0, -4.0])])
    p.sum().backward()  # an overflow: the scaler skips opt.step() and the gradient goes
    assert p.grad.tolist() == [5.0, -3.0]
    opt.zero_grad()
    p.sum().backward()
    assert p.grad.tolist() == [5.0, -3.0]  # owed still
    opt.step()
    opt.zero_grad()
    p.sum().backward()
    assert p.grad.tolist() == [1.0, 1.0]  # delivered: the hooks are gone


def test_the_hand_over_follows_the_loss_scale():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    scale = [1024.0]
    # kept at a scale of 1024 (3 unscaled); the scaler halved it since
    replan.HandOver(opt, [p], [torch.tensor([3072.0])], 1024.0, lambda: scale[0])
    scale[0] = 512.0
    (512.0 * p.sum()).backward()
    assert p.grad.tolist() == [512.0 + 1536.0]


def test_the_flush_with_momentum_correction_is_added_inside_the_next_step_only():
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


def test_only_parameters_owed_something_get_it_and_only_where_they_have_a_gradient():
    a, b, c = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    opt = torch.optim.SGD([a, b, c], lr=1.0)
    replan.HandOver(opt, [a, b, c], [None, torch.ones(2), torch.ones(2)])
    (a.sum() + b.sum()).backward()  # c takes no part in this step: its hook does not fire
    assert a.grad.tolist() == [1.0, 1.0] and b.grad.tolist() == [2.0, 2.0] and c.grad is None


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


def _paced(planner, curve, *step_s):
    """``curve`` extended by one 2-step interval at each pace; ``due`` after each."""
    answers = []
    for pace in step_s:
        curve += _curve((curve[-1]["step"] + 2, curve[-1]["train_time_s"] + 2 * pace))
        answers.append(planner.due(curve))
    return answers


@pytest.mark.parametrize("then", [2.0, 0.1])  # 4x slower, or 5x faster
def test_a_lasting_jump_in_the_pace_of_steps_makes_a_check_due_at_its_second_interval(then):
    cfg = TrainConfig(algorithm="auto", plan_from="x.json", replan_every_s=100.0,
                      replan_share=0.3)
    planner = replan.Replanner(cfg, {"probe": {"goodput_Bps": 1e7}, "choice": "allreduce"})
    curve = _curve((0, 0.0))
    # 0.4 and 0.6 s a step: the reference, 0.5; then +20%, inside the share
    assert _paced(planner, curve, 0.4, 0.6, 0.6) == [False, False, False]
    assert _paced(planner, curve, then, then) == [False, True]


def test_one_interval_past_the_share_or_two_different_ways_are_noise():
    cfg = TrainConfig(algorithm="auto", plan_from="x.json", replan_every_s=100.0,
                      replan_share=0.3)
    planner = replan.Replanner(cfg, {"probe": {"goodput_Bps": 1e7}, "choice": "allreduce"})
    curve = _curve((0, 0.0))
    assert _paced(planner, curve, 0.5, 0.5, 0.8, 0.5, 0.3, 0.5, 0.8, 0.3, 0.8) == [False] * 9
    # a check starts afresh: the interval holding it is skipped, then a new reference
    planner.restart(curve[-1]["train_time_s"])
    assert _paced(planner, curve, 5.0, 1.0, 1.0, 1.0, 1.0) == [False] * 5
    # one interval past the share before a check and one after it are not two in a row
    assert _paced(planner, curve, 2.0) == [False]
    planner.restart(curve[-1]["train_time_s"])
    assert _paced(planner, curve, 1.0, 1.0, 1.0, 2.0) == [False] * 4
    assert _paced(planner, curve, 2.0) == [True]  # the second in a row after the check


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


def _figures(current_steps=80, current_step_s=0.4, best_steps=46, best_step_s=0.2):
    return {"current": {"steps": current_steps, "step_s": current_step_s},
            "best": {"steps": best_steps, "step_s": best_step_s}}


def test_a_switch_is_weighed_in_the_seconds_left():
    from thinwire.train.replan import weigh_switch

    # at step 40 of 80, half is left: 16 s on the current choice, 4.6 s on the best
    early = weigh_switch(_figures(), 40)
    assert early["left_share"] == pytest.approx(0.5)
    assert early["current_left_s"] == pytest.approx(16.0)
    assert early["best_left_s"] == pytest.approx(4.6)
    assert early["gain_s"] == pytest.approx(16.0 - 4.6)
    late = weigh_switch(_figures(), 76)
    assert late["left_share"] == pytest.approx(0.1)  # at least a tenth is taken to be left
    assert late["gain_s"] == pytest.approx(3.2 - 0.92)
    assert weigh_switch({"best": _figures()["best"], "current": None}, 4) is None


def test_a_recheck_plans_with_the_first_probes_intra_node_figure(world_of_one, monkeypatch):
    """The checks probe between the nodes only: the plan again must keep the intra-node rate
    the first choice planned from, or its ranking would not be the first choice's."""
    from thinwire.train import auto

    intra = {"ranks_per_node": 2, "goodput_Bps": 6e8, "bound_by": "link"}
    monkeypatch.setattr(auto, "probe_inter_node", lambda *a, **k: {
        "nodes": 2, "goodput_Bps": 1e9, "trusted": True})
    seen = []

    def choose(cfg, nodes, probe, **kwargs):
        seen.append(probe)
        raise ValueError("planned")  # the check keeps its choice and says why
    monkeypatch.setattr(auto, "choose", choose)
    cfg = TrainConfig(algorithm="auto", plan_from="x.json", ranks_per_node=1)
    planner = replan.Replanner(cfg, {"probe": {"goodput_Bps": 1e7, "intra_node": intra},
                                     "choice": "hitopk"})
    assert planner.check(train_time_s=5.0, step=3) is None
    assert [p["intra_node"] for p in seen] == [intra] and seen[0]["goodput_Bps"] == 1e9
    assert "planned" in planner.events[-1]["reason"]


class _Wrapper:
    """Stands in for the old DDP wrapper: only whether it is freed matters."""


class _Sync:
    def __init__(self, model):
        self.model = model


def test_a_switch_frees_the_old_wrapper_without_a_collection_when_nothing_else_holds_it(
        monkeypatch):
    collections = []
    monkeypatch.setattr(replan.gc, "collect", lambda *a: collections.append(a) or 0)
    sync = _Sync(_Wrapper())
    replan._release_wrapper(sync)
    assert sync.model is None and collections == []  # a full collection: 0.1-0.4 s a rank


def _in_a_cycle() -> _Wrapper:
    wrapper = _Wrapper()
    wrapper.me = wrapper
    return wrapper


def test_a_wrapper_in_a_reference_cycle_is_collected_and_one_still_held_is_an_error(
        monkeypatch):
    collections = []
    real_collect = replan.gc.collect
    monkeypatch.setattr(replan.gc, "collect", lambda *a: collections.append(a) or real_collect())
    replan._release_wrapper(_Sync(_in_a_cycle()))  # only its own cycle holds it once released
    assert len(collections) == 1
    held = _Wrapper()
    with pytest.raises(RuntimeError, match="still referenced"):
        replan._release_wrapper(_Sync(held))  # `held` keeps it: both reducers would reduce


def test_a_hand_over_saved_mid_way_goes_on_with_the_shares_it_had_left():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=1.0)
    handover = replan.HandOver(opt, [p], [torch.tensor([4.0, -8.0])], steps=4)
    p.sum().backward()
    opt.step()
    saved = handover.state_dict()
    assert saved["left"] == 3 and saved["steps"] == 4
    handover.cancel()  # the process ends; a new one resumes from the checkpoint
    checkpoint_checks.check_handover(saved, [p])
    restored = replan.HandOver.restored(opt, [p], saved)
    for _ in range(3):
        opt.zero_grad()
        p.sum().backward()
        assert p.grad.tolist() == [2.0, -1.0]  # a quarter of the owed, as before the save
        opt.step()
    assert restored.pending() is None


@pytest.mark.parametrize("change, field", [
    ({"left": 0}, "handover.left"), ({"left": 5}, "handover.left"),
    ({"steps": 0}, "handover.steps"), ({"scale": float("inf")}, "handover.scale"),
    ({"owed": [torch.ones(3)]}, "handover.owed[0]"),
    ({"owed": [torch.tensor([1.0, float("nan")])]}, "handover.owed[0]"),
    ({"owed": []}, "handover.owed"), ({"extra": 1}, "handover"),
])
def test_a_checkpoints_hand_over_is_checked_by_field(change, field):
    p = torch.nn.Parameter(torch.zeros(2))
    saved = dict({"owed": [torch.ones(2)], "steps": 4, "left": 2, "scale": 1.0}, **change)
    with pytest.raises(checkpoint_checks.CheckpointMismatch, match=f"field '{re.escape(field)}'"):
        checkpoint_checks.check_handover(saved, [p])


@pytest.mark.parametrize("plan_now, planned", [("ddp-fp16", True), ("hitopk", False),
                                               (None, False)])
def test_a_run_resumed_with_a_choice_the_plan_now_ranks_second_plans_again_at_once(
        world_of_one, monkeypatch, plan_now, planned):
    """The link changed while the job was down: the plan at the resume's probe ranks another
    choice first, but the checks measure change from that probe, which shows none. The first
    check plans again whatever the change; a resume whose choice is the plan's does not."""
    from thinwire.train import auto

    monkeypatch.setattr(auto, "probe_inter_node", lambda *a, **k: {
        "nodes": 2, "goodput_Bps": 1.01e7, "trusted": True})  # 1% off the resume's probe
    asked = []

    def choose(cfg, nodes, probe, **kwargs):
        asked.append(probe["goodput_Bps"])
        raise ValueError("planned")  # the check keeps its choice and says why
    monkeypatch.setattr(auto, "choose", choose)
    cfg = TrainConfig(algorithm="auto", plan_from="x.json", ranks_per_node=1)
    planner = replan.Replanner(cfg, {"probe": {"goodput_Bps": 1e7}, "choice": "hitopk",
                                     "resumed": {"step": 40, "plan_now": plan_now}})
    assert planner.check(train_time_s=5.0, step=41) is None
    assert asked == ([1.01e7] if planned else [])
    planner.check(train_time_s=10.0, step=42)  # once only: then the share rules again
    assert len(asked) == (1 if planned else 0)


@pytest.mark.parametrize("failures, kept", [(1, False), (2, True)])
def test_a_recheck_whose_sizes_came_out_inverted_is_taken_once_more(world_of_one, monkeypatch,
                                                                   failures, kept):
    from thinwire.train import auto

    answers = [ValueError("the link probe is not usable")] * failures + [
        {"nodes": 2, "goodput_Bps": 1e9, "trusted": True}]

    def probe(*args, **kwargs):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(auto, "probe_inter_node", probe)
    monkeypatch.setattr(auto, "choose", lambda *a, **k: (_ for _ in ()).throw(
        ValueError("planned")))  # a 100x faster link plans again: the probe was used
    cfg = TrainConfig(algorithm="auto", plan_from="x.json", ranks_per_node=1)
    planner = replan.Replanner(cfg, {"probe": {"goodput_Bps": 1e7}, "choice": "hitopk"})
    assert planner.check(train_time_s=5.0, step=3) is None
    event = planner.events[-1]
    assert ("not usable" in event["reason"]) is kept
    assert (event.get("goodput_Bps") == 1e9) is not kept


def test_a_hook_switched_in_mid_run_keeps_its_warm_ups_skipped_when_resumed():
    """A switch builds the new hook without the start's warm-ups; a resume builds it again
    from the run's settings (with them) and loads the switched hook's small step count: the
    dense steps and the density ramp ran again. The checkpoint's shorter schedule stands."""
    from thinwire.state import SyncState

    switched = SyncState(None, "hitopk", dense_iterations=0, density_warmup_steps=0)
    switched.steps = 3
    resumed = SyncState(None, "hitopk", dense_iterations=5, density_warmup_steps=8)
    resumed.load_state_dict(switched.state_dict())
    assert (resumed.steps, resumed.dense_iterations, resumed.density_warmup_steps) == (3, 0, 0)
    # a checkpoint of the same schedule, or a longer one, changes nothing
    fresh = SyncState(None, "hitopk", dense_iterations=5)
    fresh.load_state_dict(SyncState(None, "hitopk", dense_iterations=9).state_dict())
    assert fresh.dense_iterations == 5
