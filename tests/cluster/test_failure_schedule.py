"""Nodes that vanish and come back while the job runs (issue 32, item 3): `failure_schedule`
(`--fail node1@30s,restart@45s;node2@90s`) is checked before anything starts, and the
launcher kills every process of a node on time and starts it again (loopback: no root)."""

from __future__ import annotations

import pytest

from thinwire.cluster import ClusterSpec


def test_a_schedule_parses_into_ordered_kills_and_restarts():
    spec = ClusterSpec(3, 1, failure_schedule="node1@30s,restart@45s;node2@90s;node1@1min")
    assert spec.failure_events == ((30.0, 1, "kill"), (45.0, 1, "restart"),
                                   (60.0, 1, "kill"), (90.0, 2, "kill"))
    assert "node1 kill at 30s, node1 restart at 45s" in spec.describe()


@pytest.mark.parametrize("schedule, message", [
    ("node3@1s", r"node3 does not exist \(nodes are node0..node2\)"),
    ("node1@30s,restart@20s", "node1 restarts at 20s, not after it is killed at 30s"),
    ("node1@30s;node1@40s", "node1 is killed at 40s while it is down .* the outages overlap"),
    ("node1@30s,restart@45s;node1@40s", "the outages overlap"),
    ("node1@30s,kill@40s", "only restart@TIME may follow"),
    ("nodeX@3s", r"every group must be nodeN@TIME\[,restart@LATER\]"),
    ("node1@3", "time '3' needs a unit"),
    ("", "must be a string like"),
])
def test_a_bad_schedule_is_refused_by_name_before_anything_starts(schedule, message):
    with pytest.raises(ValueError, match=message):
        ClusterSpec(3, 1, failure_schedule=schedule)


# The launcher's side of a schedule (the node killed, every process, and started again on
# time, each logged, nothing left behind) is tested with a real job that goes through it:
# tests/cluster/test_checkpoint_restart.py.
