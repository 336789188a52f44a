"""Links that change while the job runs (issue 31, item 5): `bandwidth_schedule`'s parsing,
the tc commands that move a shaped link, and a run whose links slow down on time (root)."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from thinwire.cluster import ClusterSpec, run
from thinwire.cluster.launch import new_run_id
from thinwire.cluster.netns import Network, rate_change_commands, tc_commands
from thinwire.cluster.spec import parse_bandwidth_schedule


def test_a_schedule_parses_into_increasing_times_and_rates():
    assert parse_bandwidth_schedule("0s:200mbit, 40s:25mbit,1.5min:200mbit") == (
        (0.0, 200_000_000), (40.0, 25_000_000), (90.0, 200_000_000))
    assert parse_bandwidth_schedule("500ms:1gbit")[0][0] == 0.5
    spec = ClusterSpec(2, 1, inter_node_bandwidth="200mbit",
                       bandwidth_schedule="0s:200mbit,40s:25mbit")
    assert "bandwidth schedule 0s:200mbit, 40s:25mbit" in spec.describe()


@pytest.mark.parametrize("schedule, message", [
    ("40s:25mbit,10s:1gbit", "times must increase, got '10s' after 40s"),
    ("40s:25mbit,40s:1gbit", "times must increase"),
    ("40:25mbit", "time '40' needs a unit; units: ms, s, min, h"),
    ("40s-25mbit", "every entry must be TIME:RATE"),
    ("-1s:1gbit", "time .-1s. is negative; times are seconds after the job starts, >= 0"),
    ("0s:1kbit", "rate must be between 100kbit and 100gbit, got '1kbit'"),
    ("0s:25MBps", "unknown unit 'mbps'"),
    ("8d:1gbit", "time '8d' has an unknown unit 'd'; units: ms, s, min, h"),
    ("", "must be a string like"),
])
def test_a_bad_schedule_is_refused_by_name_before_anything_is_built(schedule, message):
    with pytest.raises(ValueError, match=message):
        ClusterSpec(2, 1, bandwidth_schedule=schedule)


@pytest.mark.parametrize("kwargs, message", [
    (dict(shaping=False), "needs shaped inter-node links"),
    (dict(inter_node_bandwidth=None), "needs shaped inter-node links"),
    (dict(links_per_node=4, bandwidth_schedule="0s:300kbit"), "split over 4 links is below"),
])
def test_a_schedule_needs_shaped_links(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClusterSpec(2, 1, **{"bandwidth_schedule": "0s:100mbit", **kwargs})


def test_the_rate_change_moves_exactly_the_classes_the_link_was_built_with():
    built = tc_commands("eth0", 10**9)
    change = rate_change_commands("eth0", 25 * 10**6)
    assert [c[:8] for c in change] == [["class", "change"] + c[2:8] for c in built
                                       if c[:2] == ["class", "add"]]
    assert "25000000bit" in change[0]
    built = tc_commands("eth0", 10**9, class_queues=(10, 10, 10))
    change = rate_change_commands("eth0", 25 * 10**6, (10, 10, 10))
    assert [c[7] for c in change] == [c[7] for c in built if c[:2] == ["class", "add"]]


def _classes(ns: str, dev: str) -> str:
    return subprocess.run(["tc", "-n", ns, "class", "show", "dev", dev], capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.root
@pytest.mark.parametrize("link_classes", [None, 3])
def test_a_live_network_moves_every_link_both_ways(cluster_leaks, link_classes):
    spec = ClusterSpec(nodes=2, ranks_per_node=1, inter_node_bandwidth="200mbit",
                       links_per_node=2, link_classes=link_classes)
    network = Network(spec, new_run_id())
    cluster_leaks.append(network.run_id)
    try:
        network.create()
        network.set_inter_node_rate(50_000_000)
        for node in range(2):
            for port, dev, _ in network.links(node, 2):
                for ns, name in ((network.node_ns(node), dev), (network.switch_ns, port)):
                    shown = _classes(ns, name)
                    assert "ceil 25Mbit" in shown and "ceil 100Mbit" not in shown, shown
    finally:
        network.teardown()


JOB = textwrap.dedent("""
    import os, subprocess, sys, time
    time.sleep(float(sys.argv[2]))
    shown = subprocess.run(["tc", "class", "show", "dev", "eth0"], capture_output=True,
                           text=True).stdout
    if os.environ.get("RANK") == "0":
        open(sys.argv[1], "w").write(shown)
""")


@pytest.mark.root
def test_a_running_job_sees_its_links_slow_down_on_time(cluster_leaks, tmp_path):
    script, seen, stats = tmp_path / "job.py", tmp_path / "seen.txt", tmp_path / "stats.json"
    script.write_text(JOB)
    spec = ClusterSpec(nodes=2, ranks_per_node=1, inter_node_bandwidth="100mbit",
                       bandwidth_schedule="0s:100mbit,1s:20mbit")
    status = run(spec, [str(script), str(seen), "3"], timeout_s=120, stats_path=str(stats))
    assert status == 0
    assert "rate 20Mbit" in seen.read_text(), seen.read_text()  # the job saw the new rate
    changes = json.loads(stats.read_text())["bandwidth_changes"]
    assert [(c["planned_s"], c["rate_bps"]) for c in changes] == [(0.0, 10**8), (1.0, 2 * 10**7)]
    assert 1.0 <= changes[1]["applied_s"] < 1.5  # the launcher ticks every 0.1 s
