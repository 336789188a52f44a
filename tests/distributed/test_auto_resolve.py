"""--algorithm auto on 2 gloo ranks (2 nodes x 1, loopback): the node leaders probe the link,
rank 0 plans, and every rank trains with the same choice; a plan that fails on rank 0 ends
every rank with its error."""

import sys

import pytest
from pathlib import Path

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from plan_helpers import STEPS, _results, _truth_time  # noqa: E402

import auto_workers  # noqa: E402


def test_every_rank_trains_with_rank_0s_choice(tmp_path):
    path = _results(tmp_path, ranks_per_node=1)
    # each rank's compute-only step: their mean, 8 ms, is 10x faster than the calibration's
    results = run_ranks(auto_workers.resolve, 2, str(path), 1, compute_ms=[6.0, 10.0])
    assert all("error" not in r for r in results), results
    assert len({(r["algorithm"], r["choice"], r["planned_at_bps"]) for r in results}) == 1
    assert all(r["compute"]["probed_ms"] == 8.0 and r["compute"]["scale"] == pytest.approx(0.1)
               for r in results)
    # outside the calibration's spread, so taken again: the same every time
    assert results[0]["compute"]["tries_ms"] == [8.0, 8.0, 8.0]
    probe = results[0]["probe"]  # every try of the link probe, with its verdict
    assert 1 <= len(probe["tries"]) <= 3 and probe["bound_by"] in ("link", "host", "neither")
    first = results[0]
    assert first["plan_from"] == ""  # the resolved run is an ordinary one
    assert first["goodput"] > 1e6  # loopback: far faster than any shaped link
    # the fastest at the probed rate with compute ~free: the fewest bytes
    fastest = min(STEPS, key=lambda a: _truth_time(a, first["planned_at_bps"], tmp_path,
                                                   compute_s=0.008))
    assert first["algorithm"] == fastest


def test_ranks_per_node_left_unset_is_the_launchers(tmp_path):
    # torchrun ... -m thinwire.train --algorithm auto: no --ranks-per-node; auto divided the
    # world by None (a TypeError on every rank)
    path = _results(tmp_path, ranks_per_node=1)
    results = run_ranks(auto_workers.resolve, 2, str(path), 1, launcher_ranks_per_node=1)
    assert all("error" not in r for r in results), results
    assert [r["ranks_per_node"] for r in results] == [1, 1]
    assert len({(r["algorithm"], r["choice"]) for r in results}) == 1


def test_one_compute_probe_outside_the_calibrations_spread_is_taken_again(tmp_path):
    path = _results(tmp_path, ranks_per_node=1)  # every calibration run computes 80 ms a step
    # a noisy first probe (mean over ranks 200 ms, past 80 x 1.5), then two that read 80, 90
    results = run_ranks(auto_workers.resolve, 2, str(path), 1,
                        compute_ms=[[190.0, 70.0, 100.0, 999.0], [210.0, 90.0, 80.0, 999.0]])
    assert all("error" not in r for r in results), results
    compute = results[0]["compute"]
    assert compute["tries_ms"] == [200.0, 80.0, 90.0]  # three in all, never the fourth
    assert compute["probed_ms"] == 90.0 and compute["scale"] == 1.0
    # a first probe inside the spread is the probe
    inside = run_ranks(auto_workers.resolve, 2, str(path), 1,
                       compute_ms=[[75.0, 999.0], [85.0, 999.0]])[0]["compute"]
    assert inside["tries_ms"] == [80.0] and inside["scale"] == 1.0


def test_a_failed_plan_ends_every_rank_with_its_error(tmp_path):
    path = _results(tmp_path, ranks_per_node=1)
    results = run_ranks(auto_workers.resolve, 2, str(path), 1, batch_size=64)
    messages = {r.get("error") for r in results}
    assert len(messages) == 1 and "batch_size 32 there, 64 here" in messages.pop()


def test_the_training_loop_probes_its_compute_before_choosing(tmp_path):
    path = _results(tmp_path, ranks_per_node=1)
    record = run_ranks(auto_workers.train_auto, 2, str(path))[0]
    compute = record["compute"]
    assert compute["probed_ms"] > 0 and compute["calibration_ms"] == pytest.approx(80.0)
    # the plan's compute is the fit's, which meets the runs' 80 ms to the fit's precision
    assert compute["planned_ms"] == pytest.approx(80.0 * compute["scale"], rel=1e-4)


def test_the_intra_node_probe_gives_every_rank_the_slowest_nodes_numbers():
    """2 nodes x 2 gloo ranks on loopback: each node's pair all-reduces 1 and 8 MiB; every rank
    holds the same goodput (far above any shaped link) and fixed cost."""
    results = run_ranks(auto_workers.probe_intra, 4, 2)
    assert len({(r["goodput_Bps"], r["fixed_s"], r["bound_by"]) for r in results}) == 1, results
    probe = results[0]
    assert probe["goodput_Bps"] > 1e7 and probe["fixed_s"] >= 0
    assert probe["large_s"] > probe["small_s"] > 0 and probe["bound_by"] in ("link", "host")
    # one rank a node: nothing inside a node to measure
    assert run_ranks(auto_workers.probe_intra, 2, 1)[0]["goodput_Bps"] is None


def test_auto_records_the_intra_node_probe(tmp_path):
    path = _results(tmp_path, ranks_per_node=2)
    results = run_ranks(auto_workers.resolve, 4, str(path), 2)
    assert all("error" not in r for r in results), results
    intra = results[0]["probe"]["intra_node"]
    assert intra["ranks_per_node"] == 2 and intra["goodput_Bps"] > 1e7
