"""thinwire bench pace-trigger: the real pace trigger replayed over recorded curves, the time of
the recorded checks taken out."""

import argparse
import json

import pytest

from thinwire.bench import pace_trigger


def _curve(*paces, start=0.0):
    """A curve of 2-step intervals at ``paces`` seconds a step."""
    points, t = [{"step": 0, "train_time_s": start}], start
    for i, pace in enumerate(paces, 1):
        t += 2 * pace
        points.append({"step": 2 * i, "train_time_s": t})
    return points


def test_one_noisy_interval_fires_the_one_interval_rule_only_and_a_lasting_jump_both():
    assert pace_trigger.replay(_curve(0.5, 0.5, 2.0), 0.3, 1, 1) == []  # the run ends there
    noisy = _curve(0.5, 0.5, 0.8, 0.5, 0.5, 0.5, 0.5)
    assert pace_trigger.replay(noisy, 0.3, reference=1, confirm=1) == [6]
    assert pace_trigger.replay(noisy, 0.3, reference=2, confirm=2) == []
    jump = _curve(0.5, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0)
    assert pace_trigger.replay(jump, 0.3, reference=1, confirm=1) == [8]
    assert pace_trigger.replay(jump, 0.3, reference=2, confirm=2) == [10]


def test_the_recorded_checks_time_is_taken_out_of_the_curve():
    # 0.5 s a step throughout; a check after step 4 took 2 s (probe and plan) of training time
    curve = [{"step": s, "train_time_s": t} for s, t in ((0, 0.0), (2, 1.0), (4, 2.0),
                                                         (6, 5.0), (8, 6.0))]
    run = {"curve": curve, "auto": {"replanning": {"checks": [
        {"step": 4, "probe_s": 1.5, "probe_and_plan_s": 2.0}], "switches": []}}}
    cleaned = pace_trigger.cleaned_curve(run)
    assert [p["train_time_s"] for p in cleaned] == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])


def test_the_bench_counts_what_each_rule_fires_on_steady_and_scheduled_runs(tmp_path, capsys):
    def results(name, schedule, curve, recorded):
        path = tmp_path / name
        path.write_text(json.dumps({
            "setting": {"workload": "mnist", "resources": {"bandwidth_schedule": schedule}},
            "runs": [{"algorithm": "auto", "inter_node_bandwidth": "25mbit", "curve": curve,
                      "auto": {"replanning": {"share": 0.3, "checks": [
                          {"step": s, "probe_s": 0.0} for s in recorded], "switches": []}}},
                     {"algorithm": "hitopk", "inter_node_bandwidth": "25mbit",
                      "curve": curve}]}))
        return str(path)
    steady = results("a.json", None, _curve(0.5, 0.5, 0.8, 0.5, 0.5, 0.5, 0.5), [6])
    changing = results("b.json", "0s:200mbit,4s:25mbit",
                       _curve(0.5, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0),
                       [8])
    out = tmp_path / "out.json"
    assert pace_trigger.run(argparse.Namespace(results=[steady, changing], rules=["1,1", "2,2"],
                                               json=str(out))) == 0
    summary = {r["rule"]: r for r in json.loads(out.read_text())["summary"]}
    fired = {rule: (r["fired_steady"], r["fired_scheduled"]) for rule, r in summary.items()}
    assert fired == {"ref1_confirm1": (1, 1), "ref2_confirm2": (0, 1)}
    assert "ref2_confirm2" in capsys.readouterr().out


@pytest.mark.parametrize("rule", ["1", "0,1", "a,b"])
def test_a_bad_rule_is_refused_by_name(tmp_path, rule):
    with pytest.raises(ValueError, match="--rules"):
        pace_trigger.run(argparse.Namespace(results=[], rules=[rule], json=None))
