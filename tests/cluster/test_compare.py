"""End to end: `thinwire compare` with a tiny configuration (2 algorithms, a few steps), shaped
when this machine can (root, ip, tc), on loopback otherwise; then an interrupted compare is
re-run and only the missing run is launched again. The language-model workload too, tiny."""

import json
import stat

import pytest

from thinwire.cluster import missing_requirements
from thinwire.train import compare as compare_mod
from thinwire.train.compare import CompareSettings, compare

SHAPED = not missing_requirements()


def test_compare_end_to_end_and_resume(tmp_path, cluster_leaks, monkeypatch):
    settings = CompareSettings(algorithms=["ddp", "hitopk"], nodes=2, ranks_per_node=1,
                               rates=["200mbit"], shaping=SHAPED, target=0.2, budget_s=120,
                               stop_at_target=False, eval_every=3, timeout_s=240,
                               train={"model": "mlp", "epochs": 1, "max_iters": 6,
                                      "batch_size": 16})
    results = compare(settings, tmp_path, progress=False)

    assert results["setting"]["model"] == "mlp" and results["setting"]["shaping"] == SHAPED
    runs = {r["algorithm"]: r for r in results["runs"]}
    assert set(runs) == {"ddp", "hitopk"}
    for run in runs.values():
        assert run["status"] == "ok", run
        for key in ("samples_per_s", "sync_ms_per_iter", "inter_node_mb_per_iter",
                    "test_accuracy", "time_to_target_s", "quality_at_budget", "step_split_ms",
                    "time_to_target_resolution_s"):
            assert key in run
        assert run["samples_per_s"] > 0 and 0 < run["test_accuracy"] <= 1
        assert run["steps"] == 6 and [p["step"] for p in run["curve"]] == [3, 6]
        assert run["stop_reason"] == "end" and run["quality_at_budget"] == run["test_accuracy"]
        assert run["setting"]["lr"] == 0.05 and run["setting"]["workload"] == "mnist"
        assert run["step_split_ms"]["compute"] > 0
        if SHAPED:  # was the wire or the host the limit? (issue 31, item 6)
            assert run["fidelity"]["verdict"] in ("link", "host", "neither"), run["fidelity"]
            assert not list((tmp_path / "runs").glob(".*.stats.json"))
    assert set(runs["hitopk"]["step_split_ms"]) == {"compute", "selection", "intra_node",
                                                    "inter_node", "idle"}
    assert set(runs["ddp"]["step_split_ms"]) == {"compute", "sync"}
    # hitopk sends a few percent of ddp's bytes between the nodes.
    assert runs["hitopk"]["inter_node_mb_per_iter"] < 0.5 * runs["ddp"]["inter_node_mb_per_iter"]
    assert runs["ddp"]["speedup_vs_ddp"] == pytest.approx(1.0)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert [r["algorithm"] for r in on_disk["runs"]] == ["ddp", "hitopk"]
    assert stat.S_IMODE((tmp_path / "results.json").stat().st_mode) & 0o044 == 0o044
    for name in ("report.md", "time_to_target.png", "quality_vs_time.png", "bytes_on_wire.png",
                 "step_split.png", "throughput.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "hitopk" in (tmp_path / "report.md").read_text()

    # Interrupted after ddp: only hitopk runs again; ddp's result is reused as it was.
    (tmp_path / "runs" / "hitopk@200mbit_2x1.json").unlink()
    launched = []
    real_run = compare_mod.cluster_run

    def counting_run(spec, command, **kwargs):
        config = json.loads(open(command[command.index("--config") + 1]).read())
        launched.append(config["algorithm"])
        return real_run(spec, command, **kwargs)

    monkeypatch.setattr(compare_mod, "cluster_run", counting_run)
    again = compare(settings, tmp_path, progress=False)
    assert launched == ["hitopk"]
    assert again["runs"][0]["samples_per_s"] == runs["ddp"]["samples_per_s"]
    assert again["runs"][1]["status"] == "ok"


def test_compare_lm_workload_stops_at_its_budget(tmp_path, cluster_leaks):
    """The byte-level transformer, judged by held-out bits per byte; a budget shorter than two
    steps ends the run at its first evaluation."""
    settings = CompareSettings(workload="lm", algorithms=["powersgd"], nodes=2,
                               ranks_per_node=1, rates=["200mbit"], shaping=SHAPED,
                               target=3.5, budget_s=0.001, eval_every=2, timeout_s=300,
                               train={"max_iters": 8, "batch_size": 2})
    results = compare(settings, tmp_path, progress=False)
    run = results["runs"][0]
    assert run["status"] == "ok", run
    assert run["metric"] == "bits_per_byte" and results["setting"]["metric"] == "bits_per_byte"
    assert run["stop_reason"] == "budget" and run["steps"] == 2 and len(run["curve"]) == 1
    assert 0 < run["curve"][0]["bits_per_byte"] < 100  # nats / ln 2, finite
    assert run["time_to_target_s"] is None  # a miss
    assert run["quality_at_budget"] is None  # the only evaluation came after the budget
    assert "missed (0.001 s)" in (tmp_path / "report.md").read_text()


def test_compare_races_diloco_and_torchfts(tmp_path, cluster_leaks):
    """DiLoCo with its options (hitopk outer step, two fragments, overlap) and torchft's DiLoCo
    (which compare runs with its own recipe: one fragment, dense, no overlap) in one race;
    2 nodes x 2 ranks, so DDP inside a node and the outer step across nodes both run."""
    from thinwire.local_sgd.torchft_peer import available

    algorithms = ["diloco"] + (["torchft-diloco"] if available() else [])
    settings = CompareSettings(algorithms=algorithms, nodes=2, ranks_per_node=2,
                               rates=["200mbit"], shaping=SHAPED, target=0.2, budget_s=120,
                               stop_at_target=False, eval_every=4, timeout_s=300,
                               train={"model": "mlp", "epochs": 1, "max_iters": 8,
                                      "batch_size": 16, "sync_every": 4,
                                      "outer_algorithm": "hitopk", "density": 0.1,
                                      "fragments": 2, "overlap": True})
    results = compare(settings, tmp_path, progress=False)
    runs = {r["algorithm"]: r for r in results["runs"]}
    assert list(runs) == algorithms
    for run in runs.values():
        assert run["status"] == "ok", run
        assert run["steps"] == 8 and [p["step"] for p in run["curve"]] == [4, 8]
        assert 0 < run["test_accuracy"] <= 1 and run["samples_per_s"] > 0
    assert results["setting"]["sync_every"] == 4 and results["setting"]["fragments"] == 2
    # thinwire's DiLoCo counts its own outer exchange (hitopk: selection and both link classes)
    assert set(runs["diloco"]["step_split_ms"]) == {"compute", "selection", "intra_node",
                                                    "inter_node", "idle"}
    assert runs["diloco"]["inter_node_mb_per_iter"] > 0
    if "torchft-diloco" in runs:
        assert set(runs["torchft-diloco"]["step_split_ms"]) == {"compute", "sync"}
    assert "diloco" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("train,message", [
    ({}, "--sync-every must be an integer >= 1 with --algorithm diloco, got 0"),
    ({"sync_every": 4, "outer_algorithm": "ring"}, "--outer-algorithm must be one of"),
])
def test_compare_names_a_bad_diloco_setting_before_any_run(tmp_path, train, message):
    settings = CompareSettings(algorithms=["diloco"], nodes=2, ranks_per_node=1, shaping=False,
                               train={"model": "mlp", **train})
    with pytest.raises(ValueError) as info:
        compare(settings, tmp_path, progress=False)
    assert message in str(info.value)
    assert not (tmp_path / "runs").exists()


def test_a_stalled_run_is_reported_failed_with_its_stacks_and_the_race_goes_on(
        tmp_path, cluster_leaks, monkeypatch):
    """powersgd's run is declared stalled as soon as it is training (when StallWatch says so is
    tested in test_compare_stall.py); compare stops it, reports it failed with the reason, its
    log holds the ranks' thread stacks, and ddp's run after it still runs."""
    real_watch = compare_mod.StallWatch

    def watch(metrics, stall_s):
        if "powersgd" not in metrics.name:
            return real_watch(metrics, stall_s)
        return lambda: ("stalled: as the test says" if metrics.is_file()
                        and metrics.stat().st_size > 0 else None)

    monkeypatch.setattr(compare_mod, "StallWatch", watch)
    settings = CompareSettings(algorithms=["powersgd", "ddp"], nodes=2, ranks_per_node=1,
                               rates=["none"], shaping=False, target=0.2, budget_s=120,
                               stop_at_target=False, eval_every=0, timeout_s=240,
                               train={"model": "mlp", "epochs": 1, "max_iters": 40,
                                      "batch_size": 16})
    results = compare(settings, tmp_path, progress=False)
    runs = {r["algorithm"]: r for r in results["runs"]}
    assert runs["powersgd"]["status"] == "failed (stalled: as the test says)", runs["powersgd"]
    assert runs["ddp"]["status"] == "ok", runs["ddp"]
    log = open(runs["powersgd"]["log"]).read()
    assert log.count("most recent call first") >= 2, log[-3000:]  # each rank's stacks
    assert "stalled: as the test says" in (tmp_path / "report.md").read_text()
