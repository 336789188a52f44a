"""Nodes that vanish and come back while the job runs (issue 32, item 3): `failure_schedule`
(`--fail node1@30s,restart@45s;node2@90s`) is checked before anything starts, and the
launcher kills every process of a node on time and starts it again (loopback: no root)."""

from __future__ import annotations

import logging
import subprocess
import textwrap
import time

import pytest

from thinwire.cluster import ClusterSpec, run


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


JOB = textwrap.dedent("""
    import os, sys, time
    path = os.path.join(sys.argv[1], "node%s.log" % os.environ["GROUP_RANK"])
    with open(path, "a") as f:
        f.write("start %d\\n" % os.getpid())
    time.sleep(float(sys.argv[2]))
    with open(path, "a") as f:
        f.write("end %d\\n" % os.getpid())
""")


def test_a_killed_node_loses_its_processes_and_a_restarted_one_runs_again(tmp_path, caplog):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    # node1 dies 7 s after the launchers start (its rank is sleeping then - torchrun starts it
    # in 2-4 s here - unless the machine is so loaded that it took longer) and comes back a
    # second later
    spec = ClusterSpec(3, 1, shaping=False, inter_node_bandwidth=None,
                       failure_schedule="node1@7s,restart@8s")
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="thinwire.cluster.schedule"):
        status = run(spec, [str(script), str(tmp_path), "9"], timeout_s=240)
    assert status == 0
    assert time.monotonic() - began < 200  # not torchrun's 300 s exit barrier
    for node in (0, 2):
        assert [line.split()[0] for line in (tmp_path / f"node{node}.log").read_text()
                .splitlines()] == ["start", "end"]
    lines = (tmp_path / "node1.log").read_text().split("\n")[:-1]
    assert lines[-1].startswith("end") and sum(x.startswith("end") for x in lines) == 1
    first = lines[0].split()[1]
    if len(lines) == 3:  # the first incarnation had started: it was killed, not finished
        assert lines[1].startswith("start") and lines[2] == f"end {lines[1].split()[1]}"
        assert first != lines[1].split()[1]
    left = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout
    assert left == "", f"processes of the job outlived the run: {left}"
    messages = [r.getMessage() for r in caplog.records]
    assert any("node1 killed (every process, SIGKILL)" in m for m in messages)
    assert any("node1 restarted" in m for m in messages)
