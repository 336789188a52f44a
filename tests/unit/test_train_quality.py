"""Time to target, quality at a budget and the stop decision, on synthetic evaluation curves;
compare's settings and report on made-up runs (no training)."""

import json
import math
import stat

import pytest

from thinwire.train import quality, report, workloads
from thinwire.train.compare import CompareSettings, write_json


def curve(times, values, metric="test_accuracy"):
    return [{"train_time_s": t, metric: v} for t, v in zip(times, values)]


ACC = curve([1.0, 2.0, 3.0, 4.0], [0.5, 0.85, 0.91, 0.89])
BPB = curve([5.0, 10.0, 15.0], [6.0, 4.2, 3.9], "bits_per_byte")


def test_time_to_target_is_the_first_evaluation_at_or_past_it():
    assert quality.time_to_target(ACC, "test_accuracy", 0.9) == 3.0
    assert quality.time_to_target(ACC, "test_accuracy", 0.85) == 2.0  # equal counts
    assert quality.time_to_target(ACC, "test_accuracy", 0.95) is None
    assert quality.time_to_target(ACC, "test_accuracy", 0.9, budget_s=3.0) == 3.0
    assert quality.time_to_target(ACC, "test_accuracy", 0.9, budget_s=2.5) is None  # too late
    assert quality.resolution_s(ACC, "test_accuracy", 0.9) == 1.0
    assert quality.resolution_s(ACC, "test_accuracy", 0.5) == 1.0  # from the start
    # lower is better for bits per byte
    assert quality.time_to_target(BPB, "bits_per_byte", 4.0) == 15.0
    assert quality.time_to_target(BPB, "bits_per_byte", 4.2) == 10.0
    assert quality.time_to_target(BPB, "bits_per_byte", 3.0) is None


def test_nan_never_reaches_a_target():
    diverged = curve([1.0, 2.0], [math.nan, math.nan], "bits_per_byte")
    assert quality.time_to_target(diverged, "bits_per_byte", 7.0) is None
    assert not quality.METRICS["bits_per_byte"].better(math.nan, 5.0)


def test_quality_at_budget_is_the_last_evaluation_inside_it():
    assert quality.quality_at_budget(ACC, "test_accuracy", 3.5) == 0.91
    assert quality.quality_at_budget(ACC, "test_accuracy", 4.0) == 0.89  # at the budget counts
    assert quality.quality_at_budget(ACC, "test_accuracy", 0) == 0.89  # no budget: the last
    assert quality.quality_at_budget(ACC, "test_accuracy", 0.5) is None


def test_stop_reason():
    assert quality.stop_reason([], "test_accuracy", 0.9, 10, True) is None
    assert quality.stop_reason(ACC[:3], "test_accuracy", 0.9, 10, True) == "target"
    assert quality.stop_reason(ACC[:3], "test_accuracy", 0.9, 10, False) is None
    assert quality.stop_reason(ACC[:2], "test_accuracy", 0.9, 2.0, True) == "budget"
    assert quality.stop_reason(ACC[:2], "test_accuracy", 0.9, 0, True) is None  # no budget
    assert quality.stop_reason(BPB, "bits_per_byte", 4.0, 0, True) == "target"


@pytest.mark.parametrize("metric,target", [("test_accuracy", 0), ("test_accuracy", 1.5),
                                           ("test_accuracy", math.nan), ("bits_per_byte", 9),
                                           ("bits_per_byte", -1), ("bits_per_byte", True)])
def test_a_target_outside_the_metrics_range_is_refused(metric, target):
    with pytest.raises(ValueError, match=rf"--target for {metric} must be a number in"):
        quality.check_target(metric, target)


@pytest.mark.parametrize("budget", [-1, math.inf, "10"])
def test_a_bad_budget_is_refused(budget):
    with pytest.raises(ValueError, match=r"--budget-s must be a number of seconds >= 0"):
        quality.check_budget(budget)


