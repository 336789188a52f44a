"""bench auto-grid: issue 31's targets from compare results, on hand-made races whose answers
are known (no cluster)."""

import argparse
import json
import math

import pytest

from thinwire.bench import auto_grid


def _run(algorithm, rate, t, choice=None):
    run = {"algorithm": algorithm, "inter_node_bandwidth": rate, "budget_s": 60.0,
           "status": "ok", "time_to_target_s": t, "train_time_s": t or 60.0}
    if choice:
        run["auto"] = {"choice": choice, "probe": {"bound_by": "link"}}
    return run


def _results(tmp_path, name, workload, runs):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"setting": {"workload": workload, "nodes": 2,
                                            "ranks_per_node": 2}, "runs": runs}))
    return str(path)


def test_targets_are_judged_per_cell_and_over_the_grid(tmp_path, capsys):
    a = _results(tmp_path, "a", "mnist", [
        _run("auto", "25mbit", 10.5, "hitopk d=0.05"), _run("hitopk", "25mbit", 10.0),
        _run("ddp", "25mbit", None),                       # missed: counts at the budget
        _run("auto", "1gbit", 5.0, "ddp-fp16 x"), _run("hitopk", "1gbit", 8.0),
        _run("ddp", "1gbit", 4.0)])                        # auto 25% slower here
    result = auto_grid.judge(argparse.Namespace(results=[a], json=str(tmp_path / "g.json")))
    rows = {r["rate"]: r for r in result["rows"]}
    assert rows["25mbit"]["fastest"] == "hitopk" and rows["25mbit"]["within_10pct"]
    assert rows["25mbit"]["vs_fastest"] == pytest.approx(1.05)
    assert rows["25mbit"]["ddp_s"] is None and rows["25mbit"]["auto_choice"] == "hitopk"
    assert rows["1gbit"]["vs_fastest"] == pytest.approx(1.25)
    assert not rows["1gbit"]["within_10pct"]
    summary = {r["algorithm"]: r for r in result["summary"]}
    assert summary["auto"]["within_10pct_share"] == 0.5
    assert summary["auto"]["worst_vs_fastest"] == pytest.approx(1.25)
    assert summary["ddp"]["missed"] == 1
    assert summary["ddp"]["geomean_s"] == pytest.approx(math.sqrt(60.0 * 4.0))
    assert summary["auto"]["geomean_s"] == pytest.approx(math.sqrt(10.5 * 5.0))
    assert summary["auto"]["lowest_geomean"]  # 7.2 against hitopk's 8.9 and ddp's 15.5
    assert not summary["auto"]["meets_share"] and summary["auto"]["meets_worst"]
    assert json.loads((tmp_path / "g.json").read_text())["rows"] == result["rows"]
    assert "vs_fastest" in capsys.readouterr().out


def test_a_rerun_in_a_later_file_replaces_the_earlier_run(tmp_path):
    first = _results(tmp_path, "a", "lm", [_run("auto", "100mbit", 30.0, "hitopk"),
                                           _run("hitopk", "100mbit", 20.0)])
    again = _results(tmp_path, "b", "lm", [_run("auto", "100mbit", 21.0, "hitopk")])
    result = auto_grid.judge(argparse.Namespace(results=[first, again], json=None))
    assert result["rows"][0]["vs_fastest"] == pytest.approx(1.05)


def test_a_cell_where_auto_missed_and_a_fixed_choice_did_not_fails_the_worst_bound(tmp_path):
    path = _results(tmp_path, "a", "lm", [_run("auto", "25mbit", None, "hitopk"),
                                          _run("hitopk", "25mbit", 40.0)])
    result = auto_grid.judge(argparse.Namespace(results=[path], json=None))
    assert result["rows"][0]["auto_missed"] and not result["rows"][0]["within_10pct"]
    auto = next(r for r in result["summary"] if r["algorithm"] == "auto")
    assert auto["worst_vs_fastest"] is None and not auto["meets_worst"]


def test_results_without_auto_are_refused(tmp_path):
    path = _results(tmp_path, "a", "lm", [_run("hitopk", "100mbit", 20.0)])
    with pytest.raises(ValueError, match="no cell with an auto run"):
        auto_grid.judge(argparse.Namespace(results=[path], json=None))
    with pytest.raises(ValueError, match="--results: .* is not a file"):
        auto_grid.judge(argparse.Namespace(results=[str(tmp_path / "x.json")], json=None))


def test_by_setting_names_powersgd_from_another_start_apart():
    run = dict(_run("powersgd", "25mbit", 9.0), powersgd_rank=4)
    assert auto_grid.label(run, by_setting=True) == "powersgd r=4"  # PyTorch's start (2)
    run["setting"] = {"powersgd_start_iter": 2}
    assert auto_grid.label(run, by_setting=True) == "powersgd r=4"
    run["setting"] = {"powersgd_start_iter": 0}
    assert auto_grid.label(run, by_setting=True) == "powersgd r=4 start=0"
    assert auto_grid.label(run) == "powersgd"
    assert auto_grid._choice({"choice": "powersgd rank=4 powersgd_start_iter=0", "settings": {
        "algorithm": "powersgd", "powersgd_start_iter": 0}}) == "powersgd start=0"
    assert auto_grid._choice({"choice": "hitopk d=0.05", "settings": {}}) == "hitopk"


