"""--algorithm auto: its checks, and its choice from a probed goodput on synthetic compare results
whose fastest candidate at each rate is known by construction (plan_helpers)."""

import dataclasses

import pytest

from thinwire.train.auto import choose
from thinwire.train.compare import CompareSettings

from plan_helpers import STEPS, _repetitions, _results, _truth_time


def _cfg(path, **train):
    return CompareSettings(workload="mnist", algorithms=["auto"],
                           train={"plan_from": str(path), **train}).run_config("auto")


@pytest.mark.parametrize("bps", [5e7, 1e9])
def test_auto_chooses_the_fastest_candidate_at_the_probed_rate(tmp_path, bps):
    path = _results(tmp_path)
    # the probe reports goodput: the nominal rate times the link's efficiency (0.85 here)
    chosen, info = choose(_cfg(path), 2, {"goodput_Bps": 0.85 * bps / 8})
    fastest = min(STEPS, key=lambda a: _truth_time(a, bps, tmp_path))
    assert chosen["algorithm"] == fastest
    assert info["planned_at_bps"] == pytest.approx(bps, rel=0.05)
    assert info["choice"].split()[0] == fastest and "fastest predicted" in info["reason"]
    if fastest == "hitopk":  # the measured configuration's settings come with it
        assert chosen["density"] == 0.05 and chosen["sparse_wire"] == "fp16"


def test_auto_chooses_only_among_the_plan_algorithms(tmp_path):
    path = _results(tmp_path)
    probe = {"goodput_Bps": 0.85 * 5e7 / 8}  # hitopk is the fastest here by construction
    assert choose(_cfg(path), 2, probe)[0]["algorithm"] == "hitopk"
    chosen, info = choose(_cfg(path, plan_algorithms="allreduce,powersgd"), 2, probe)
    assert chosen["algorithm"] == "allreduce"  # powersgd has no measured steps: not ranked
    assert info["among"] == ["allreduce", "powersgd"]
    assert all(r["candidate"].split()[0] in ("allreduce", "powersgd")
               for r in info["runners_up"])
    with pytest.raises(ValueError, match="no candidate of --plan-algorithms powersgd that "
                                         "reached the target"):
        choose(_cfg(path, plan_algorithms="powersgd"), 2, probe)


def test_auto_fits_a_sweeps_repetitions_by_their_median_where_asked(tmp_path):
    """--plan-repeats median: three repetitions, one at 1.6x and one at 0.9x every step, plan
    as the clean sweep does; fitted run by run (the default) they do not."""
    clean = _results(tmp_path)
    copies = [str(path) for path in _repetitions(tmp_path, (1.0, 1.6, 0.9))]
    probe = {"goodput_Bps": 0.85 * 2e8 / 8}
    _, single = choose(_cfg(clean), 2, probe)
    _, median = choose(_cfg(",".join(copies), plan_repeats="median"), 2, probe)
    _, each = choose(_cfg(",".join(copies)), 2, probe)
    assert (median["repeats"], each["repeats"]) == ("median", "each")
    assert median["predicted_time_to_target_s"] == pytest.approx(
        single["predicted_time_to_target_s"], rel=1e-6)
    assert each["predicted_time_to_target_s"] != pytest.approx(
        single["predicted_time_to_target_s"], rel=0.02)


def test_auto_refuses_a_plan_measured_for_another_training(tmp_path):
    cfg = _cfg(_results(tmp_path), batch_size=64)
    with pytest.raises(ValueError, match="measured another training than this run's: "
                                         "batch_size 32 there, 64 here"):
        choose(cfg, 2, {"goodput_Bps": 1e7})


def test_auto_refuses_a_cluster_shape_without_steps(tmp_path):
    with pytest.raises(ValueError, match="no steps to target measured for mnist on 3 x 2"):
        choose(_cfg(_results(tmp_path)), 3, {"goodput_Bps": 1e7})