def test_compare_settings_refuse_bad_input_clearly():
    with pytest.raises(ValueError, match=r"--workload must be one of mnist, lm, got 'imagenet'"):
        CompareSettings(workload="imagenet").validate()
    with pytest.raises(ValueError, match=r"--budget-s must be .* got -5"):
        CompareSettings(budget_s=-5).validate()
    with pytest.raises(ValueError, match=r"--target for bits_per_byte must be a number in "
                                         r"\(0, 8\], got 12"):
        CompareSettings(workload="lm", target=12).validate()
    with pytest.raises(ValueError, match=r"--target for test_accuracy .* got 95"):
        CompareSettings(target=95).validate()
    with pytest.raises(ValueError, match=r"--model mlp does not fit workload lm"):
        CompareSettings(workload="lm", train={"model": "mlp"}).validate()
    with pytest.raises(ValueError, match=r"training settings compare cannot take: \['resume'\]"):
        CompareSettings(train={"resume": "/x"}).validate()
    with pytest.raises(ValueError, match=r"--density must be"):
        CompareSettings(train={"density": 2.0}).validate()
    with pytest.raises(ValueError, match=r"unknown algorithm 'fast'"):
        CompareSettings(algorithms=["fast"]).validate()
    with pytest.raises(ValueError, match=r"--workload must be one of"):
        workloads.parse_workloads("mnist,cifar")


def test_run_config_comes_from_the_workload_the_overrides_and_the_run():
    s = CompareSettings(workload="lm", train={"density": 0.05, "momentum_correction": True},
                        budget_s=12).validate()
    hitopk, ddp = s.run_config("hitopk"), s.run_config("ddp", lr=0.3, seed=7)
    lm = workloads.WORKLOADS["lm"]
    assert (hitopk.model, hitopk.batch_size, hitopk.epochs, hitopk.lr) == \
        (lm.model, lm.batch_size, lm.epochs, lm.lr)
    assert hitopk.density == 0.05 and hitopk.momentum_correction and hitopk.stop_at_target
    assert hitopk.target_bits_per_byte == lm.target and hitopk.target_accuracy is None
    assert hitopk.budget_s == 12 and hitopk.eval_every == lm.eval_every
    # momentum correction is a sparse-method option: dense runs leave it off
    assert not ddp.momentum_correction and ddp.lr == 0.3 and ddp.seed == 7
    assert s.common()["powersgd_start_iter"] >= 1


def _run(algorithm, t, iter_ms, compute_ms, stop="target"):
    return {"algorithm": algorithm, "inter_node_bandwidth": "200mbit", "status": "ok",
            "setting": {"lr": 0.05}, "time_to_target_s": t, "quality_at_budget": 0.93,
            "samples_per_s": 128000 / iter_ms, "iter_ms": iter_ms,
            "compute_ms_per_iter": compute_ms, "inter_node_mb_per_iter": 1.0,
            "stop_reason": stop, "steps": 40,
            "step_split_ms": {"compute": compute_ms, "sync": iter_ms - compute_ms},
            "curve": [{"train_time_s": 1.0, "test_accuracy": 0.5},
                      {"train_time_s": t or 60.0, "test_accuracy": 0.93 if t else 0.8}]}


def test_report_uses_one_compute_base_and_marks_misses(tmp_path):
    runs = report.annotate([_run("ddp", 40.0, 900, 100), _run("hitopk", 10.0, 250, 60),
                            _run("powersgd", None, 300, 300, stop="budget")])
    assert [r["compute_base_ms"] for r in runs] == [100, 100, 100]  # the median of the probes
    assert runs[1]["time_vs_ddp"] == pytest.approx(0.25)
    assert runs[1]["comm_share"] == pytest.approx(150 / 250)
    assert runs[2]["time_vs_ddp"] is None
    setting = {**CompareSettings().common(), "rates": ["200mbit"],
               "algorithms": ["ddp", "hitopk", "powersgd"]}
    results = {"setting": setting, "runs": runs, "tuning": []}
    text = "\n".join(t for _, t in report.tables(results))
    assert "s to test_accuracy >= 0.92" in text and "missed (60 s)" in text
    figures = report.write_all(results, tmp_path)
    assert figures[0] == "time_to_target.png"
    for name in figures:
        assert (tmp_path / name).stat().st_size > 0
    md = (tmp_path / "report.md").read_text()
    assert "start_powerSGD_iter" in md and "ranged 60.0-300.0 ms" in md


