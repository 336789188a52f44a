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


def _pace_steps(curve, reference, confirm):
    return [step for step, why in pace_trigger.replay(curve, 0.3, reference, confirm)]


def test_one_noisy_interval_fires_the_one_interval_rule_only_and_a_lasting_jump_both():
    assert _pace_steps(_curve(0.5, 0.5, 2.0), 1, 1) == []  # the run ends there
    noisy = _curve(0.5, 0.5, 0.8, 0.5, 0.5, 0.5, 0.5)
    assert pace_trigger.replay(noisy, 0.3, reference=1, confirm=1) == [(6, "pace")]
    assert _pace_steps(noisy, 2, 2) == []
    jump = _curve(0.5, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0)
    assert _pace_steps(jump, 1, 1) == [8]
    assert _pace_steps(jump, 2, 2) == [10]


def test_the_clock_checks_too_and_restarts_the_pace_reference():
    # 0.5 s a step for 16 steps, then 1 s: the clock (every 9 s of training) checks at step 18,
    # and the slower intervals after it are the new reference, not a move; without the clock
    # the pace moved past the share at steps 18 and 20
    curve = _curve(*([0.5] * 8 + [1.0] * 5))
    assert pace_trigger.replay(curve, 0.3, 2, 2, every_s=9.0) == [(18, "clock")]
    assert pace_trigger.replay(curve, 0.3, 2, 2) == [(20, "pace")]


def test_the_recorded_checks_time_is_taken_out_of_the_curve():
    # 0.5 s a step throughout; after step 4 a check took 2 s (probe and plan), after step 8 a
    # check and its switch 1.5 s as the loop recorded it (took_s), after step 12 a switch of
    # an older record 0.5 s beside its check's 0.25 s probe and plan
    times = [0.0, 1.0, 2.0, 5.0, 6.0, 8.5, 9.5, 11.25]
    curve = [{"step": 2 * i, "train_time_s": t} for i, t in enumerate(times)]
    run = {"curve": curve, "auto": {"replanning": {
        "checks": [{"step": 4, "probe_s": 1.5, "probe_and_plan_s": 2.0},
                   {"step": 8, "probe_s": 0.2, "took_s": 1.5},
                   {"step": 12, "probe_s": 0.1, "probe_and_plan_s": 0.25}],
        "switches": [{"step": 8, "switch_s": 1.0}, {"step": 12, "switch_s": 0.5}]}}}
    cleaned = pace_trigger.cleaned_curve(run)
    assert [p["train_time_s"] for p in cleaned] == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0, 5.0,
                                                                  6.0, 7.0])


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