@pytest.mark.parametrize("change, message", [
    ({"plan_from": ""}, "--algorithm auto needs --plan-from"),
    ({"plan_from": "/nonexistent/results.json"}, "--plan-from: /nonexistent/results.json is "
                                                 "not a file"),
    ({"density": 0.05}, "--density applies to a sparse algorithm"),
    ({"handover_steps": 0}, "--handover-steps must be an integer >= 1, got 0"),
    ({"plan_repeats": "mean"}, "--plan-repeats must be one of each, median, got 'mean'"),
    ({"plan_algorithms": "hitopk,auto"}, "--plan-algorithms: 'auto' is not an algorithm the "
                                         "plan ranks"),
])
def test_auto_settings_are_checked_before_anything_runs(tmp_path, change, message):
    cfg = dataclasses.replace(_cfg(_results(tmp_path)), **change)
    with pytest.raises(ValueError, match=message):
        cfg.validate()


def test_a_resumed_run_goes_on_with_the_choice_its_checkpoint_was_written_under(tmp_path):
    from thinwire.train import auto, checkpoint

    cfg = dataclasses.replace(_cfg(_results(tmp_path)), resume=str(tmp_path / "ckpt"))
    plan_choice = ({"algorithm": "allreduce"}, {"choice": "allreduce", "reason": "fastest"})
    hitopk = {"algorithm": "hitopk", "density": 0.05}
    checkpoint.save(cfg.resume, 0, {"step": 12, "identity": {"algorithm": "hitopk"},
                                    "auto": {"choice": "hitopk d=0.05", "settings": hitopk}})
    files = [checkpoint.saved_choices(cfg.resume, 0)]
    chosen, info = auto._resumed(cfg, *plan_choice, cfg.resume, files)
    assert chosen == hitopk and info["choice"] == "hitopk d=0.05"
    assert info["resumed"] == {"from": cfg.resume, "step": 12, "plan_now": "allreduce"}
    # not resuming, or --resume-if-present with nothing there: the plan's choice
    assert auto._resumed(cfg, *plan_choice, None, [[]]) == plan_choice
    assert auto._resumed(cfg, *plan_choice, cfg.resume, [[], []]) == plan_choice
    # a checkpoint of a run that was not auto's, or a choice this run cannot take
    checkpoint.save(cfg.resume, 0, {"step": 14, "identity": {"algorithm": "ddp"}})
    with pytest.raises(ValueError, match="not written by --algorithm auto .* --algorithm ddp"):
        auto._resumed(cfg, *plan_choice, cfg.resume, [checkpoint.saved_choices(cfg.resume, 0)])
    checkpoint.save(cfg.resume, 0, {"step": 16, "auto": {
        "choice": "x", "settings": {"algorithm": "hitopk", "no_such_option": 1}}})
    with pytest.raises(ValueError, match="the choice recorded in its checkpoint .'x'. does not "
                                         "apply to this run"):
        auto._resumed(cfg, *plan_choice, cfg.resume, [checkpoint.saved_choices(cfg.resume, 0)])


def _file(step, choice):
    return {"step": step, "algorithm": choice, "auto": {"choice": choice,
                                                        "settings": {"algorithm": choice}}}


def test_the_resumed_choice_is_that_of_the_newest_step_every_rank_holds():
    from thinwire.train.auto import resumable_choice

    # rank 0 wrote step 5 after a switch, rank 1 was lost before it: step 2 (hitopk) for all
    per_rank = [[_file(5, "allreduce"), _file(2, "hitopk")], [_file(2, "hitopk")]]
    assert resumable_choice(per_rank)["auto"]["choice"] == "hitopk"
    # rank 0's newest file corrupt (left out): the same
    per_rank = [[_file(2, "hitopk")], [_file(5, "allreduce"), _file(2, "hitopk")]]
    assert resumable_choice(per_rank)["step"] == 2
    # both wrote step 5: its choice
    assert resumable_choice([[_file(5, "allreduce"), _file(2, "hitopk")]] * 2)["step"] == 5
    # the ranks disagree on a step's choice, or share none: nothing (the load says why)
    assert resumable_choice([[_file(5, "allreduce")], [_file(5, "hitopk")]]) is None
    assert resumable_choice([[_file(5, "allreduce")], []]) is None


