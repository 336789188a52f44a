"""End to end: `thinwire compare` with a tiny configuration (2 algorithms, a few steps), shaped
when this machine can (root, ip, tc), on loopback otherwise; then an interrupted compare is
re-run and only the missing run is launched again."""

import json

import pytest

from thinwire.cluster import missing_requirements
from thinwire.train import compare as compare_mod
from thinwire.train.compare import CompareSettings, compare

SHAPED = not missing_requirements()


def test_compare_end_to_end_and_resume(tmp_path, cluster_leaks, monkeypatch):
    settings = CompareSettings(algorithms=["ddp", "hitopk"], model="mlp", epochs=1, max_iters=6,
                               batch_size=16, nodes=2, ranks_per_node=1, rates=["200mbit"],
                               shaping=SHAPED, target_accuracy=0.2, evals_per_epoch=2,
                               timeout_s=240)
    results = compare(settings, tmp_path, progress=False)

    assert results["setting"]["model"] == "mlp" and results["setting"]["shaping"] == SHAPED
    runs = {r["algorithm"]: r for r in results["runs"]}
    assert set(runs) == {"ddp", "hitopk"}
    for run in runs.values():
        assert run["status"] == "ok", run
        for key in ("samples_per_s", "sync_ms_per_iter", "inter_node_mb_per_iter",
                    "test_accuracy", "time_to_target_s"):
            assert key in run
        assert run["samples_per_s"] > 0 and 0 < run["test_accuracy"] <= 1
        assert run["steps"] == 6 and run["curve"]
    # hitopk sends a few percent of ddp's bytes between the nodes.
    assert runs["hitopk"]["inter_node_mb_per_iter"] < 0.5 * runs["ddp"]["inter_node_mb_per_iter"]
    assert runs["ddp"]["speedup_vs_ddp"] == pytest.approx(1.0)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert [r["algorithm"] for r in on_disk["runs"]] == ["ddp", "hitopk"]
    for name in ("report.md", "accuracy_vs_time.png", "throughput.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "hitopk" in (tmp_path / "report.md").read_text()

    # Interrupted after ddp: only hitopk runs again; ddp's result is reused as it was.
    (tmp_path / "runs" / "hitopk@200mbit_2x1.json").unlink()
    launched = []
    real_run = compare_mod.cluster_run

    def counting_run(spec, command, **kwargs):
        launched.append(command[command.index("--algorithm") + 1])
        return real_run(spec, command, **kwargs)

    monkeypatch.setattr(compare_mod, "cluster_run", counting_run)
    again = compare(settings, tmp_path, progress=False)
    assert launched == ["hitopk"]
    assert again["runs"][0]["samples_per_s"] == runs["ddp"]["samples_per_s"]
    assert again["runs"][1]["status"] == "ok"
