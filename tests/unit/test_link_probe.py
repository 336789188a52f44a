"""The link probe's watch on the host: the fidelity monitor's rules applied to one probe, the
cgroup readings they rest on, and auto probing again where the host, not the link, was measured."""

import pytest

from thinwire import link_probe
from thinwire.train import auto


@pytest.mark.parametrize("busy, throttled, goodput, configured, expected", [
    (0.97, 0.0, 90e6, 100e6, "host"),      # saturated CPUs: whatever the goodput
    (0.50, 0.25, 90e6, 100e6, "host"),     # a quota held the probe back
    (0.50, 0.0, 60e6, 100e6, "neither"),   # a free host under 80% of the configured rate
    (0.50, 0.0, 90e6, 100e6, "link"),
    (None, 0.0, 3e9, None, "link"),        # a real cluster: a free host is all it can check
    (0.96, 0.0, 3e9, None, "host"),
])
def test_a_probe_is_trusted_only_where_the_link_set_its_pace(busy, throttled, goodput,
                                                              configured, expected):
    bound, why = link_probe.verdict(busy, throttled, goodput, configured)
    assert bound == expected and why


def test_under_a_bandwidth_schedule_the_starts_rate_is_not_the_links(monkeypatch):
    monkeypatch.setenv(link_probe.CONFIGURED_RATE_ENV, "200000000")
    assert link_probe.configured_bps() == 2e8
    monkeypatch.setenv(link_probe.SCHEDULED_ENV, "1")  # 200 -> 25 Mbit/s: 25 is the link now
    assert link_probe.configured_bps() is None


def test_the_launcher_says_when_a_schedule_changes_the_rate():
    from thinwire.cluster.launch import node_env
    from thinwire.cluster.spec import ClusterSpec

    steady = ClusterSpec(nodes=2, ranks_per_node=1, inter_node_bandwidth="200mbit")
    scheduled = ClusterSpec(nodes=2, ranks_per_node=1, inter_node_bandwidth="200mbit",
                            bandwidth_schedule="0s:200mbit,5s:25mbit")
    assert link_probe.SCHEDULED_ENV not in node_env(steady, 0, "eth0", None)
    assert node_env(scheduled, 0, "eth0", None)[link_probe.SCHEDULED_ENV] == "1"


@pytest.mark.parametrize("text, seconds", [
    ("nr_periods 10\nnr_throttled 2\nthrottled_time 1500000000\n", 1.5),  # cgroup v1: ns
    ("usage_usec 9\nnr_throttled 2\nthrottled_usec 250000\n", 0.25),       # cgroup v2: us
    ("usage_usec 9\n", 0.0),                                                 # no quota
])
def test_throttled_time_is_read_from_either_cgroup_version(tmp_path, text, seconds):
    stat = tmp_path / "cpu.stat"
    stat.write_text(text)
    assert link_probe.read_throttled_s(stat) == seconds
    assert link_probe.read_throttled_s(None) == 0.0
    assert link_probe.read_throttled_s(tmp_path / "missing") == 0.0


def test_the_watch_reports_the_hosts_busy_share_and_the_quotas_hold(tmp_path, monkeypatch):
    readings = iter([(100, 1000), (195, 1100)])  # 95 of 100 jiffies busy
    monkeypatch.setattr(link_probe, "read_host_cpu", lambda: next(readings))
    stat = tmp_path / "cpu.stat"
    stat.write_text("throttled_usec 0\n")
    with link_probe.HostWatch(cpu_stat=stat) as watch:
        stat.write_text(f"throttled_usec {10 ** 6}\n")  # a second held back...
    assert watch.host_busy == pytest.approx(0.95)
    assert watch.throttled_share > 1  # ...in a span far shorter than a second


def test_the_watch_reads_this_host(tmp_path):
    with link_probe.HostWatch() as watch:
        sum(range(10 ** 5))
    assert watch.host_busy is None or 0.0 <= watch.host_busy <= 1.0
    assert watch.seconds > 0 and watch.throttled_share >= 0


def _probe(goodput, trusted=True, nodes=2):
    return {"nodes": nodes, "goodput_Bps": goodput if nodes > 1 else None,
            "bound_by": "link" if trusted else "host", "trusted": trusted,
            "why": "scripted", "host_busy": 0.5 if trusted else 0.99, "throttled_share": 0.0}


def _scripted(monkeypatch, probes):
    """The probes in turn; an exception among them is raised by its turn."""
    taken = iter(probes)

    def probe(*args, **kwargs):
        scripted = next(taken)
        if isinstance(scripted, Exception):
            raise scripted
        return scripted
    monkeypatch.setattr(auto, "probe_inter_node", probe)


