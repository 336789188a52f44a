"""thinwire.ddp.register(..., "auto", plan=...)'s choice from a plan, without a cluster: the
plan's checks, the interpolation between its rates (hand-worked), and which candidates a
thinwire hook runs."""

import copy
import math
import re

import pytest

from thinwire import plan_choice
from thinwire.ddp_auto import PACE_CALLS


def _row(candidate, algorithm, settings, t):
    return {"candidate": candidate, "algorithm": algorithm, "settings": settings,
            "time_to_target_s": t}


def plan_of(nodes=2, ranks_per_node=1, efficiency=0.5):
    """hitopk wins at 25 Mbit/s, PowerSGD would win at 100 Mbit/s, ddp-fp16 at 1 Gbit/s."""
    candidates = {"hitopk": ("hitopk d=0.05", "hitopk", {"density": 0.05, "sparse_wire": "fp16"}),
                  "fp16": ("ddp-fp16", "ddp-fp16", {}),
                  "psgd": ("powersgd rank=4", "powersgd", {"powersgd_rank": 4})}
    at = {25e6: {"hitopk": 10.0, "fp16": 40.0, "psgd": 12.0},
          100e6: {"hitopk": 8.0, "fp16": 10.0, "psgd": 6.0},
          1e9: {"hitopk": 8.0, "fp16": 4.0, "psgd": 6.0}}
    return {"nodes": nodes, "ranks_per_node": ranks_per_node, "inter_efficiency": efficiency,
            "plans": [{"inter_node_bps": bps,
                       "rows": [_row(*candidates[c], t) for c, t in rows.items()]}
                      for bps, rows in at.items()]}


def test_times_between_two_rates_are_interpolated_in_log_rate_and_log_time():
    times = plan_choice.predicted(plan_of(), 50e6)  # halfway from 25 to 100 Mbit/s in log rate
    assert times["hitopk d=0.05"] == pytest.approx(math.sqrt(10.0 * 8.0))
    assert times["ddp-fp16"] == pytest.approx(20.0)
    assert plan_choice.predicted(plan_of(), 10e6)["ddp-fp16"] == 40.0  # below: the end's
    assert plan_choice.predicted(plan_of(), 5e9)["ddp-fp16"] == 4.0


def test_a_candidate_that_missed_the_target_next_to_the_rate_has_no_time():
    plan = plan_of()
    plan["plans"][1]["rows"][1]["time_to_target_s"] = None  # ddp-fp16 missed at 100 Mbit/s
    times = plan_choice.predicted(plan, 50e6)
    assert times["ddp-fp16"] is None and times["hitopk d=0.05"] is not None


@pytest.mark.parametrize("goodput_mbit, algorithm, settings", [
    (12.5, "hitopk", {"density": 0.05, "sparse_wire": "fp16"}),  # 25 Mbit/s nominal
    (500.0, "allreduce", {"wire": "fp16"}),                       # 1 Gbit/s nominal
])
def test_the_fastest_candidate_a_hook_runs_is_chosen_at_the_nominal_rate(goodput_mbit,
                                                                          algorithm, settings):
    chosen, got, record = plan_choice.choose(plan_of(), goodput_mbit * 1e6 / 8)
    assert (chosen, got) == (algorithm, settings)
    assert record["planned_at_bps"] == pytest.approx(goodput_mbit * 1e6 * 2)  # efficiency 0.5


def test_powersgd_ranked_first_is_named_but_not_registered():
    chosen, settings, record = plan_choice.choose(plan_of(), 50e6 / 8)  # 100 Mbit/s nominal
    assert chosen == "hitopk"
    assert [(s["candidate"], s["why"]) for s in record["ahead_but_not_a_thinwire_hook"]] == \
        [("powersgd rank=4", "powersgd is not a thinwire hook")]


