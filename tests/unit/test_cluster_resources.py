"""Node budgets and priority classes without root: validation, the BPF classifier, tc commands,
cgroup discovery and the cgroup files written, against a fake cgroup tree in a temp dir."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from thinwire.cluster import ClusterSpec, qos
from thinwire.cluster.cgroups import CgroupsUnavailable, NodeCgroups, discover
from thinwire.cluster.cli import add_resource_options, resource_kwargs
from thinwire.cluster.netns import tc_commands
from thinwire.cluster.spec import machine_cpus, parse_size


@pytest.mark.parametrize("kwargs, words", [
    ({"node_cpus": 0}, ["node_cpus", "0", "between 0.01"]),
    ({"node_cpus": machine_cpus() + 1}, ["node_cpus", "this machine's cores"]),
    ({"node_cpus": "lots"}, ["node_cpus", "'lots'"]),
    ({"node_memory": "32m"}, ["node_memory", "between 64MiB", "'32m'"]),
    ({"node_memory": "1 parsec"}, ["node_memory", "unknown unit"]),
    ({"link_classes": 1}, ["link_classes", "between 2 and 8", "1"]),
    ({"link_classes": 9}, ["link_classes", "9"]),
    ({"link_classes": 2, "class_queue": (10, 10, 10)}, ["class_queue", "2 integers"]),
    ({"link_classes": 2, "class_queue": 0}, ["class_queue", "between 1 and"]),
    ({"class_queue": 10}, ["class_queue", "needs link_classes"]),
    ({"best_effort_limits": "yes"}, ["best_effort_limits"]),
])
def test_bad_resource_values_rejected_with_clear_message(kwargs, words):
    with pytest.raises(ValueError) as info:
        ClusterSpec(nodes=2, ranks_per_node=1, **kwargs)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_limits_need_the_shaped_cluster():
    with pytest.raises(ValueError, match="shaping=True"):
        ClusterSpec(2, 1, shaping=False, node_cpus=0.5)
    with pytest.raises(ValueError, match="shaping=True"):
        ClusterSpec(2, 1, shaping=False, link_classes=2)


def test_sizes_and_queues_parse():
    assert parse_size("512m") == 512 * 2**20 == parse_size("512MiB")
    assert parse_size("1.5g") == int(1.5 * 2**30)
    spec = ClusterSpec(2, 1, node_cpus=0.5, node_memory="256m", link_classes=3,
                       class_queue=[50, 20, 5])
    assert spec.node_memory_bytes == 256 * 2**20 and spec.class_queue_packets == (50, 20, 5)
    assert ClusterSpec(2, 1, link_classes=2).class_queue_packets == (1000, 1000)
    assert "0.5 CPU/node" in spec.describe() and "256MiB/node" in spec.describe()


def test_cli_options_reach_the_spec():
    parser = argparse.ArgumentParser()
    add_resource_options(parser)
    args = parser.parse_args(["--node-cpus", "0.25", "--node-memory", "1g", "--link-classes",
                              "2", "--class-queue", "100", "8", "--best-effort-limits"])
    assert resource_kwargs(args) == {"node_cpus": 0.25, "node_memory": "1g",
                                     "best_effort_limits": True, "link_classes": 2,
                                     "class_queue": (100, 8)}
    assert resource_kwargs(parser.parse_args(["--class-queue", "7"]))["class_queue"] == 7


@pytest.mark.parametrize("classes", range(2, 9))
def test_bpf_classifier_matches_the_tos_rule_for_every_tos(classes):
    """The bytecode itself (run by a small interpreter) against the rule max(0, K-1-p)."""
    for tos in range(256):
        expected = 0x10000 + qos.CLASS_MINOR_BASE + qos.class_of_tos(tos, classes)
        assert qos.run_classify(tos, classes) == expected, tos
        assert qos.run_classify(tos, classes, ethertype=0x86DD) == expected, tos
    assert qos.run_classify(0, classes, ethertype=0x0806) == 0  # ARP: no match -> default


def test_tos_for_class_round_trips_and_rejects_unknown_classes():
    for classes in range(2, 9):
        for k in range(classes):
            assert qos.class_of_tos(qos.tos_for_class(k, classes), classes) == k
    assert qos.tos_for_class(1, 2) == 0  # the lowest class is unmarked traffic
    with pytest.raises(ValueError, match="priority_class must be .* between 0 .* and 1"):
        qos.tos_for_class(2, 2)
    with pytest.raises(ValueError, match="classes must be an integer between 2 and 8"):
        qos.tos_for_class(0, 9)


def test_priority_tc_commands_build_strict_priority_classes():
    cmds = tc_commands("eth0", 10**8, None, 0.05, (100, 8))
    text = [" ".join(c) for c in cmds]
    assert text[0].endswith("htb default 31")  # unclassified -> lowest class
    assert any("classid 1:30 htb" in t and "prio 0" in t and "ceil 100000000bit" in t
               for t in text)
    assert any("classid 1:31 htb" in t and "prio 1" in t for t in text)
    assert any("parent 1:30 handle 30: pfifo limit 100" in t for t in text)
    assert any("parent 1:31 handle 31: pfifo limit 8" in t for t in text)
    # The kernel runs filters by their prio number: loss (1) first, then the classes (2).
    filters = sorted(t for t in text if t.startswith("filter"))
    assert len(filters) == 2 and "prio 1 bpf" in filters[0] and "classid 1:20" in filters[0]
    assert "prio 2 bpf" in filters[1] and "classid 1:31" in filters[1]
    # Without classes the single-FIFO layout is unchanged.
    assert " ".join(tc_commands("eth0", 10**8)[0]).endswith("htb default 10")


def test_class_stats_parse_tc_output():
    out = ("class htb 1:31 parent 1:1 leaf 31: prio 1 rate 100Kbit ceil 100Mbit\n"
           " Sent 5000 bytes 40 pkt (dropped 7, overlimits 0 requeues 0)\n"
           "class htb 1:30 parent 1:1 leaf 30: prio 0 rate 100Kbit ceil 100Mbit\n"
           " Sent 9000 bytes 60 pkt (dropped 0, overlimits 3 requeues 0)\n")
    rows = qos.parse_class_stats(out, 2)
    assert rows == [{"class": 0, "sent_bytes": 9000, "sent_packets": 60, "dropped": 0},
                    {"class": 1, "sent_bytes": 5000, "sent_packets": 40, "dropped": 7}]


def _fake_v1(tmp: Path) -> tuple[Path, Path]:
    mounts = tmp / "mounts"
    lines = []
    for ctrl in ("cpu", "cpuacct", "memory"):
        (tmp / ctrl / "sandbox").mkdir(parents=True)
        lines.append(f"cgroup {tmp / ctrl} cgroup rw,relatime,{ctrl} 0 0")
    mounts.write_text("\n".join(lines) + "\n")
    proc = tmp / "cgroup"
    proc.write_text("3:memory:/sandbox\n2:cpuacct:/\n1:cpu:/\n")
    return mounts, proc


def test_v1_discovery_nests_under_own_cgroup_and_writes_limits(tmp_path):
    mounts, proc = _fake_v1(tmp_path)
    h = discover(mounts, proc)
    assert h.version == 1 and h.dirs["memory"] == tmp_path / "memory" / "sandbox"
    cg = NodeCgroups("abcd1234", 2, 0.5, 128 * 2**20, h)
    assert str(tmp_path / "memory/sandbox/thinwire-abcd1234-n1") in cg.paths()
    cg.create()  # plain directories here: the limit files are created by the writes
    d = cg.node_dirs(1)
    assert (d["cpu"] / "cpu.cfs_quota_us").read_text() == "50000"
    assert (d["cpu"] / "cpu.cfs_period_us").read_text() == "100000"
    assert (d["memory"] / "memory.limit_in_bytes").read_text() == str(128 * 2**20)
    (d["memory"] / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (d["cpuacct"] / "cpuacct.usage").write_text("1500000000\n")
    assert cg.oom_kills(1) == 2 and cg.cpu_seconds(1) == 1.5
    assert cg.procs_files(0) == [str(p / "cgroup.procs") for p in cg.node_dirs(0).values()]


def test_v2_discovery_and_missing_controllers(tmp_path):
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("cpu io memory pids\n")
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {tmp_path / 'unified'} cgroup2 rw 0 0\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/\n")
    h = discover(mounts, proc)
    assert h.version == 2
    cg = NodeCgroups("r", 1, 0.25, 64 * 2**20, h)
    cg.create()
    d = cg.node_dirs(0)["unified"]
    assert (d / "cpu.max").read_text() == "25000 100000"
    assert (d / "memory.max").read_text() == str(64 * 2**20)
    (tmp_path / "unified" / "cgroup.controllers").write_text("io pids\n")
    with pytest.raises(CgroupsUnavailable, match="best-effort-limits"):
        discover(mounts, proc)


def test_compare_and_bench_sync_pass_the_budgets_through():
    from thinwire.bench import sync
    from thinwire.train.compare import CompareSettings

    settings = CompareSettings(resources={"node_cpus": 0.5, "link_classes": 2}).validate()
    assert settings.common()["resources"] == {"node_cpus": 0.5, "link_classes": 2}
    assert "resources" not in CompareSettings().validate().common()  # old results stay valid
    for size in ("1m", "1e30g", 2**70):  # 1e30g wrapped to a tiny cgroup v1 limit
        with pytest.raises(ValueError, match=r"--node-memory must be between 64MiB .* and 4 EiB"):
            CompareSettings(resources={"node_memory": size}).validate()
    with pytest.raises(ValueError, match="--node-memory must be a finite size, got '1e400g'"):
        CompareSettings(resources={"node_memory": "1e400g"}).validate()
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    sync.register(sub)
    args = parser.parse_args(["sync", "--node-cpus", "1", "--node-memory", "2g"])
    assert resource_kwargs(args)["node_cpus"] == 1.0 and args.node_memory == "2g"


def test_plot_of_the_accounting_series(tmp_path):
    from thinwire.cluster.plot import _rates, plot_stats

    assert _rates([0.0, 0.1, 0.2, 0.3], [0.0, 0.05, None, 0.15]) == ([0.05, 0.2],
                                                                     pytest.approx([0.5, 0.5]))
    series = {"t": [0.0, 0.1, 0.2], "cpu_seconds": [0.0, 0.05, 0.1],
              "memory_bytes": [2**20, 2**21, 2**21], "tx_bytes": [0, 1000, 2000],
              "rx_bytes": [0, 500, 900], "lo_bytes": [0, 0, 0]}
    stats = {"spec": "test", "nodes": [{"node": 0, "cpu_limit": 0.5,
                                        "memory_limit_bytes": 2**22, "series": series}]}
    out = plot_stats(stats, tmp_path / "nodes.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_controllers_fail_clearly_or_warn_with_best_effort(monkeypatch, caplog):
    from thinwire.cluster import cgroups

    def no_controllers():
        raise CgroupsUnavailable("per-node CPU/memory limits need the cgroup controllers ...")

    monkeypatch.setattr(cgroups, "discover", no_controllers)
    with pytest.raises(CgroupsUnavailable, match="cgroup controllers"):
        cgroups.node_cgroups_for(ClusterSpec(2, 1, node_cpus=0.5), "r1")
    spec = ClusterSpec(2, 1, node_cpus=0.5, best_effort_limits=True)
    with caplog.at_level("WARNING"):
        assert cgroups.node_cgroups_for(spec, "r1") is None
    assert "WITHOUT per-node CPU/memory limits" in caplog.text
    # Accounting alone never fails a run: it just has no CPU/memory figures.
    assert cgroups.node_cgroups_for(ClusterSpec(2, 1), "r1", accounting=True) is None


def test_compare_checks_its_resources_at_every_rate_it_races():
    """Checked at 1 Gbit/s alone, a schedule beside an unshaped rate, or a rate too slow to
    split over the links, failed at its run, after the others, with no results written."""
    from thinwire.train.compare import CompareSettings

    with pytest.raises(ValueError, match=r"--inter-node-bandwidth none: --bandwidth-schedule="
                                         r".*needs shaped inter-node links"):
        CompareSettings(rates=["200mbit", "none"],
                        resources={"bandwidth_schedule": "0s:200mbit,5s:25mbit"}).validate()
    with pytest.raises(ValueError, match="--inter-node-bandwidth 150kbit: --links-per-node=2"):
        CompareSettings(rates=["1gbit", "150kbit"], resources={"links_per_node": 2}).validate()


def test_without_the_shaped_cluster_compare_refuses_what_only_it_runs(monkeypatch):
    from thinwire.train import compare
    from thinwire.train.compare import CompareSettings

    monkeypatch.setattr(compare, "missing_requirements", lambda: ["root"])
    settings = CompareSettings(resources={"bandwidth_schedule": "0s:200mbit,5s:25mbit"})
    with pytest.raises(ValueError, match="the shaped cluster needs root, and without it: "
                                         "bandwidth_schedule="):
        compare._resolve_shaping(settings)
    plain = CompareSettings()
    with pytest.warns(RuntimeWarning, match="falling back to --no-shaping"):
        compare._resolve_shaping(plain)  # nothing asked of the shaped cluster: loopback
    assert plain.shaping is False


def test_an_empty_schedule_option_is_refused_not_dropped():
    # "$SCHED" with the variable unset: run at a constant rate, it would measure another thing
    from thinwire.cluster import cli as cluster_cli

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cluster_cli.register(sub)
    args = parser.parse_args(["cluster", "run", "--bandwidth-schedule", "", "--", "-c", "1"])
    kwargs = resource_kwargs(args)
    assert kwargs["bandwidth_schedule"] == ""
    with pytest.raises(ValueError, match="bandwidth_schedule must be a string like"):
        ClusterSpec(nodes=2, ranks_per_node=1, **kwargs)


def test_a_dead_runs_state_file_names_only_its_own_cgroups(tmp_path, monkeypatch):
    # cleanup SIGKILLs everything in the cgroups a dead run recorded, as root: a damaged or
    # planted state file must not reach another cgroup
    import json

    from thinwire.cluster import netns

    monkeypatch.setattr(netns, "cgroup_mounts", lambda: ["/sys/fs/cgroup/cpu"])
    state = tmp_path / "abc123.json"
    own = "/sys/fs/cgroup/cpu/thinwire-abc123-n0"
    state.write_text(json.dumps({"run_id": "abc123", "pid": 1, "cgroups": [
        own, "/sys/fs/cgroup/cpu/system.slice", "/sys/fs/cgroup/cpu/thinwire-other-n0",
        "/tmp/thinwire-abc123-n1", "/sys/fs/cgroup/cpu/../../../tmp/thinwire-abc123-n2", 7]}))
    assert netns._recorded_cgroups(state) == [own]
    for damaged in ([own], {"run_id": 5, "cgroups": [own]}, {"run_id": "abc123"}):
        state.write_text(json.dumps(damaged))
        assert netns._recorded_cgroups(state) == []