UNUSABLE = "the link probe is not usable: 2097152 bytes took 0.0010 s, no longer than"


def test_a_probe_whose_sizes_came_out_inverted_is_taken_again(monkeypatch):
    # on a fast link two sizes differ by a millisecond, which jitter can invert: registration
    # must not fail on the first such probe
    _scripted(monkeypatch, [ValueError(UNUSABLE), _probe(4e7)])
    probe = auto.probe_trusted(2, tries=3, pause_s=0)
    assert probe["goodput_Bps"] == 4e7 and probe["trusted"]
    assert probe["tries"][0]["goodput_Bps"] is None and "not usable" in probe["tries"][0]["why"]
    assert probe["tries"][1]["bound_by"] == "link"


def test_where_every_probe_came_out_inverted_the_error_is_raised(monkeypatch):
    _scripted(monkeypatch, [ValueError(UNUSABLE)] * 3)
    with pytest.raises(ValueError, match="not usable"):
        auto.probe_trusted(2, tries=3, pause_s=0)


def test_a_host_bound_probe_beside_inverted_ones_is_the_answer(monkeypatch):
    _scripted(monkeypatch, [_probe(2e7, trusted=False), ValueError(UNUSABLE),
                            ValueError(UNUSABLE)])
    probe = auto.probe_trusted(2, tries=3, pause_s=0)
    assert probe["goodput_Bps"] == 2e7 and not probe["trusted"] and len(probe["tries"]) == 3


def test_auto_probes_again_until_the_link_is_measured(monkeypatch):
    _scripted(monkeypatch, [_probe(5e7, trusted=False), _probe(4e7)])
    probe = auto.probe_trusted(2, tries=3, pause_s=0)
    assert probe["goodput_Bps"] == 4e7 and probe["trusted"]
    assert [t["bound_by"] for t in probe["tries"]] == ["host", "link"]


def test_where_no_probe_is_trusted_auto_takes_the_fastest_and_says_so(monkeypatch):
    _scripted(monkeypatch, [_probe(g, trusted=False) for g in (1e7, 3e7, 2e7)])
    probe = auto.probe_trusted(2, tries=3, pause_s=0)
    assert probe["goodput_Bps"] == 3e7 and not probe["trusted"]
    assert len(probe["tries"]) == 3


def test_a_probe_under_the_rate_on_a_free_host_is_not_taken_again(monkeypatch):
    neither = dict(_probe(1.8e7 / 8, trusted=False), bound_by="neither")
    _scripted(monkeypatch, [neither, _probe(3e6)])
    probe = auto.probe_trusted(2, tries=3, pause_s=0)
    assert probe["goodput_Bps"] == 1.8e7 / 8 and not probe["trusted"]
    assert len(probe["tries"]) == 1


def test_one_node_has_no_link_to_trust(monkeypatch):
    _scripted(monkeypatch, [_probe(None, nodes=1)])
    assert auto.probe_trusted(1, tries=3, pause_s=0)["goodput_Bps"] is None


@pytest.mark.parametrize("small_s, factor", [(0.35, 2), (0.088, 5), (0.009, 8), (5.0, 2)])
def test_the_larger_probe_size_keeps_the_wire_busy_a_little_longer(world_of_one, small_s,
                                                                     factor):
    import torch.distributed as dist

    size = link_probe.larger_probe_size(1 << 20, small_s, dist.group.WORLD,
                                    link_probe.probe_device())
    assert size == factor << 20


def test_a_paced_sender_starts_at_the_schedules_0s_rate():
    """cluster run's --inter-node-bandwidth defaults to 1 Gbit/s; a schedule's 0 s entry sets
    the link's rate from the start, and dlcp must pace at that rate, not at the default."""
    from thinwire.cluster.launch import node_env
    from thinwire.cluster.spec import ClusterSpec

    spec = ClusterSpec(nodes=2, ranks_per_node=1, inter_node_bandwidth="1gbit",
                       bandwidth_schedule="0s:25mbit,5s:200mbit")
    assert node_env(spec, 0, "eth0", None)[link_probe.CONFIGURED_RATE_ENV] == "25000000"


def test_auto_s_probe_waits_on_the_group_it_is_given(monkeypatch):
    # the ranks that do not probe wait on auto's choosing group (900 s), not on the default
    # group's --collective-timeout, while the leaders probe
    seen = []
    monkeypatch.setattr(auto, "probe_inter_node",
                        lambda *a, **k: seen.append(k.get("world_group")) or _probe(4e7))
    auto.probe_trusted(2, tries=1, pause_s=0, world_group="waiting")
    assert seen == ["waiting"]
