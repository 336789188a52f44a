"""`thinwire bench sync` end to end on loopback (no root needed): every algorithm and policy
gets a row from the same run, with the ratios the table prints."""

from __future__ import annotations

import pytest

from thinwire.bench import sync as bench_sync
from thinwire.cluster import ClusterSpec


def test_bench_sync_times_both_nonfinite_policies_in_one_run():
    spec = ClusterSpec(nodes=2, ranks_per_node=1, shaping=False, inter_node_bandwidth=None)
    result = bench_sync.run(spec, size=40_000, bucket_mb=0.04, density=0.05,
                            algorithms=["allreduce", "oktopk"], repeats=2, timeout_s=300,
                            algorithm_options={"oktopk": {"tau": 2}},
                            nonfinite=("raise", "skip"))
    rows = {(r["algorithm"], r["nonfinite"]): r for r in result["rows"]}
    assert set(rows) == {(a, p) for a in ("allreduce", "oktopk") for p in ("raise", "skip")}
    for (algorithm, policy), row in rows.items():
        assert row["buckets"] == 4 and len(row["times_s"]) == 2 and row["median_s"] > 0
        assert row["vs_allreduce"] == pytest.approx(
            row["median_s"] / rows["allreduce", policy]["median_s"])
        assert row["vs_skip"] == pytest.approx(
            row["median_s"] / rows[algorithm, "skip"]["median_s"])
    assert result["setting"]["algorithm_options"] == {"oktopk": {"tau": 2}}
    assert result["setting"]["nonfinite"] == ["raise", "skip"]


def test_bench_sync_refuses_a_bad_policy_before_building_anything():
    spec = ClusterSpec(nodes=2, ranks_per_node=1, shaping=False, inter_node_bandwidth=None)
    with pytest.raises(ValueError, match=r"nonfinite must list distinct policies of raise, "
                                         r"skip, got \['ignore'\]"):
        bench_sync.run(spec, nonfinite=("ignore",))


def test_the_wire_setting_reaches_the_ranks():
    """--wire bf16 halves what allreduce sends (2 bytes an element instead of 4)."""
    spec = ClusterSpec(nodes=2, ranks_per_node=1, shaping=False, inter_node_bandwidth=None)
    sent = {}
    for wire in ("none", "bf16"):
        result = bench_sync.run(spec, size=40_000, bucket_mb=0.04, algorithms=["allreduce"],
                                repeats=1, timeout_s=300, wire=wire)
        sent[wire] = result["rows"][0]["bytes_inter"]
        assert result["setting"]["wire"] == wire
    assert sent["bf16"] * 2 == sent["none"] > 0


def test_bench_sync_refuses_a_bad_setting_before_building_anything():
    spec = ClusterSpec(nodes=2, ranks_per_node=1, shaping=False, inter_node_bandwidth=None)
    with pytest.raises(ValueError, match=r"--sparse-wire must be one of fp32, fp16, bf16"):
        bench_sync.run(spec, sparse_wire="fp8")
