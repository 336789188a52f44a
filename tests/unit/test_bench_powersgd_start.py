"""thinwire bench powersgd-start: PowerSGD runs of compare results read back by the step they
start compressing at, each compared with the baseline start at the same rate and seed."""

import json

import pytest

from thinwire.bench import powersgd_start


def _results(tmp_path, name, start, runs):
    path = tmp_path / name
    path.write_text(json.dumps({
        "setting": {"workload": "mnist", "powersgd_start_iter": start},
        "runs": [{"algorithm": "powersgd", "inter_node_bandwidth": rate, "seed": seed,
                  "setting": {"powersgd_start_iter": start}, "time_to_target_s": t,
                  "steps": steps} for rate, seed, t, steps in runs]
        + [{"algorithm": "hitopk", "inter_node_bandwidth": "25mbit", "seed": 0,
            "time_to_target_s": 1.0, "steps": 9}]}))
    return str(path)


def test_each_start_is_compared_with_the_baseline_at_the_same_rate_and_seed(tmp_path):
    two = _results(tmp_path, "a.json", 2, [("25mbit", 0, 20.0, 42), ("25mbit", 1, 24.0, 40),
                                          ("200mbit", 0, 10.0, 42)])
    zero = _results(tmp_path, "b.json", 0, [("25mbit", 0, 10.0, 44), ("25mbit", 1, None, 60),
                                           ("200mbit", 0, 9.0, 40)])
    rows = powersgd_start.compared(powersgd_start.powersgd_runs([two, zero]), baseline=2)
    assert len(rows) == 6  # the hitopk runs are not read
    by = {(r["rate"], r["seed"], r["start_iter"]): r for r in rows}
    assert by[("25mbit", 0, 0)]["vs_baseline"] == pytest.approx(0.5)
    assert by[("25mbit", 1, 0)]["vs_baseline"] is None and by[("25mbit", 1, 0)]["steps"] is None
    assert by[("200mbit", 0, 0)]["vs_baseline"] == pytest.approx(0.9)
    assert by[("25mbit", 0, 2)]["vs_baseline"] == pytest.approx(1.0)
    summary = {(s["rate"], s["start_iter"]): s for s in powersgd_start.summary(rows)}
    assert summary[("25mbit", 0)]["missed"] == 1 and summary[("25mbit", 0)]["seeds"] == 2
    assert summary[("25mbit", 0)]["median_time_s"] == pytest.approx(10.0)
    assert summary[("25mbit", 2)]["median_steps"] == pytest.approx(41)


def test_a_run_that_does_not_record_its_start_is_refused_by_name(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"setting": {}, "runs": [
        {"algorithm": "powersgd", "inter_node_bandwidth": "25mbit", "seed": 0,
         "time_to_target_s": 3.0, "steps": 5}]}))
    with pytest.raises(ValueError, match="old.json.*powersgd_start_iter"):
        powersgd_start.powersgd_runs([str(path)])
