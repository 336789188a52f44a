"""thinwire.ddp.register(ddp_model, "auto", plan=...) on 2 gloo ranks (2 nodes x 1, loopback):
the leaders probe, every rank registers the plan's fastest hook at the probed rate, and the
gradients are the ranks' average; ranks whose plans differ all fail alike."""

import sys
from pathlib import Path

import pytest
import torch

from thinwire.plan_choice import HANDOVER_STEPS

from harness import frozen_run, run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_plan_choice import plan_of  # noqa: E402
from thinwire.ddp_auto import PACE_CALLS  # noqa: E402

import auto_workers  # noqa: E402


def test_register_auto_trains_with_the_plans_choice_at_the_probed_rate():
    # loopback is far faster than the plan's top rate (1 Gbit/s): ddp-fp16 is fastest there,
    # registered as thinwire's allreduce with an fp16 wire
    results = run_ranks(auto_workers.register_auto, 2, [plan_of(), plan_of()])
    assert all("error" not in r for r in results), results
    assert {(r["algorithm"], r["wire"], r["choice"]) for r in results} == \
        {("allreduce", "fp16", "ddp-fp16")}
    probe = results[0]["probe"]
    assert probe["goodput_Bps"] > 1e8 / 8 and 1 <= len(probe["tries"]) <= 3
    assert probe == results[1]["probe"]  # rank 0's probe is every rank's
    # the reference: the average of both ranks' own gradients (fp16 on the wire)
    expected = (results[0]["own_grad"] + results[1]["own_grad"]) / 2
    for r in results:
        torch.testing.assert_close(r["grad"], expected, rtol=2e-3, atol=2e-3)


def _fastest(algorithm, at_bps=None):
    """plan_of() with ``algorithm`` the fastest at every rate (``at_bps``: at that rate only)."""
    plan = plan_of()
    for at in plan["plans"]:
        for row in at["rows"]:
            if row["algorithm"] == algorithm and at_bps in (None, at["inter_node_bps"]):
                row["time_to_target_s"] = 1.0
    return plan


# loopback probes faster than the plans' top rate, 1 Gbit/s, where plan_of() has ddp-fp16
@pytest.mark.parametrize("other", [
    _fastest("hitopk"),          # the ranks would choose differently at the probed rate
    _fastest("ddp-fp16", 25e6),  # alike there, apart at 25 Mbit/s: a later re-check would
])                               # part their decisions and their collectives (a hang)
def test_ranks_whose_plans_differ_all_fail_alike_at_registration(other):
    results = run_ranks(auto_workers.register_auto, 2, [plan_of(), other])
    assert all("the ranks' plans differ" in r.get("error", "") for r in results), results



def test_plans_that_differ_only_where_their_inputs_were_read_agree():
    # made on each node from the same races, at other paths: they decide alike
    here, there = plan_of(), plan_of()
    here["calibration"], there["calibration"] = ["/node0/sweep.json"], ["/node1/sweep.json"]
    results = run_ranks(auto_workers.register_auto, 2, [here, there])
    assert all("error" not in r for r in results), results


def test_a_plan_one_rank_cannot_read_ends_every_rank_without_a_wait(tmp_path):
    results = run_ranks(auto_workers.register_auto, 2, [plan_of(), str(tmp_path / "no.json")])
    assert "another rank failed at checking its plan" in results[0].get("error", ""), results
    assert "not a readable JSON plan" in results[1].get("error", ""), results