def test_a_candidate_measured_with_a_setting_the_hook_would_drop_is_passed_over():
    plan = plan_of()
    for at in plan["plans"]:
        for row in at["rows"]:
            if row["algorithm"] == "ddp-fp16":  # fastest at 1 Gbit/s, measured otherwise
                row["settings"] = {"dense_warmup_steps": 5}
    chosen, _, record = plan_choice.choose(plan, 500e6 / 8)
    assert chosen == "hitopk"
    assert "dense_warmup_steps" in record["ahead_but_not_a_thinwire_hook"][0]["why"]


@pytest.mark.parametrize("change, message", [
    (lambda p: p.update(plans=[]), "'plans' must be a non-empty list"),
    (lambda p: p["plans"][0].update(inter_node_bps=-1), "plans[0].inter_node_bps"),
    (lambda p: p["plans"][1]["rows"][0].update(time_to_target_s=float("nan")),
     "plans[1].rows[0].time_to_target_s"),
    (lambda p: p["plans"][0]["rows"][2].pop("settings"), "plans[0].rows[2] needs"),
    (lambda p: p.update(nodes="2"), "nodes must be an integer"),
    (lambda p: p.update(inter_efficiency=0), "inter_efficiency must be a finite number"),
    # one name, another configuration at another rate: its times would be interpolated
    # across the two, and the hook registered would be one row's
    (lambda p: p["plans"][2]["rows"][0].update(settings={"density": 0.1}),
     "candidate 'hitopk d=0.05' is ('hitopk', {'density': 0.05, 'sparse_wire': 'fp16'}) at "
     "one rate and ('hitopk', {'density': 0.1}) at plans[2].rows[0]"),
])
def test_a_bad_plan_is_refused_naming_the_field(change, message):
    plan = copy.deepcopy(plan_of())
    change(plan)
    with pytest.raises(ValueError, match=re.escape(message)):
        plan_choice.load(plan)


