"""thinwire bench seed-holdout: one seed held out at a time, each rule chooses from the others'
steps and is scored at the held-out seed (a plan dict whose answer is worked by hand)."""

import argparse
import json

import pytest

from thinwire.bench import seed_holdout


def _plan():
    # one rate; step times 1 s (a) and 2 s (b), no warm-up: time = steps x step time
    steps = {"a": {"0": [10], "1": [30], "2": [12]}, "b": {"0": [8], "1": [8], "2": [9]}}
    step_s = {"a": 1.0, "b": 2.0}
    rows, table = [], []
    for name, by_seed in steps.items():
        median = sorted(v[0] for v in by_seed.values())[1]
        rows.append({"candidate": name, "step_s": step_s[name], "steps": median,
                     "time_to_target_s": median * step_s[name]})
        table.append({"candidate": name, "steps_by_seed": by_seed})
    rows.append({"candidate": "c", "step_s": 0.1, "steps": None, "time_to_target_s": None})
    return {"plans": [{"rate": "100mbit", "rows": rows}], "steps_table": table}


def test_each_seed_held_out_is_scored_by_each_rule():
    # times: a 10/30/12, b 16/16/18. Held out 0: seen a 30/12 (median 21, worst 30/16), b 16/18
    # (median 17, worst 18/12): every rule takes b, 16 against a's 10 there.
    rows = {r["held_out_seed"]: r for r in seed_holdout.holdout_rows(_plan())}
    assert rows[0]["fastest"] == "a" and rows[0]["median"] == "b"
    assert rows[0]["median_loss"] == pytest.approx(1.6)
    # held out 1: seen a 10/12, b 16/18: a, right (30 against b's 16: b fastest)
    assert rows[1]["fastest"] == "b" and rows[1]["median"] == "a"
    assert rows[1]["least-worst-loss_loss"] == pytest.approx(30 / 16)
    # held out 2: seen a 10/30 (mean 20, worst 30/16), b 16/16 (mean 16, worst 1.6): b
    assert rows[2]["mean"] == rows[2]["least-worst-loss"] == "b"
    assert rows[2]["mean_loss"] == pytest.approx(18 / 12)
    summary = {s["rule"]: s for s in seed_holdout.summary(list(rows.values()))}
    assert summary["median"]["cases"] == 3 and summary["median"]["within_10pct"] == 0
    assert summary["median"]["worst_loss"] == pytest.approx(30 / 16)
    # in hindsight (every seed seen) a is within 10% of the fastest at seeds 0 and 2, b only
    # at 1: a at every held-out seed, the bound no one-choice rule passes
    assert {r["hindsight"] for r in rows.values()} == {"a"}
    assert rows[1]["hindsight_loss"] == pytest.approx(30 / 16)
    assert summary["hindsight"]["within_10pct"] == 2


def test_a_table_of_one_seed_is_refused_by_name(tmp_path, monkeypatch):
    plan = _plan()
    for row in plan["steps_table"]:
        row["steps_by_seed"] = {"0": row["steps_by_seed"]["0"]}
    monkeypatch.setattr("thinwire.sim.plan.make_plan", lambda *a, **k: plan)
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"setting": {}, "runs": []}))  # make_plan is replaced
    args = argparse.Namespace(calibrate=[str(sweep)], calibrate_at=None, repeats="each",
                              steps_from=None, workload=None, nodes=None, ranks_per_node=None,
                              inter_node_bandwidth="100mbit", json=None, steps_to=None)
    with pytest.raises(ValueError, match="--steps-from: fewer than two seeds"):
        seed_holdout.run(args)