def test_results_are_written_readable_by_everyone(tmp_path):
    write_json(tmp_path / "results.json", {"a": 1})
    mode = stat.S_IMODE((tmp_path / "results.json").stat().st_mode)
    assert mode & 0o044 == 0o044 and json.loads((tmp_path / "results.json").read_text())


def test_compare_help_shows_a_default_for_every_option():
    from thinwire.cli import build_parser

    parser = build_parser()
    compare_parser = next(a for a in parser._subparsers._group_actions
                          if hasattr(a, "choices") and a.choices and "compare" in a.choices
                          ).choices["compare"]
    text = compare_parser.format_help()
    assert "--budget-s" in text and "--workload" in text and "--tune" in text
    for action in compare_parser._actions:
        if action.dest in ("help", "out"):  # --out is required: no default to show
            continue
        help_text = compare_parser._get_formatter()._expand_help(action) if action.help else ""
        assert "default" in help_text, (action.option_strings, help_text)


def test_tuning_gives_every_method_the_same_grid_on_another_seed(monkeypatch, tmp_path):
    from thinwire.train import compare as compare_mod

    outcomes = {0.025: (None, 0.90), 0.05: (30.0, 0.93), 0.1: (20.0, 0.94)}
    seen = []

    def fake_run(settings, cfg, rate, out, bar=None, tag=""):
        seen.append((cfg.algorithm, cfg.lr, cfg.seed, cfg.budget_s, tag))
        t, q = outcomes[cfg.lr]
        return {"status": "ok", "time_to_target_s": t, "quality_at_budget": q}

    monkeypatch.setattr(compare_mod, "run_one", fake_run)
    s = CompareSettings(algorithms=["ddp", "hitopk"], tune=True, lr_grid=(0.5, 1.0, 2.0),
                        train={"seed": 3}).validate()
    chosen = [compare_mod.tune_lr(s, a, "200mbit", tmp_path) for a in s.algorithms]
    assert [c["chosen_lr"] for c in chosen] == [0.1, 0.1]  # the soonest to the target
    assert {x[2] for x in seen} == {4} and {x[3] for x in seen} == {s.resolved_budget()}
    assert sorted(x[1] for x in seen if x[0] == "hitopk") == [0.025, 0.05, 0.1]
    # nobody reached the target: the best quality at the budget decides
    outcomes.update({0.05: (None, 0.91), 0.1: (None, 0.85)})
    assert compare_mod.tune_lr(s, "ddp", "200mbit", tmp_path)["chosen_lr"] == 0.05


def test_train_config_checks_the_race_options():
    from thinwire.train.config import TrainConfig

    with pytest.raises(ValueError, match=r"--target-bits-per-byte needs a language model"):
        TrainConfig(model="mlp", target_bits_per_byte=4.0).validate()
    with pytest.raises(ValueError, match=r"--stop-at-target needs --target-accuracy or"):
        TrainConfig(model="mlp", stop_at_target=True).validate()
    with pytest.raises(ValueError, match=r"--budget-s must be .* got -1"):
        TrainConfig(model="mlp", budget_s=-1).validate()
    TrainConfig(model="transformer", target_bits_per_byte=4.0, stop_at_target=True,
                budget_s=30).validate()


