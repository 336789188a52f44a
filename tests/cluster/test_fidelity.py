"""Was a run measuring the wire or the host (issue 31, item 6)? The verdict from synthetic
accounting series, and from a real shaped run that drives its link (root)."""

from __future__ import annotations

import json
import math
import textwrap

import pytest

from thinwire.cluster import ClusterSpec, run
from thinwire.cluster.fidelity import assess, phases, rate_at, run_queue
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


SCHEDULED = ClusterSpec(2, 1, inter_node_bandwidth="100mbit",
                        bandwidth_schedule="0s:100mbit,1s:20mbit")


def test_the_phases_follow_the_changes_the_schedule_applied():
    assert phases(SCHEDULED) == [(0.0, 1.0, 10**8), (1.0, math.inf, 2 * 10**7)]
    # applied 0.4 s late (the launcher's tick, or the training clock): the phase moves too
    applied = [(0.0, 10**8), (1.4, 2 * 10**7)]
    assert phases(SCHEDULED, applied) == [(0.0, 1.4, 10**8), (1.4, math.inf, 2 * 10**7)]
    assert rate_at(SCHEDULED, 1.2, applied) == 10**8
    # a change that never happened (the clock never started) makes no phase
    assert phases(SCHEDULED, [(0.0, 10**8)]) == [(0.0, math.inf, 10**8)]


def test_each_phase_of_a_schedule_gets_its_own_verdict():
    """95 Mbit/s on the 100 Mbit/s link (the wire), then 5 Mbit/s of a 20 Mbit/s link on a
    saturated host: the run drove its link once, its second phase measured the host."""
    stats = _stats([95] * 10 + [5] * 20, [0.2] * 10 + [0.99] * 20)
    result = assess(stats, SCHEDULED)
    assert result["verdict"] == "link"
    first, second = result["phases"]
    assert (first["verdict"], first["rate_bps"], first["from_s"], first["to_s"]) == \
        ("link", 10**8, 0.0, 1.0)
    assert (second["verdict"], second["rate_bps"], second["to_s"]) == ("host", 2 * 10**7, None)
    assert second["nodes"][0]["busy_share"] == 1.0 and second["host_cpu_saturated_share"] == 1.0
    assert "qdisc_dropped" not in second["nodes"][0]  # read once, at the run's end
    assert "phases" not in assess(stats, SPEC)  # no schedule, one verdict


def test_a_phase_after_a_drop_is_not_judged_by_the_traffic_before_it():
    """1 Gbit/s -> 100 Mbit/s applied between two samples (1.05 s): the node sent 950 Mbit/s,
    then 10 Mbit/s. No window of the second phase may open in the first."""
    spec = ClusterSpec(2, 1, inter_node_bandwidth="1gbit",
                       bandwidth_schedule="0s:1gbit,1s:100mbit")
    stats = _stats([950] * 10 + [10] * 20, [0.2] * 30)
    first, second = assess(stats, spec, [(0.0, 10**9), (1.05, 10**8)])["phases"]
    assert first["verdict"] == "link"
    assert second["nodes"][0]["link_peak_share"] < 0.2 and second["verdict"] == "neither"


def test_a_window_across_a_drop_is_judged_against_the_rate_before_it():
    """1 Gbit/s -> 200 Mbit/s at 4.05 s; the node sent 300 Mbit/s on a saturated host until
    the drop, then nothing: it never drove a link. Judged against the 200 Mbit/s at its end, a
    window across the drop read 1.35 of that rate, and the whole run 'link'."""
    spec = ClusterSpec(2, 1, inter_node_bandwidth="1gbit",
                       bandwidth_schedule="0s:1gbit,4s:200mbit")
    stats = _stats([300] * 40 + [0] * 20, [0.99] * 40 + [0.2] * 20)
    result = assess(stats, spec, [(0.0, 10**9), (4.05, 2 * 10**8)])
    assert result["nodes"][0]["link_peak_share"] <= 0.31
    assert result["verdict"] == "host"
    assert [phase["verdict"] for phase in result["phases"]] == ["host", "neither"]


def _two_links(rates_mbit: list[tuple[float, float]]) -> dict:
    """One node of two links sending at the given (link 0, link 1) rates, 0.1 s each."""
    t, sent = [0.0], [[0, 0]]
    for i, rates in enumerate(rates_mbit, start=1):
        sent.append([before + int(rate * 1e6 / 8 * 0.1) for before, rate in zip(sent[-1], rates)])
        t.append(round(0.1 * i, 4))
    return {"nodes": [{"node": 0, "throttled_s": 0.0,
                       "series": {"t": t, "tx_bytes": [sum(row) for row in sent],
                                  "tx_link_bytes": sent}}],
            "host": {"t": t[1:], "cpu_busy": [0.2] * len(rates_mbit)}}


def test_one_full_link_of_a_node_s_two_makes_a_link_bound_run():
    """gloo drives one of a node's links: 49 Mbit/s on link 0, of the 50 Mbit/s it has of the
    node's 100, is the wire's limit though the node's sum is half its rate."""
    spec = ClusterSpec(2, 1, inter_node_bandwidth="100mbit", links_per_node=2)
    result = assess(_two_links([(49, 0)] * 20), spec)
    assert result["verdict"] == "link" and result["nodes"][0]["link_peak_share"] >= 0.95
    assert assess(_two_links([(20, 20)] * 20), spec)["verdict"] == "neither"
    # a run recorded before the links were kept apart: judged by the node's sum, as then
    stats = _two_links([(49, 0)] * 20)
    del stats["nodes"][0]["series"]["tx_link_bytes"]
    assert assess(stats, spec)["verdict"] == "neither"


def test_a_phase_whose_quota_held_the_node_back_is_host_bound():
    stats = _stats([5] * 30, [0.2] * 30, throttled_s=0.6)
    # the quota's counter grew only after the change at 1 s: 0.6 s of the second 2 s
    stats["nodes"][0]["series"]["throttled_s"] = [0.0] * 11 + [0.03 * i for i in range(1, 21)]
    first, second = assess(stats, SCHEDULED)["phases"]
    assert first["verdict"] == "neither" and first["nodes"][0]["throttled_s"] == 0.0
    assert second["verdict"] == "host" and second["nodes"][0]["throttled_s"] == 0.6


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


@pytest.mark.root
def test_a_scheduled_run_is_judged_per_phase_at_the_applied_change(cluster_leaks, tmp_path):
    script, stats = tmp_path / "send.py", tmp_path / "stats.json"
    # sends for 8 s from 1 s after its start (a few seconds into the job): both phases see it
    script.write_text(SENDER.replace("time.monotonic() + 3", "time.monotonic() + 8"))
    spec = ClusterSpec(nodes=2, ranks_per_node=1, inter_node_bandwidth="20mbit",
                       bandwidth_schedule="0s:20mbit,6s:100mbit")
    assert run(spec, [str(script)], timeout_s=120, stats_path=str(stats)) == 0
    data = json.loads(stats.read_text())
    first, second = data["fidelity"]["phases"]
    assert first["rate_bps"] == 2 * 10**7 and first["verdict"] == "link", first
    assert second["rate_bps"] == 10**8 and second["to_s"] is None
    # the boundary is where the change was applied (after the planned 6 s, within a tick)
    assert 6.0 <= first["to_s"] == second["from_s"] < 7.5
    assert all("throttled_s" in n["series"] for n in data["nodes"])
