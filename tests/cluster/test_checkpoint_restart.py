"""Checkpoint-restart through a lost node (issue 32's baseline): `ClusterSpec.max_restarts`
makes torchrun restart every node's ranks after a failure, the job formed again by an elastic
rendezvous on the coordinator beside the nodes, and `thinwire train --resume-if-present`
continues from the job's checkpoint with the same command line (loopback: no root)."""

from __future__ import annotations

import io
import json
import logging
import subprocess

import pytest

from thinwire.cluster import ClusterSpec, run


def test_a_lost_node_restarts_the_job_from_its_checkpoint(tmp_path, caplog):
    """Also the launcher's side of a failure schedule: the node is killed (every process)
    and started again on time, each logged, and nothing of the job outlives the run."""
    # node 1 dies 1 s into training (steps of the mlp take a few ms; a checkpoint every 10) and
    # is back 0.5 s later; the run ends at the first evaluation past 2.5 s of training time
    spec = ClusterSpec(2, 1, shaping=False, inter_node_bandwidth=None, max_restarts=2,
                       failure_schedule="node1@1s,restart@1.5s", schedule_clock="training")
    output = io.StringIO()
    with caplog.at_level(logging.WARNING, logger="thinwire.cluster.schedule"):
        status = run(spec, ["-m", "thinwire.train", "--model", "mlp", "--epochs", "200",
                            "--eval-every", "25", "--budget-s", "2.5", "--compute-probe-iters",
                            "0", "--checkpoint", str(tmp_path / "ck"), "--checkpoint-every",
                            "10", "--resume-if-present", "--summary",
                            str(tmp_path / "summary.json")], timeout_s=240, output=output)
    log = output.getvalue()
    assert status == 0, log[-4000:]
    resumed = [line for line in log.splitlines() if "resumed from" in line]
    assert len(resumed) == 2, log[-4000:]  # both ranks, once, from the same step
    steps = {line.split(" at step ")[1].split()[0] for line in resumed}
    assert len(steps) == 1 and int(steps.pop()) % 10 == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "budget"
    times = [p["unix_time"] for p in summary["curve"]]
    assert times == sorted(times)
    messages = [r.getMessage() for r in caplog.records]
    assert any("node1 killed (every process, SIGKILL)" in m for m in messages)
    assert any("node1 restarted" in m for m in messages)
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "ck")], capture_output=True,
                          text=True).stdout
    assert left == "", f"processes of the job outlived the run: {left}"


def test_max_restarts_is_checked_and_excludes_fault_tolerance():
    with pytest.raises(ValueError, match="max_restarts must be an integer between 0 and 100"):
        ClusterSpec(2, 1, max_restarts=-1)
    with pytest.raises(ValueError, match="choose one"):
        ClusterSpec(2, 1, max_restarts=1, fault_tolerant=True)