def test_config_file_becomes_the_defaults_and_the_command_line_wins(tmp_path):
    import argparse

    from thinwire.train.config import add_arguments, add_config_file, from_args

    path = tmp_path / "run.json"
    path.write_text(json.dumps({"model": "lenet", "lr": 0.2, "budget_s": 5.0}))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--config", str(path), "--lr", "0.3"]
    add_config_file(parser, argv)
    cfg = from_args(parser.parse_args(argv))
    assert (cfg.model, cfg.lr, cfg.budget_s) == ("lenet", 0.3, 5.0)
    path.write_text(json.dumps({"modle": "lenet"}))
    with pytest.raises(ValueError, match=r"unknown keys: \['modle'\]"):
        add_config_file(argparse.ArgumentParser(), ["--config", str(path)])


def test_a_rate_sweep_plots_time_to_target_against_the_rate(tmp_path):
    runs = []
    for rate, slow in (("50mbit", 4.0), ("1gbit", 1.0)):
        for run in (_run("ddp", None if slow > 1 else 20.0, 900 * slow, 100, "budget"),
                    _run("hitopk", 30.0, 600, 100)):
            runs.append({**run, "inter_node_bandwidth": rate})
    setting = {**CompareSettings().common(), "rates": ["50mbit", "1gbit"],
               "algorithms": ["ddp", "hitopk"]}
    figures = report.write_all({"setting": setting, "runs": report.annotate(runs),
                                "tuning": []}, tmp_path)
    assert "time_to_target_vs_rate.png" in figures
    assert (tmp_path / "time_to_target_vs_rate.png").stat().st_size > 0
    assert "inter-node 50mbit" in (tmp_path / "report.md").read_text()


def test_the_workloads_sparse_defaults_reach_the_sparse_runs_and_the_user_wins():
    mnist = workloads.WORKLOADS["mnist"]
    s = CompareSettings(workload="mnist").validate()
    for key, value in mnist.sparse.items():
        assert getattr(s.run_config("hitopk"), key) == value
    assert s.run_config("ddp").density_warmup_steps == 0  # a sparse-only option stays off
    mine = CompareSettings(workload="mnist", train={"density": 0.02}).validate()
    assert mine.run_config("hitopk").density == 0.02


def test_a_miss_between_two_rates_breaks_the_line(tmp_path, monkeypatch):
    """Three rates, the middle one missed: the method's line must not join 50 and 1000 Mbit/s
    as if it had a time at 200 (NaN there), and the miss is marked on the budget line."""
    from thinwire.train import report_plots

    plt = report_plots._plt()
    figures = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    runs = [{**_run("powersgd", t, 300, 100, "target" if t else "budget"),
             "inter_node_bandwidth": rate}
            for rate, t in (("50mbit", 20.0), ("200mbit", None), ("1gbit", 22.0))]
    setting = {**CompareSettings().common(), "rates": ["50mbit", "200mbit", "1gbit"],
               "algorithms": ["powersgd"]}
    report_plots.time_to_target_vs_rate({"setting": setting, "runs": runs}, tmp_path)
    line = next(l for l in figures[-1].axes[0].lines if l.get_label() == "powersgd")
    ys = list(line.get_ydata())
    assert list(line.get_xdata()) == [50.0, 200.0, 1000.0]
    assert ys[0] == 20.0 and math.isnan(ys[1]) and ys[2] == 22.0


