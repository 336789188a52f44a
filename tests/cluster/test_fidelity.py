"""Was a run measuring the wire or the host (issue 31, item 6)? The verdict from synthetic
accounting series, and from a real shaped run that drives its link (root)."""

from __future__ import annotations

import json
import textwrap

import pytest

from thinwire.cluster import ClusterSpec, run
from thinwire.cluster.fidelity import assess, rate_at, run_queue
from thinwire.cluster.netns import parse_qdisc_drops


def _stats(rates_mbit: list[float], host_busy: list[float], throttled_s: float = 0.0) -> dict:
    """One node sending at the given rates, one 0.1 s interval each."""
    t, tx, total = [0.0], [0], 0
    for i, rate in enumerate(rates_mbit, start=1):
        total += int(rate * 1e6 / 8 * 0.1)
        t.append(round(0.1 * i, 4))
        tx.append(total)
    return {"nodes": [{"node": 0, "throttled_s": throttled_s,
                       "series": {"t": t, "tx_bytes": tx}}],
            "host": {"t": t[1:], "cpu_busy": host_busy}}


SPEC = ClusterSpec(2, 1, inter_node_bandwidth="100mbit")


def test_a_node_that_fills_its_link_makes_a_link_bound_run():
    result = assess(_stats([95] * 20, [1.0] * 20), SPEC)  # even with a busy host
    assert result["verdict"] == "link" and result["nodes"][0]["link_peak_share"] >= 0.9


def test_traffic_below_the_link_on_a_saturated_host_is_host_bound():
    result = assess(_stats([30] * 20, [0.99] * 20), SPEC)
    assert result["verdict"] == "host" and result["nodes"][0]["busy_share"] == 1.0
    assert result["host_cpu_saturated_share"] == 1.0


def test_a_throttled_node_is_host_bound_and_light_traffic_on_a_free_host_is_neither():
    assert assess(_stats([30] * 20, [0.2] * 20, throttled_s=1.0), SPEC)["verdict"] == "host"
    assert assess(_stats([30] * 20, [0.2] * 20), SPEC)["verdict"] == "neither"


def test_the_schedule_sets_the_rate_a_node_is_measured_against():
    spec = ClusterSpec(2, 1, inter_node_bandwidth="100mbit",
                       bandwidth_schedule="0s:100mbit,1s:20mbit")
    assert rate_at(spec, 0.5) == 10**8 and rate_at(spec, 1.5) == 2 * 10**7
    # 19 Mbit/s after the drop fills the 20 Mbit/s link
    assert assess(_stats([5] * 10 + [19] * 20, [0.1] * 30), spec)["verdict"] == "link"


def test_qdisc_drops_and_the_run_queue_are_reported():
    stats = _stats([95] * 20, [1.0] * 20)
    stats["qdisc_drops"] = [{"node": 0, "dropped": 12, "overlimits": 400, "read": True}]
    stats["host"]["run_queue"] = [1, 3, 3, 5] + [None] * 16  # None: a sample not read
    result = assess(stats, SPEC)
    assert result["nodes"][0]["qdisc_dropped"] == 12
    assert result["host_run_queue_max"] == 5 and result["host_run_queue_median"] == 3
    assert run_queue([1, 3, 3, 5], cores=2)["host_run_queue_over_cores_share"] == 0.75
    assert run_queue([None]) == {}
    # a node whose counters could not be read has none, not zero
    stats["qdisc_drops"][0]["read"] = False
    assert assess(stats, SPEC)["nodes"][0]["qdisc_dropped"] is None


def test_a_root_qdisc_s_counters_are_read_from_tc_json():
    out = ('[{"kind":"pfifo","handle":"8001:","parent":"1:10","drops":5,"overlimits":0},'
           '{"kind":"htb","handle":"1:","root":true,"drops":7,"overlimits":31,"bytes":10}]')
    assert parse_qdisc_drops(out) == (7, 31)
    assert parse_qdisc_drops("") is None and parse_qdisc_drops("not json") is None
    assert parse_qdisc_drops('[{"kind":"pfifo","parent":"1:10"}]') is None


SENDER = textwrap.dedent("""
    import os, socket, time
    rank = int(os.environ["RANK"])
    if rank == 1:
        server = socket.socket(); server.bind(("0.0.0.0", 45123)); server.listen(1)
        conn, _ = server.accept()
        while conn.recv(1 << 20):
            pass
    else:
        time.sleep(1)
        conn = socket.create_connection((os.environ["MASTER_ADDR"].rsplit(".", 1)[0] + ".2",
                                         45123))
        end, chunk = time.monotonic() + 3, b"x" * (1 << 16)
        while time.monotonic() < end:
            conn.sendall(chunk)
        conn.close()
""")


@pytest.mark.root
def test_a_run_that_drives_its_link_is_judged_link_bound(cluster_leaks, tmp_path):
    script, stats = tmp_path / "send.py", tmp_path / "stats.json"
    script.write_text(SENDER)
    spec = ClusterSpec(nodes=2, ranks_per_node=1, inter_node_bandwidth="20mbit")
    assert run(spec, [str(script)], timeout_s=120, stats_path=str(stats)) == 0
    fidelity = json.loads(stats.read_text())["fidelity"]
    assert fidelity["verdict"] == "link", fidelity
    assert fidelity["nodes"][0]["link_peak_share"] >= 0.8
    # a TCP stream into a 20 Mbit/s queue overflows it now and then; counted, not guessed
    assert all(isinstance(n["qdisc_dropped"], int) for n in fidelity["nodes"]), fidelity
    assert fidelity["host_run_queue_max"] >= 0
