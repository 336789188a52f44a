"""thinwire.ddp.register(ddp_model, "auto", plan=...) on 2 gloo ranks (2 nodes x 1, loopback):
the leaders probe, every rank registers the plan's fastest hook at the probed rate, and the
gradients are the ranks' average; ranks whose plans would choose differently all fail alike."""

import sys
from pathlib import Path

import torch

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_plan_choice import plan_of  # noqa: E402

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


def test_ranks_whose_plans_choose_differently_all_fail_alike():
    other = plan_of()
    for at in other["plans"]:  # hitopk fastest at every rate on rank 1
        for row in at["rows"]:
            if row["algorithm"] == "hitopk":
                row["time_to_target_s"] = 1.0
    results = run_ranks(auto_workers.register_auto, 2, [plan_of(), other])
    assert all("chose differently" in r.get("error", "") for r in results), results



def test_a_plan_one_rank_cannot_read_ends_every_rank_without_a_wait(tmp_path):
    results = run_ranks(auto_workers.register_auto, 2, [plan_of(), str(tmp_path / "no.json")])
    assert "another rank failed at checking its plan" in results[0].get("error", ""), results
    assert "not a readable JSON plan" in results[1].get("error", ""), results