def test_by_setting_gives_each_rank_and_density_its_own_geometric_mean(tmp_path):
    def run(algorithm, rate, t, **setting):
        return dict(_run(algorithm, rate, t), **setting)
    ranks = _results(tmp_path, "r", "mnist", [
        run("powersgd", "25mbit", 20.0, powersgd_rank=1, density=0.01),
        run("powersgd", "1gbit", 10.0, powersgd_rank=1, density=0.01)])
    other = _results(tmp_path, "s", "mnist", [
        run("powersgd", "25mbit", 30.0, powersgd_rank=4, density=0.01),
        run("powersgd", "1gbit", 5.0, powersgd_rank=4, density=0.01),
        run("hitopk", "25mbit", 15.0, density=0.01), run("hitopk", "1gbit", None, density=0.01)])
    result = auto_grid.judge(argparse.Namespace(results=[ranks, other], json=None,
                                                by_setting=True))
    summary = {r["algorithm"]: r for r in result["summary"]}
    assert set(summary) == {"powersgd r=1", "powersgd r=4", "hitopk d=0.01"}
    assert summary["powersgd r=1"]["geomean_s"] == pytest.approx(math.sqrt(200.0))
    assert summary["hitopk d=0.01"]["missed"] == 1  # counted at its 60 s budget
    rows = {r["rate"]: r for r in result["rows"]}
    assert rows["25mbit"]["fastest"] == "hitopk d=0.01"
    assert rows["1gbit"]["fastest"] == "powersgd r=4" and rows["1gbit"]["hitopk d=0.01_s"] is None
    # without --by-setting the same runs are one powersgd (the later file's) and no auto
    with pytest.raises(ValueError, match="give --by-setting"):
        auto_grid.judge(argparse.Namespace(results=[ranks, other], json=None))


def _seeded(run, seed):
    return {**run, "seed": seed}


def test_over_seeds_judges_every_seed_and_every_cell_by_its_medians(tmp_path, capsys):
    # the LM's case: which fixed choice is fastest changes with the seed; by its medians over
    # three seeds powersgd is the one to expect, and auto chose it
    runs = []
    for seed, (hitopk, powersgd, auto, choice) in {
            1: (30.0, 20.0, 21.0, "powersgd"), 2: (18.0, 22.0, 22.5, "powersgd"),
            3: (25.0, 21.0, 30.0, "hitopk")}.items():
        runs += [_seeded(_run("auto", "25mbit", auto, choice + " r=4"), seed),
                 _seeded(_run("hitopk", "25mbit", hitopk), seed),
                 _seeded(_run("powersgd", "25mbit", powersgd), seed),
                 _seeded(_run("ddp", "25mbit", None if seed != 2 else 50.0), seed)]
    path = _results(tmp_path, "s", "lm", runs)
    result = auto_grid.judge(argparse.Namespace(results=[path], json=None, over_seeds=True))
    per_seed = {r["seed"]: r for r in result["per_seed_rows"]}
    assert per_seed[2]["fastest"] == "hitopk"
    assert per_seed[2]["vs_fastest"] == pytest.approx(22.5 / 18.0)
    assert per_seed[3]["vs_fastest"] == pytest.approx(30.0 / 21.0)
    assert result["per_seed_summary"][0]["within_10pct_share"] == pytest.approx(1 / 3)
    [cell] = result["rows"]
    assert cell["seeds"] == "1,2,3" and cell["auto_choice"] == "powersgd/hitopk"
    assert cell["fastest"] == "powersgd" and cell["fastest_s"] == pytest.approx(21.0)
    assert cell["hitopk_s"] == pytest.approx(25.0) and cell["auto_s"] == pytest.approx(22.5)
    assert cell["vs_fastest"] == pytest.approx(22.5 / 21.0) and cell["within_10pct"]
    # ddp missed at two of three seeds: its median is a miss, counted at the budget
    assert cell["ddp_s"] is None
    summary = {r["algorithm"]: r for r in result["summary"]}
    assert summary["ddp"]["missed"] == 1 and summary["ddp"]["geomean_s"] == pytest.approx(60.0)
    assert summary["auto"]["within_10pct_share"] == 1.0
    out = capsys.readouterr().out
    assert "every (cell, seed)" in out and "median time over its seeds" in out


def test_over_seeds_uses_only_the_seeds_where_every_algorithm_ran(tmp_path):
    runs = [_seeded(_run("auto", "1gbit", 10.0, "ddp-fp16"), 1),
            _seeded(_run("ddp", "1gbit", 9.0), 1),
            _seeded(_run("auto", "1gbit", 10.0, "ddp-fp16"), 2),
            _seeded(_run("ddp", "1gbit", 11.0), 2),
            _seeded(_run("auto", "1gbit", 40.0, "ddp-fp16"), 3)]  # seed 3: ddp not raced
    path = _results(tmp_path, "p", "mnist", runs)
    result = auto_grid.judge(argparse.Namespace(results=[path], json=None, over_seeds=True))
    [cell] = result["rows"]
    assert cell["seeds"] == "1,2" and cell["auto_s"] == pytest.approx(10.0)
    assert cell["ddp_s"] == pytest.approx(10.0)