def test_the_compute_probe_scales_the_fitted_compute(tmp_path):
    from thinwire.train import auto_compute

    path = _results(tmp_path)
    median, low, high = auto_compute.calibration_ms([path], 2, 2, "widecnn")
    assert median == pytest.approx(80.0) and low <= median <= high
    assert auto_compute.calibration_ms([path], 4, 1, "widecnn") is None  # another shape
    assert auto_compute.calibration_ms([path], 2, 2, "lenet") is None
    _, as_fitted = choose(_cfg(path), 2, {"goodput_Bps": 1e7})
    _, faster = choose(_cfg(path), 2, {"goodput_Bps": 1e7}, compute_ms=8.0)  # 10x faster
    _, near = choose(_cfg(path), 2, {"goodput_Bps": 1e7}, compute_ms=60.0)  # within the margin
    assert near["compute"]["scale"] == 1.0
    assert as_fitted["compute"]["source"] == "calibration (not probed)"
    assert faster["compute"]["scale"] == pytest.approx(0.1)
    _, alike = choose(_cfg(path), 2, {"goodput_Bps": 1e7}, compute_ms=median)  # unscaled
    assert alike["compute"]["scale"] == 1.0
    assert "within its spread" in alike["compute"]["source"]
    assert faster["compute"]["planned_ms"] == pytest.approx(
        as_fitted["compute"]["planned_ms"] / 10)
    assert faster["predicted_time_to_target_s"] < as_fitted["predicted_time_to_target_s"]


def test_a_cluster_that_computes_much_slower_changes_the_choice(tmp_path):
    # by construction hitopk needs 4x the all-reduce's steps and wins at 50 Mbit/s on the
    # calibration's compute; where a step's compute is 10x that, the fewest steps win
    path = _results(tmp_path)
    goodput = 0.85 * 5e7 / 8
    as_fitted, _ = choose(_cfg(path), 2, {"goodput_Bps": goodput})
    slow, _ = choose(_cfg(path), 2, {"goodput_Bps": goodput}, compute_ms=800.0)
    assert (as_fitted["algorithm"], slow["algorithm"]) == ("hitopk", "allreduce")


def test_steps_from_more_seeds_move_the_estimate_to_their_median(tmp_path):
    path = _results(tmp_path)
    more = tmp_path / "seeds"
    more.mkdir()
    # seeds 1 and 2: hitopk needs 40 more steps (120 against seed 0's 80)
    extra = _results(more, seeds=(1, 2), extra_steps={("hitopk", 1): 40, ("hitopk", 2): 40})
    name = "hitopk d=0.05 mstopk-carry values=fp16"
    probe = {"goodput_Bps": 0.85 * 5e7 / 8}
    _, one_seed = choose(_cfg(path), 2, probe, current=name)
    _, three = choose(_cfg(path, plan_steps_from=str(extra)), 2, probe, current=name)
    assert three["current_time_to_target_s"] == pytest.approx(
        one_seed["current_time_to_target_s"] * 120 / 80, rel=0.02)


def test_a_steps_file_that_is_not_there_is_refused_before_anything_runs(tmp_path):
    from thinwire.train.auto import check_config

    with pytest.raises(ValueError, match="--plan-steps-from: .* is not a file"):
        check_config(_cfg(_results(tmp_path), plan_steps_from=str(tmp_path / "no.json")))


@pytest.mark.parametrize("flag", ["plan_from", "plan_steps_from"])
def test_a_plan_file_that_is_not_compare_results_is_refused_before_anything_runs(tmp_path,
                                                                               flag):
    from thinwire.train.auto import check_config

    notes = tmp_path / "README.md"
    notes.write_text("# not results\n")
    good = str(_results(tmp_path))
    cfg = _cfg(str(notes)) if flag == "plan_from" else _cfg(good, plan_steps_from=str(notes))
    option = "--" + flag.replace("_", "-")
    with pytest.raises(ValueError, match=f"{option} file .*README.md"):
        check_config(cfg)