def test_tuning_diloco_varies_its_outer_learning_rate_and_keeps_the_inner_one(monkeypatch,
                                                                               tmp_path):
    """DiLoCo's inner steps are DDP's at the workload's rate; its own setting is the outer
    learning rate (the LM trained at 0.3, not at the default 0.7): --tune varies that."""
    from thinwire.train import compare as compare_mod

    seen = []

    def fake_run(settings, cfg, rate, out, bar=None, tag=""):
        seen.append((cfg.algorithm, cfg.lr, cfg.outer_lr, tag))
        return {"status": "ok", "time_to_target_s": 10.0 + abs(cfg.outer_lr - 0.35),
                "quality_at_budget": 0.95}

    monkeypatch.setattr(compare_mod, "run_one", fake_run)
    s = CompareSettings(algorithms=["diloco"], tune=True, lr_grid=(0.5, 1.0, 2.0),
                        train={"sync_every": 4}).validate()
    tuned = compare_mod.tune_lr(s, "diloco", "200mbit", tmp_path)
    assert tuned["setting"] == "outer_lr" and tuned["chosen_lr"] == pytest.approx(0.35)
    assert [x[2] for x in seen] == pytest.approx([0.35, 0.7, 1.4])
    assert {x[1] for x in seen} == {s.base_config().lr}  # the inner rate stays the workload's
    assert all(x[3].startswith("_tune_outer_lr") for x in seen)
    assert compare_mod.tuned_setting("hitopk") == "lr"


def test_a_tuning_grid_that_takes_a_setting_out_of_range_is_refused_before_any_run():
    with pytest.raises(ValueError, match=r"--tune tries outer_lr x 4 for diloco"):
        CompareSettings(algorithms=["diloco"], tune=True, lr_grid=(1.0, 4.0),
                        train={"sync_every": 4, "outer_lr": 3.0}).validate()


def test_the_races_after_tuning_run_at_the_chosen_outer_learning_rate(monkeypatch, tmp_path):
    from thinwire.train import compare as compare_mod

    seen = []

    def fake_run(settings, cfg, rate, out, bar=None, tag=""):
        seen.append((tag, cfg.lr, cfg.outer_lr))
        return {"algorithm": cfg.algorithm, "inter_node_bandwidth": rate, "status": "ok",
                "time_to_target_s": 10.0 + abs(cfg.outer_lr - 1.4), "quality_at_budget": 0.95}

    monkeypatch.setattr(compare_mod, "run_one", fake_run)
    monkeypatch.setattr(compare_mod.report, "write_all", lambda results, out: None)
    monkeypatch.setattr(compare_mod.report, "annotate", lambda runs: runs)
    s = CompareSettings(algorithms=["diloco"], tune=True, lr_grid=(0.5, 1.0, 2.0),
                        rates=["200mbit", "1gbit"], shaping=False,
                        train={"sync_every": 4})
    results = compare_mod.compare(s, tmp_path, progress=False)
    races = [x for x in seen if x[0] == ""]
    assert [x[2] for x in races] == pytest.approx([1.4, 1.4])
    assert {x[1] for x in seen} == {s.base_config().lr}
    assert results["tuning"][0]["setting"] == "outer_lr"


def test_a_finished_diloco_run_is_reused_only_at_its_own_outer_learning_rate(monkeypatch,
                                                                             tmp_path):
    """A run's recorded setting names the outer learning rate it ran at (--tune may have
    chosen it): compare skips it on a rerun at that rate only."""
    import dataclasses
    import json

    from thinwire.train import compare as compare_mod

    s = CompareSettings(algorithms=["diloco"], shaping=False, train={"sync_every": 4})
    tuned = dataclasses.replace(s.run_config("diloco"), outer_lr=0.35)
    key = compare_mod.run_key("diloco", "200mbit", s)
    setting = {**s.common(), "lr": tuned.lr, "seed": tuned.seed,
               "inter_node_bandwidth": "200mbit", "outer_lr": 0.35}
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / f"{key}.json").write_text(json.dumps(
        {"setting": setting, "status": "ok", "time_to_target_s": 9.0}))

    def launched(*args, **kwargs):
        raise RuntimeError("launched")
    monkeypatch.setattr(compare_mod, "cluster_run", launched)
    assert compare_mod.run_one(s, tuned, "200mbit", tmp_path)["time_to_target_s"] == 9.0
    with pytest.raises(RuntimeError, match="launched"):  # the default 0.7: not that run
        compare_mod.run_one(s, s.run_config("diloco"), "200mbit", tmp_path)