def test_replan_switches_hitopk_to_the_all_reduce_and_delivers_the_residuals():
    plan = plan_of()
    for at in plan["plans"]:  # the dense candidate sends fp32: the reference is exact
        for row in at["rows"]:
            if row["algorithm"] == "ddp-fp16":
                row.update(candidate="ddp", algorithm="ddp")
    # registered at 25 Mbit/s nominal (hitopk); +12% (kept); then 1 Gbit/s nominal (ddp)
    goodputs = [12.5e6 / 8, 14e6 / 8, 500e6 / 8]
    results = run_ranks(auto_workers.register_then_replan, 2, plan, goodputs)
    for r in results:
        assert r["algorithms"] == ["hitopk", "hitopk", "allreduce"]
        kept, switched = r["events"]
        assert kept["kept"] == "hitopk d=0.05" and kept["step"] == 1
        assert switched["switched_to"] == "ddp" and switched["step"] == 2
        assert r["steps"] == 4  # the new state goes on counting
        assert r["auto"]["handed_over"]["buckets"] >= 1 and r["auto"]["choice"] == "ddp"
        assert r["auto"]["handed_over"]["how"] == f"handed over in {HANDOVER_STEPS} steps"
        assert [c["step"] for c in r["auto"]["replanning"]["checks"]] == [1, 2]
    # what hitopk held back at the switch (the ranks' average), handed to the coming steps in
    # equal shares: steps 3 and 4 each deliver the dense average and one share
    held = results[0]["flush_refs"][1]
    assert held.abs().sum() > 0
    for step in (2, 3):
        torch.testing.assert_close(
            results[0]["synced"][step],
            (results[0]["own"][step] + results[1]["own"][step]) / 2 + held / HANDOVER_STEPS,
            rtol=1e-5, atol=1e-5)
    # conservation: the four steps delivered plus what is still owed (flushed: the all-reduce
    # holds none back) is the ranks' dense average of their own gradients
    after = torch.cat([t.reshape(-1) for t in results[0]["flushed_after"]])
    torch.testing.assert_close(after, held * (HANDOVER_STEPS - 2) / HANDOVER_STEPS,
                               rtol=1e-5, atol=1e-5)
    delivered = results[0]["synced"].sum(0) + after
    expected = (results[0]["own"].sum(0) + results[1]["own"].sum(0)) / 2
    torch.testing.assert_close(delivered, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(results[0]["synced"][:2].sum(0),
                              (results[0]["own"][:2].sum(0) + results[1]["own"][:2].sum(0)) / 2,
                              rtol=1e-3, atol=1e-3)  # hitopk did hold mass back
    torch.testing.assert_close(results[0]["synced"], results[1]["synced"])


def test_with_momentum_correction_the_switch_flushes_the_averaged_residuals_densely():
    # DGC's velocity would count a handed-over residual again at every step it stays unsent:
    # the switch adds the ranks' averaged residuals once, after the next step's reduction.
    # Momentum correction is a sparse algorithm's: the plan's fastest at 1 Gbit/s here is a
    # top-k that sends every coordinate (its first step delivers the exact average)
    plan = plan_of()
    for at in plan["plans"]:
        for row in at["rows"]:
            if row["algorithm"] == "ddp-fp16":
                row.update(candidate="topk_allgather d=1", algorithm="topk_allgather",
                           settings={"density": 1.0})
    goodputs = [12.5e6 / 8, 14e6 / 8, 500e6 / 8]
    results = run_ranks(auto_workers.register_then_replan, 2, plan, goodputs, 0.9)
    for r in results:
        assert r["algorithms"] == ["hitopk", "hitopk", "topk_allgather"]
        assert r["events"][1]["switched_to"] == "topk_allgather d=1"
        assert r["auto"]["handed_over"]["how"] == "flushed densely"
        assert r["auto"]["handed_over"]["buckets"] >= 1
    # the reference: step 3 (the new state's first, its velocities fresh) delivers the ranks'
    # dense average of their own gradients plus the averaged residuals held at the switch
    held = results[0]["flush_refs"][1]
    torch.testing.assert_close(held, results[1]["flush_refs"][1])
    assert held.abs().sum() > 0  # hitopk held mass back
    expected = (results[0]["own"][2] + results[1]["own"][2]) / 2 + held
    for r in results:
        torch.testing.assert_close(r["synced"][2], expected, rtol=1e-5, atol=1e-5)
        # and once: step 4 is the plain average (every coordinate sent, its velocity masked)
        torch.testing.assert_close(r["synced"][3], (results[0]["own"][3] +
                                                    results[1]["own"][3]) / 2)


def test_a_timed_replan_checks_only_where_rank_0_says_it_is_due():
    results = run_ranks(auto_workers.timed_replan, 2, plan_of())
    for answers in results:
        assert answers[:3] == [None, None, None]
        assert answers[3]["kept"] == "hitopk d=0.05" and answers[3]["step"] == 3
        assert answers[3]["due"] == "clock"


def _close_pair_plan():
    """hitopk (10 s to target, 0.1 s a step) and the fp32 all-reduce (13 s, 0.13 s) at every
    rate: the all-reduce is inside the pilot's bound (1.5x), ddp-fp16 (40 s) is not."""
    plan = plan_of()
    for at in plan["plans"]:
        for row in at["rows"]:
            if row["algorithm"] == "hitopk":
                row.update(time_to_target_s=10.0, step_s=0.1)
            elif row["algorithm"] == "ddp-fp16":
                row.update(time_to_target_s=40.0, step_s=0.2)
            else:
                row.update(time_to_target_s=30.0)  # PowerSGD: no hook, never piloted
        at["rows"].append({"candidate": "ddp", "algorithm": "ddp", "settings": {},
                           "time_to_target_s": 13.0, "step_s": 0.13})
    return plan


@pytest.mark.parametrize("step_s, final", [
    ({"hitopk": 0.2, "allreduce": 0.1}, "allreduce"),  # the script's all-reduce is faster
    ({"hitopk": 0.1, "allreduce": 0.2}, "hitopk"),     # the plan was right: back to hitopk
])
def test_a_pilot_measures_the_runner_up_and_keeps_the_faster_on_this_script(step_s, final):
    # rank 1's clock says the opposite: every rank follows rank 0's
    opposite = {"hitopk": step_s["allreduce"], "allreduce": step_s["hitopk"]}
    results = run_ranks(auto_workers.piloted_replan, 2, _close_pair_plan(), step_s, opposite)
    for r in results:
        due = [(i + 1, e["due"]) for i, e in enumerate(r["events"]) if e is not None]
        assert due == [(PACE_CALLS + 1, "pilot"), (2 * PACE_CALLS + 2, "pilot")], due
        first, decided = (e for e in r["events"] if e is not None)
        assert first["measured"] == "hitopk d=0.05" and first["switched_to"] == "ddp"
        assert first["pace_s"] == pytest.approx(step_s["hitopk"])
        assert decided["paces"] == pytest.approx({"hitopk d=0.05": step_s["hitopk"],
                                                  "ddp": step_s["allreduce"]})
        # the plan's steps (100) at the measured pace, against the all-reduce's 100 steps
        assert decided["predicted_at_pace_s"]["hitopk d=0.05"] == \
            pytest.approx(100 * step_s["hitopk"])
        assert r["algorithms"][-1] == final and ("switched_to" in decided) == (final == "hitopk")
        best = "ddp" if final == "allreduce" else "hitopk d=0.05"
        assert r["auto"]["pilot"]["best"] == best == r["auto"]["pilot"]["chosen"]
    # conservation through both switches: delivered + still held = the ranks' dense average
    delivered = results[0]["synced"].sum(0) + results[0]["held"]
    expected = (results[0]["own"].sum(0) + results[1]["own"].sum(0)) / 2
    torch.testing.assert_close(delivered, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(results[0]["synced"], results[1]["synced"])


def test_a_frozen_peer_ends_a_timed_replan_within_registers_timeout():
    """The due flag's group, the ranks' agreement and the probe's broadcast wait as long as
    register(timeout=) says, not as long as the default group's timeout (60 s here; PyTorch's
    30 minutes where unset)."""
    timeout_s, init_timeout_s = 3, 60
    elapsed, message = frozen_run(
        auto_workers.frozen_peer_in_replan, 2,
        lambda tmp, result: (2, tmp, init_timeout_s, timeout_s, result, 3600.0))
    assert float(elapsed) <= timeout_s + 10 < init_timeout_s, (elapsed, message)