def test_a_resume_the_plan_cannot_choose_for_goes_on_with_the_checkpoints_choice(tmp_path):
    """A spot node lost: the run resumes on 3 x 2, for which no steps were measured. The plan
    fails there, but the checkpoint's choice can go on (without re-planning); with no
    checkpoint to go on from, the plan's error is the run's."""
    from thinwire.train import auto, checkpoint

    cfg = dataclasses.replace(_cfg(_results(tmp_path)), resume=str(tmp_path / "ckpt"))
    with pytest.raises(ValueError) as failed:
        choose(cfg, 3, {"goodput_Bps": 1e7})
    failed_plan = {"probe": {"goodput_Bps": 1e7}, "plan_error": str(failed.value)}
    hitopk = {"algorithm": "hitopk", "density": 0.05}
    checkpoint.save(cfg.resume, 0, {"step": 12, "identity": {"algorithm": "hitopk"},
                                    "auto": {"choice": "hitopk d=0.05", "settings": hitopk}})
    files = [checkpoint.saved_choices(cfg.resume, 0)]
    chosen, info = auto._resumed(cfg, None, failed_plan, cfg.resume, files)
    assert chosen == hitopk and info["choice"] == "hitopk d=0.05"
    assert info["resumed"] == {"from": cfg.resume, "step": 12, "plan_now": None}
    assert "no re-planning" in info["reason"] and "3 x 2" in info["plan_error"]
    with pytest.raises(ValueError, match="no steps to target measured for mnist on 3 x 2"):
        auto._resumed(cfg, None, failed_plan, cfg.resume, [[]])


def _intra(goodput, bound_by="link"):
    return {"ranks_per_node": 2, "goodput_Bps": goodput, "fixed_s": 1e-3, "host_busy": 0.5,
            "throttled_share": 0.0, "bound_by": bound_by}


def test_the_plan_takes_the_intra_node_rate_the_probe_measured(tmp_path):
    """A run's nodes may hold another link inside than the calibration's (NVLink, PCIe): the
    probe's rate replaces the fit's where the probe measured the link; a host-bound probe
    leaves the fit's. (The synthetic calibration's intra-node link is 2 GB/s.)"""
    path = _results(tmp_path)
    probe = {"goodput_Bps": 0.85 * 5e7 / 8}
    _, fitted = choose(_cfg(path), 2, probe)
    _, slow = choose(_cfg(path), 2, dict(probe, intra_node=_intra(2e7)))
    _, host = choose(_cfg(path), 2, dict(probe, intra_node=_intra(2e7, "host")))
    assert fitted["intra_node_link"]["source"] == "calibration"
    # (the fit pins the intra-node rate poorly: few of a step's seconds wait on it)
    assert fitted["intra_node_link"]["planned_Bps"] == fitted["intra_node_link"]["fitted_Bps"]
    assert slow["intra_node_link"]["source"] == "probe"
    assert slow["intra_node_link"]["planned_Bps"] == 2e7
    # every candidate moves bytes inside the nodes: a 100x slower link there costs time
    assert slow["predicted_time_to_target_s"] > 1.1 * fitted["predicted_time_to_target_s"]
    assert host["intra_node_link"]["source"] == "calibration"
    assert host["predicted_time_to_target_s"] == pytest.approx(
        fitted["predicted_time_to_target_s"])


def test_mid_run_a_candidate_is_ranked_without_the_warm_up_a_switch_does_not_run(tmp_path):
    """hitopk raced with 30 dense first steps: from the start the all-reduce is the faster at
    50 Mbit/s (those steps charged), under way hitopk is (a switch runs no warm-up)."""
    import json

    path = _results(tmp_path)
    results = json.loads(path.read_text())
    for run in results["runs"]:
        if run["algorithm"] == "hitopk":
            run["dense_warmup_steps"] = 30
    path.write_text(json.dumps(results))
    probe = {"goodput_Bps": 0.85 * 5e7 / 8}
    _, first = choose(_cfg(path), 2, probe)
    assert first["choice"] == "allreduce"
    _, under_way = choose(_cfg(path), 2, probe, per_step_only=True, current="allreduce")
    assert under_way["choice"].startswith("hitopk") and "dense_warmup_steps=30" in \
        under_way["choice"]
    assert under_way["predicted_time_to_target_s"] < under_way["current_time_to_target_s"]
    best, current = under_way["switch"]["best"], under_way["switch"]["current"]
    assert under_way["predicted_time_to_target_s"] == pytest.approx(best["steps"] * best["step_s"])
    assert current["steps"] * current["step_s"] == pytest.approx(
        under_way["current_time_to_target_s"])
