"""`thinwire bench dlcp` end to end on loopback (no root): dlcp, a variant with other options
and the gloo baseline in one run, every row with its steps and dlcp's counters."""

from __future__ import annotations

import pytest

from thinwire.bench import dlcp as bench_dlcp
from thinwire.cluster import ClusterSpec


@pytest.mark.slow
def test_bench_dlcp_runs_variants_in_the_same_run():
    spec = ClusterSpec(nodes=2, ranks_per_node=1, shaping=False, inter_node_bandwidth=None)
    result = bench_dlcp.run(spec, size=20_000, density=0.02, steps=3, epsilon=0.02, bulk=False,
                            timeout_s=300, variants=("datagram_bytes=1024",))
    rows = {row["algorithm"]: row for row in result["rows"]}
    assert list(rows) == ["dlcp", "dlcp:datagram_bytes=1024", "topk_allgather"]
    assert all(len(row["times_s"]) == 3 for row in rows.values())
    # 400 entries of 8 bytes to the one peer: 178 a datagram of 1472 bytes -> 3 datagrams,
    # 122 a datagram of 1024 bytes -> 4
    assert rows["dlcp"]["dlcp_sent"] == 3 * 3 and rows["dlcp:datagram_bytes=1024"][
        "dlcp_sent"] == 3 * 4
    assert rows["topk_allgather"]["p99_vs_gloo"] == 1.0


def test_a_bad_variant_fails_before_any_cluster_is_built():
    spec = ClusterSpec(nodes=2, ranks_per_node=1, shaping=False, inter_node_bandwidth=None)
    with pytest.raises(ValueError, match=r"'pacing' must be one of sleep, socket"):
        bench_dlcp.run(spec, 1000, 0.02, 1, 0.02, False, variants=("pacing=fast",))
    with pytest.raises(ValueError, match=r"options must be KEY=VALUE, got 'fast'"):
        bench_dlcp.run(spec, 1000, 0.02, 1, 0.02, False, variants=("fast",))