def test_a_plan_file_that_is_not_json_is_refused(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON plan"):
        plan_choice.load(path)


def test_a_plan_for_another_cluster_or_settings_auto_chooses_are_refused():
    with pytest.raises(ValueError, match="made for 2 x 1.*this run is 2 x 2"):
        plan_choice.check(plan_of(), 4, 2, {})
    with pytest.raises(ValueError, match="needs at least 2 nodes"):
        plan_choice.check(plan_of(nodes=1, ranks_per_node=2), 2, 2, {})
    with pytest.raises(ValueError, match=r"chooses density.*\['density'\]"):
        plan_choice.check(plan_of(), 2, 1, {"density": 0.1, "weight_decay": 1e-4})


def test_register_refuses_a_bad_auto_before_it_probes(world_of_one):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import thinwire.ddp

    model = DDP(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="made for 2 x 1.*this run is 1 x 1"):
        thinwire.ddp.register(model, "auto", plan=plan_of(), ranks_per_node=1)
    with pytest.raises(ValueError, match="needs plan="):
        thinwire.ddp.register(model, "auto")
    with pytest.raises(ValueError, match="plan= is for algorithm='auto'"):
        thinwire.ddp.register(model, "hitopk", plan=plan_of())
    with pytest.raises(ValueError, match="suit neither hitopk nor allreduce: nonfinite"):
        thinwire.ddp.register(model, "auto", plan=plan_of(), nonfinite="ignore-it")
    assert getattr(model, "_thinwire_context", None) is None  # nothing registered


def test_a_candidate_the_callers_settings_do_not_suit_is_passed_over_and_named():
    def sparse_only(algorithm, settings):  # e.g. momentum_correction: the sparse ones only
        return None if algorithm == "hitopk" else f"{algorithm} is dense"
    chosen, settings, record = plan_choice.choose(plan_of(), 500e6 / 8, fits=sparse_only)
    assert chosen == "hitopk"  # ddp-fp16 is fastest at 1 Gbit/s, but dense
    assert record["ahead_but_not_for_your_settings"] == [
        {"candidate": "ddp-fp16", "time_to_target_s": 4.0, "why": "allreduce is dense"}]
    with pytest.raises(ValueError, match="not for these settings"):
        plan_choice.choose(plan_of(), 500e6 / 8, fits=lambda a, s: "never")


def _probe(goodput_Bps, trusted=True):
    return {"goodput_Bps": goodput_Bps, "trusted": trusted,
            "bound_by": "link" if trusted else "host", "why": "test"}


def test_a_re_check_switches_where_the_link_moved_and_the_plan_says_so():
    # planned at 25 Mbit/s nominal (hitopk); the link is now 1 Gbit/s nominal: ddp-fp16, 2x
    event, switch = plan_choice.decide_switch(plan_of(), "hitopk d=0.05", 12.5e6 / 8,
                                              _probe(500e6 / 8), share=0.3)
    assert switch[:2] == ("allreduce", {"wire": "fp16"})
    assert event["switched_to"] == "ddp-fp16" and event["predicted_gain"] == pytest.approx(1.0)
    assert event["change"] == pytest.approx(39.0)


@pytest.mark.parametrize("goodput_mbit, trusted, share, min_gain, why", [
    (15.0, True, 0.3, 0.1, "inside the share"),       # +20%: no new plan
    (500.0, False, 0.3, 0.1, "probe not trusted"),    # the host set the probe's pace
    (500.0, True, 0.3, 1.5, "gain below min_gain"),   # ddp-fp16 promises 2x, not 2.5x
    (50.0, True, 0.3, 0.1, "best is the current"),    # 100 Mbit/s: hitopk still the best hook
])
def test_a_re_check_keeps_the_choice_without_evidence_or_gain(goodput_mbit, trusted, share,
                                                               min_gain, why):
    event, switch = plan_choice.decide_switch(plan_of(), "hitopk d=0.05", 12.5e6 / 8,
                                              _probe(goodput_mbit * 1e6 / 8, trusted), share,
                                              min_gain)
    assert switch is None and event["kept"] == "hitopk d=0.05", why
    assert ("reason" in event) == (not trusted)
    assert ("planned_at_bps" in event) == (trusted and why != "inside the share")


def test_replan_refuses_a_model_not_registered_for_auto_and_a_bad_share(world_of_one):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import thinwire.ddp

    model = DDP(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no thinwire hook"):
        thinwire.ddp.replan(model)
    thinwire.ddp.register(model, "allreduce")
    with pytest.raises(ValueError, match="share must be a finite number >= 0, got -0.1"):
        thinwire.ddp.replan(model, share=-0.1)
    with pytest.raises(ValueError, match="is for a model registered with algorithm='auto'"):
        thinwire.ddp.replan(model)


def test_a_re_check_switches_where_the_current_choice_misses_the_target_at_the_new_rate():
    plan = plan_of()
    plan["plans"][2]["rows"][0]["time_to_target_s"] = None  # hitopk misses at 1 Gbit/s
    event, switch = plan_choice.decide_switch(plan, "hitopk d=0.05", 12.5e6 / 8,
                                              _probe(500e6 / 8), share=0.3)
    assert switch[0] == "allreduce" and "no time to target" in event["reason"]


def test_a_flush_owed_by_two_switches_without_a_step_between_is_added_once_in_full():
    import torch

    from thinwire.ddp import _HookContext

    module = torch.nn.Linear(3, 2)
    context = _HookContext(object(), module)
    first = [torch.ones(2, 3), torch.ones(2)]
    context.switch_to("state-b", first)
    context.switch_to("state-c", [torch.full((2, 3), 2.0), None])
    assert context.state == "state-c"
    torch.testing.assert_close(context.pending[0], torch.full((2, 3), 3.0))
    torch.testing.assert_close(context.pending[1], torch.ones(2))

    class Layout:  # a bucket of both parameters in DDP's (reversed) order
        model_index = [1, 0]
    extras = context.take_pending(Layout(), is_last=True)
    assert [e.shape for e in extras] == [torch.Size([2]), torch.Size([2, 3])]
    assert context.take_pending(Layout(), is_last=True) is None  # once


def _settled(auto, now: float, step_s: float = 0.1) -> float:
    """Calls of replan after steps of ``step_s`` until the pace is set; returns the clock."""
    calls = []
    for _ in range(2 * PACE_CALLS):
        now += step_s
        calls.append(auto.due_at(now, every_s=10.0, share=0.3))
    assert not any(calls) and auto.pace == pytest.approx(step_s)
    return now


def test_a_timed_re_check_is_due_by_the_clock_or_at_once_where_the_pace_moved():
    from thinwire.ddp_auto import AutoContext

    auto = AutoContext(plan_of(), {}, 1e6, None)
    auto.checked(0.0)
    now = _settled(auto, 0.0)
    slow = []
    for _ in range(PACE_CALLS):  # the link slowed a little: steps of 0.15 s (under a jump)
        now += 0.15
        slow.append(auto.due_at(now, every_s=10.0, share=0.3))
    assert slow.index(True) == PACE_CALLS // 2  # as soon as most of the last calls were slow
    assert auto.due_why == "pace"
    auto.checked(now)
    assert not auto.due_at(now + 1.0, every_s=10.0, share=0.3)  # the clock starts again
    assert auto.due_at(now + 10.5, every_s=10.0, share=0.3)  # every_s passed
    assert auto.due_why == "clock"


@pytest.mark.parametrize("step_s, due", [(1.0, "jump"), (0.25, "jump"), (0.15, None)])
def test_one_step_jump_times_the_pace_is_due_at_once(step_s, due):
    from thinwire.ddp_auto import JUMP, AutoContext

    assert JUMP == 2.0  # the cases below are written for it
    auto = AutoContext(plan_of(), {}, 1e6, None)
    auto.checked(0.0)
    now = _settled(auto, 0.0)
    assert auto.due_at(now + step_s, every_s=10.0, share=0.3) is (due is not None)
    assert auto.due_why == due


@pytest.mark.parametrize("next_why, switched, armed", [
    ("jump", False, False),  # a jump that was not the link: no more jumps ...
    ("clock", False, True),  # ... until a clock check
    ("jump", True, True),    # a jump that switched was the link
])
def test_a_jump_whose_check_kept_the_choice_turns_jumps_off_until_a_clock_check(
        next_why, switched, armed):
    from thinwire.ddp_auto import AutoContext

    auto = AutoContext(plan_of(), {}, 1e6, None)
    auto.checked(0.0)
    now = _settled(auto, 0.0)
    assert auto.due_at(now + 1.0, every_s=10.0, share=0.3) and auto.due_why == "jump"
    auto.checked(now + 1.0, "jump", switched=False)  # a script's evaluation, say
    now = _settled(auto, now + 1.0)
    assert not auto.due_at(now + 1.0, every_s=10.0, share=0.3)  # no jump now
    auto.checked(now + 1.0, next_why, switched)
    now = _settled(auto, now + 1.0)
    assert auto.due_at(now + 1.0, every_s=10.0, share=0.3) is armed


def test_a_jump_whose_check_found_the_link_moved_keeps_jumps_on():
    # the jump was the link: re-planned at the new rate to the same choice, but a pilot and
    # the next change must still see jumps
    from thinwire.ddp_auto import AutoContext

    auto = AutoContext(plan_of(), {}, 1e6, None)
    auto.checked(0.0)
    now = _settled(auto, 0.0)
    assert auto.due_at(now + 1.0, every_s=10.0, share=0.3) and auto.due_why == "jump"
    auto.checked(now + 1.0, "jump", switched=False, steady=False)
    now = _settled(auto, now + 1.0)
    assert auto.due_at(now + 1.0, every_s=10.0, share=0.3) and auto.due_why == "jump"


def test_steps_of_no_measurable_time_are_never_a_jump():
    from thinwire.ddp_auto import AutoContext

    auto = AutoContext(plan_of(), {}, 1e6, None)
    auto.checked(0.0)
    calls = [auto.due_at(0.0, every_s=10.0, share=0.3) for _ in range(3 * PACE_CALLS)]
    assert not any(calls) and auto.pace == 0.0


def _with_steps(plan):
    """plan_of with step times (time to target / 100 steps) and an fp32 all-reduce at 1.2x
    hitopk's time at 25 Mbit/s."""
    for at in plan["plans"]:
        for row in at["rows"]:
            row["step_s"] = row["time_to_target_s"] / 100
        at["rows"].append(_row("ddp", "ddp", {}, 12.0 if at["inter_node_bps"] == 25e6 else 9.0))
        at["rows"][-1]["step_s"] = at["rows"][-1]["time_to_target_s"] / 100
    return plan


def test_a_pilot_lists_the_hooks_the_plan_puts_within_its_bound_fastest_first():
    plan = _with_steps(plan_of())
    at_25 = 12.5e6 / 8  # 25 Mbit/s nominal: hitopk 10, ddp 12, PowerSGD 12 (no hook), fp16 40
    assert plan_choice.pilot_candidates(plan, at_25, "hitopk d=0.05") == ["ddp"]
    assert plan_choice.pilot_candidates(plan, at_25, "hitopk d=0.05", within=5.0) == \
        ["ddp", "ddp-fp16"]
    assert plan_choice.pilot_candidates(plan, at_25, "hitopk d=0.05", within=1.1) == []
    plan["plans"][0]["rows"][-1].pop("step_s")  # no step time at 25 Mbit/s: nothing to scale
    assert plan_choice.pilot_candidates(plan, at_25, "hitopk d=0.05") == []
    # the caller's settings that do not suit the all-reduce keep it out
    assert plan_choice.pilot_candidates(
        _with_steps(plan_of()), at_25, "hitopk d=0.05",
        fits=lambda algorithm, settings: None if algorithm == "hitopk" else "sparse only") == []


def test_a_pilot_scores_each_candidate_as_the_plans_steps_at_its_measured_pace():
    plan = _with_steps(plan_of())
    # measured at 28 Mbit/s nominal (within 1.3x of 25) and, for ddp, at 1 Gbit/s too
    measured = {"hitopk d=0.05": [(28e6, 0.3)], "ddp": [(1e9, 0.01), (28e6, 0.15)]}
    scores = plan_choice.measured_scores(plan, 12.5e6 / 8, measured)
    assert scores == pytest.approx({"hitopk d=0.05": 30.0, "ddp": 15.0})  # 100 steps each
    # at 100 Mbit/s neither was measured near enough: no score, the plan's times stand
    assert plan_choice.measured_scores(plan, 50e6 / 8, measured) == {}
    assert plan_choice.expected_times(plan, 100e6, measured) == plan_choice.predicted(plan, 100e6)


def test_a_pace_measured_near_the_new_rate_stands_for_the_plan_in_a_re_check():
    plan = _with_steps(plan_of())
    # at 1 Gbit/s the plan says ddp-fp16 (4 s) over hitopk (8 s); a pilot measured hitopk there
    # at a quarter of its planned step (100 steps x 0.02 s = 2 s) and ddp-fp16 at its plan's
    # (4 s), so hitopk is kept
    measured = {"hitopk d=0.05": [(1e9, 0.02)], "ddp-fp16": [(1e9, 0.04)]}
    event, switch = plan_choice.decide_switch(plan, "hitopk d=0.05", 12.5e6 / 8,
                                              _probe(500e6 / 8), 0.3, measured=measured)
    assert switch is None and event["kept"] == "hitopk d=0.05"
    assert event["measured_here"] == ["ddp-fp16", "hitopk d=0.05"]
    # without it the plan's ddp-fp16 wins, as before
    assert plan_choice.decide_switch(plan, "hitopk d=0.05", 12.5e6 / 8, _probe(500e6 / 8),
                                     0.3)[1] is not None
    # and a pilot there does not measure again what was measured near the rate
    assert plan_choice.pilot_candidates(plan, 500e6 / 8, "ddp-fp16", within=3.0) == \
        ["hitopk d=0.05", "ddp"]  # the plan: hitopk 8 s, ddp 9 s
    assert plan_choice.pilot_candidates(plan, 500e6 / 8, "ddp-fp16", within=3.0,
                                        measured=measured) == ["ddp"]


def test_candidates_no_pilot_measured_take_the_scripts_factor_from_those_it_did():
    plan = _with_steps(plan_of())
    # the script steps 3x slower than the plan's model for both candidates measured at 1 Gbit/s
    measured = {"ddp-fp16": [(1e9, 0.12)], "hitopk d=0.05": [(1e9, 0.24)]}
    times = plan_choice.expected_times(plan, 1e9, measured)
    assert times == pytest.approx({"ddp-fp16": 12.0, "hitopk d=0.05": 24.0, "ddp": 27.0,
                                   "powersgd rank=4": 18.0})
    # so the unmeasured all-reduce (the plan's 9 s) does not look faster than ddp-fp16
    event, switch = plan_choice.decide_switch(plan, "hitopk d=0.05", 12.5e6 / 8,
                                              _probe(500e6 / 8), 0.3, measured=measured)
    assert event["switched_to"] == "ddp-fp16"


def test_choose_among_names_the_candidate_asked_for_with_its_record():
    plan = _with_steps(plan_of())
    algorithm, settings, record = plan_choice.choose(plan, 12.5e6 / 8, among={"ddp"})
    assert (algorithm, settings, record["choice"]) == ("allreduce", {}, "ddp")
    assert record["predicted_time_to_target_s"] == pytest.approx(12.0)


def test_a_pilot_holds_the_other_checks_and_is_due_once_the_pace_is_set():
    from thinwire.ddp_auto import AutoContext

    auto = AutoContext(plan_of(), {}, 1e6, None)
    auto.checked(0.0)
    auto.piloting = True
    now, calls = 0.0, []
    for step_s in [0.1] * PACE_CALLS + [0.15]:  # the clock (every 0.3 s) is held
        now += step_s
        calls.append(auto.due_at(now, every_s=0.3, share=0.3))
    assert calls == [False] * PACE_CALLS + [True] and auto.due_why == "pilot"
    assert auto.pace == pytest.approx(0.1)  # the median of the last 5 steps


def test_a_jump_over_a_candidates_own_steps_gives_the_pilot_up_for_a_check():
    from thinwire.ddp_auto import AutoContext

    auto = AutoContext(plan_of(), {}, 1e6, None)
    auto.checked(0.0)
    auto.piloting = True
    now, calls = 0.0, []
    for step_s in [0.1, 0.1, 0.1, 0.5]:  # the link fell under the pilot's third step
        now += step_s
        calls.append(auto.due_at(now, every_s=100.0, share=0.3))
    assert calls == [False, False, False, True] and auto.due_why == "jump"


@pytest.mark.parametrize("pilot", [-1, 1.5, True, "2"])
def test_replan_refuses_a_bad_pilot(world_of_one, pilot):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import thinwire.ddp

    model = DDP(torch.nn.Linear(2, 2))
    thinwire.ddp.register(model, "allreduce")  # the values are checked before the model
    with pytest.raises(ValueError, match=f"pilot must be an integer >= 0 .*got {pilot!r}"):
        thinwire.ddp.replan(model, every_s=1.0, pilot=pilot)


def test_the_clock_backs_off_while_the_link_holds_and_returns_once_it_moved():
    from thinwire.ddp_auto import CLOCK_BACKOFF_MAX, AutoContext

    auto = AutoContext(plan_of(), {}, 1e6, None)
    auto.checked(0.0)
    waits, now = [], 0.0
    for steady in [True, True, True, True, None, False]:
        began = now
        while not auto.due_at(now, every_s=10.0, share=0.3):
            now += 1.0  # steps of a steady second: only the clock can be due
        assert auto.due_why == "clock"
        waits.append(now - began)
        auto.checked(now, "clock", steady=steady)
    # 10 s, then doubled by each steady check up to CLOCK_BACKOFF_MAX; no evidence keeps it
    assert CLOCK_BACKOFF_MAX == 8 and waits == [10.0, 20.0, 40.0, 80.0, 80.0, 80.0]
    assert auto.clock_backoff == 1  # the last check found the link moved
    auto.checked(now, "pace", switched=True)
    assert auto.clock_backoff == 1