def test_a_race_under_a_schedule_is_a_cell_of_its_own_named_by_the_schedule(tmp_path):
    """compare --bandwidth-schedule races record the rate they start at: they are not that
    rate's cell, and they sort after it; so are races with a node failure."""
    fixed = _results(tmp_path, "fixed", "mnist", [_run("auto", "200mbit", 8.0, "hitopk"),
                                                  _run("hitopk", "200mbit", 8.0)])
    path = tmp_path / "sched.json"
    schedule = "0s:200mbit,4s:25mbit,12s:200mbit"
    path.write_text(json.dumps({"setting": {"workload": "mnist", "nodes": 2, "ranks_per_node": 2,
                                            "resources": {"bandwidth_schedule": schedule}},
                                "runs": [_run("auto", "200mbit", 12.0, "hitopk"),
                                         _run("powersgd", "200mbit", 10.0)]}))
    result = auto_grid.judge(argparse.Namespace(results=[fixed, str(path)], json=None))
    assert [r["rate"] for r in result["rows"]] == ["200mbit", f"200mbit schedule {schedule}"]
    assert result["rows"][1]["vs_fastest"] == pytest.approx(1.2)
    assert result["rows"][0]["vs_fastest"] == pytest.approx(1.0)


def test_a_race_with_a_failure_is_a_cell_of_its_own_too():
    from thinwire.bench.auto_grid import cell_rate

    assert cell_rate({"inter_node_bandwidth": "100mbit"}, {}) == "100mbit"
    assert cell_rate({"inter_node_bandwidth": "100mbit"},
                     {"resources": {"failure_schedule": "node1@5s"}}) == \
        "100mbit fail node1@5s"


def _curve(step_ms):
    """Evaluations every 2 steps, each interval taking its entry of ``step_ms`` a step."""
    curve, t = [{"step": 0, "train_time_s": 0.0}], 0.0
    for i, ms in enumerate(step_ms):
        t += 2 * ms / 1000
        curve.append({"step": 2 * (i + 1), "train_time_s": t})
    return curve


def test_a_switch_shows_auto_s_step_time_after_it_beside_the_new_algorithm_s_own(tmp_path):
    auto = _run("auto", "200mbit", 10.0, "hitopk d=0.05")
    auto["auto"]["replanning"] = {
        "checks": [{"step": 4, "took_s": 0.5}, {"step": 8, "took_s": 0.25}],
        "switches": [{"step": 4, "to": "powersgd rank=4"}]}
    # hitopk, then the interval holding the check (not counted), then PowerSGD's steps
    auto["curve"] = _curve([200, 200, 450, 300, 310, 330])
    own = dict(_run("powersgd", "200mbit", 9.0), curve=_curve([500, 250, 250, 240, 260, 250]))
    path = _results(tmp_path, "s", "mnist", [auto, own, _run("hitopk", "200mbit", 11.0)])
    [row] = auto_grid.judge(argparse.Namespace(results=[path], json=None))["rows"]
    assert row["switched_at"] == 4 and row["checks_s"] == pytest.approx(0.75)
    assert row["after_switch_ms"] == pytest.approx(310)      # steps 6-12: 300, 310, 330
    assert row["own_after_switch_ms"] == pytest.approx(250)  # the same steps: 240, 260, 250
    assert row["steps"] is None and row["own_steps"] is None  # no target recorded
    for run in (auto, own):
        run.update(metric="test_accuracy", target=0.92)
    auto["curve"][-2]["test_accuracy"] = 0.95  # auto reaches 0.92 at step 10
    for point, accuracy in zip(own["curve"][4:], (0.5, 0.93, 0.95)):  # PowerSGD at step 10 too
        point["test_accuracy"] = accuracy
    path = _results(tmp_path, "s2", "mnist", [auto, own, _run("hitopk", "200mbit", 11.0)])
    [row] = auto_grid.judge(argparse.Namespace(results=[path], json=None))["rows"]
    assert (row["steps"], row["own_steps"]) == (10, 10)


def test_a_re_planned_run_without_a_switch_has_the_switch_columns_empty(tmp_path):
    kept = _run("auto", "25mbit", 10.0, "hitopk")
    kept["auto"]["replanning"] = {"checks": [{"step": 4, "took_s": 0.1}], "switches": []}
    path = _results(tmp_path, "n", "mnist", [kept, _run("hitopk", "25mbit", 10.0),
                                             _run("auto", "1gbit", 5.0, "ddp-fp16"),
                                             _run("hitopk", "1gbit", 6.0)])
    rows = {r["rate"]: r for r in auto_grid.judge(argparse.Namespace(results=[path],
                                                                     json=None))["rows"]}
    assert rows["25mbit"]["switched_at"] is None and rows["25mbit"]["after_switch_ms"] is None
    assert "switched_at" not in rows["1gbit"]  # not re-planned at all
