"""CPR with a real failure on the emulated cluster: one rank's trainer process is SIGKILLed from
the host mid-run; its supervisor starts a replacement, the process group is re-formed (a new
generation) and training finishes (see `thinwire.recsys.cpr.cluster_job`).

* full recovery: every rank reloads the newest common checkpoint and redoes the lost steps, so
  the final state equals that of an uninterrupted run, bit for bit;
* partial recovery: only the killed rank reloads its shard (its rows go back to its checkpoint:
  the updates since then are lost); survivors keep their rows; all go on from the survivors'
  step with the survivors' dense model.

The uninterrupted reference runs the same job on loopback (no shaping, no namespaces): the
arithmetic does not depend on the network.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from thinwire.cluster import ClusterSpec, run

STEPS, SAVE_EVERY = 30, 5
KILL_AT = 12  # progress (completed steps) of the victim when it is killed: between saves 10 and 15


def _job(tmp: Path, mode: str, sleep: float) -> list[str]:
    return ["-m", "thinwire.recsys.cpr.cluster_job", "--dir", str(tmp / "ckpt"),
            "--out-dir", str(tmp / "out"), "--pid-dir", str(tmp / "pid"),
            "--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--mode", mode,
            "--step-sleep", str(sleep)]


def _results(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """`reference(ranks_per_node)`: results of the uninterrupted job (no failure, the mode does
    not matter then), on loopback, run once per module and world."""
    cache: dict[int, list[dict]] = {}

    def get(ranks_per_node: int) -> list[dict]:
        if ranks_per_node not in cache:
            tmp = tmp_path_factory.mktemp(f"reference{ranks_per_node}")
            out = io.StringIO()
            spec = ClusterSpec(nodes=2, ranks_per_node=ranks_per_node, shaping=False)
            status = run(spec, _job(tmp, "full", 0.0), timeout_s=120, output=out)
            assert status == 0, out.getvalue()
            results = _results(tmp / "out", spec.world_size)
            assert all(r["generations"] == 1 and r["recovered_from"] is None for r in results)
            cache[ranks_per_node] = results
        return cache[ranks_per_node]

    return get


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _run_and_kill(tmp: Path, mode: str, ranks_per_node: int, victim: int):
    """Run the job on the shaped cluster, SIGKILL `victim`'s trainer once it has completed
    KILL_AT steps; returns (status, output, results, progress at the kill, kill time)."""
    spec = ClusterSpec(nodes=2, ranks_per_node=ranks_per_node, inter_node_bandwidth="1gbit")
    out, done = io.StringIO(), {}
    thread = threading.Thread(target=lambda: done.update(
        status=run(spec, _job(tmp, mode, 0.15), timeout_s=150, output=out)))
    thread.start()
    try:
        pid_file, progress_file = tmp / "pid" / f"rank{victim}.pid", \
            tmp / "pid" / f"rank{victim}.progress"
        deadline = time.monotonic() + 90
        while (_read_int(progress_file) or 0) < KILL_AT:
            assert thread.is_alive(), f"the job ended before the kill:\n{out.getvalue()}"
            assert time.monotonic() < deadline, f"victim never reached step {KILL_AT}:\n" \
                                                f"{out.getvalue()}"
            time.sleep(0.02)
        pid = _read_int(pid_file)
        progress = _read_int(progress_file)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
    finally:
        thread.join()
    assert done.get("status") == 0, out.getvalue()
    new_pid = _read_int(pid_file)
    assert new_pid != pid, "the replacement trainer did not write its pid"
    text = out.getvalue()
    assert f"trainer (pid {pid}) killed by SIGKILL: starting a replacement" in text, text
    assert "failure detected" in text, text
    return text, _results(tmp / "out", spec.world_size), progress, killed_at


def _check_common(results: list[dict], victim: int, killed_at: float) -> None:
    for r in results:
        assert r["step"] == STEPS and r["generations"] == 2, r
    assert len({r["dense_digest"] for r in results}) == 1, "dense replicas disagree"
    assert len({r["resumed_at"] for r in results}) == 1, "ranks resumed at different steps"
    for rank, r in enumerate(results):
        if rank == victim:
            assert r["failure_detected_at"] is None  # the replacement never saw the old group
        else:
            # gloo reports the dead peer ("Connection closed by peer") at the next collective,
            # long before the 30 s process-group timeout
            detect = r["failure_detected_at"] - killed_at
            assert 0 <= detect < 15, f"rank {rank} detected the failure after {detect:.1f} s"


@pytest.mark.root
def test_full_recovery_after_kill_matches_uninterrupted_run(cluster_leaks, reference, tmp_path):
    ref = reference(1)
    victim = 1
    _, results, progress, killed_at = _run_and_kill(tmp_path / "kill", "full", 1, victim)
    assert len(cluster_leaks) == 1
    _check_common(results, victim, killed_at)
    back = results[0]["recovered_from"]
    assert all(r["recovered_from"] == back for r in results), "every rank reloads in full mode"
    assert back % SAVE_EVERY == 0 and back >= (progress // SAVE_EVERY) * SAVE_EVERY >= 10
    assert results[0]["resumed_at"] == back
    assert all(r["lost_steps"] == results[0]["lost_steps"] >= 1 for r in results)
    for rank, (a, b) in enumerate(zip(ref, results)):
        assert b["digest"] == a["digest"], f"rank {rank}: final state differs from the reference"


@pytest.mark.root
@pytest.mark.parametrize("ranks_per_node, victim", [
    # 4 ranks: several survivors agree on the step; the victim (node 1, local rank 0) has
    # peers on both nodes. (The 2-rank case, 1 x 1, is the full-recovery test's shape; run
    # alone it added 15 s to a suite at its time budget and nothing this one does not check.)
    pytest.param(2, 2, marks=pytest.mark.slow)])
def test_partial_recovery_after_kill_loses_only_the_killed_shards_updates(
        cluster_leaks, reference, tmp_path, ranks_per_node, victim):
    ref = reference(ranks_per_node)
    _, results, progress, killed_at = _run_and_kill(tmp_path / "kill", "partial",
                                                    ranks_per_node, victim)
    assert len(cluster_leaks) == 1
    _check_common(results, victim, killed_at)
    at = results[0]["resumed_at"]
    back = results[victim]["recovered_from"]
    assert back % SAVE_EVERY == 0 and (progress // SAVE_EVERY) * SAVE_EVERY <= back < at, \
        (back, at, progress)
    assert results[victim]["lost_steps"] == at - back >= 1
    for rank, (a, b) in enumerate(zip(ref, results)):
        state = b["history"][str(at)]  # this rank's state right after recovery
        assert state["dense"] == a["history"][str(at)]["dense"], f"rank {rank}: dense model"
        if rank == victim:
            # its rows are exactly those of its checkpoint: steps back..at-1 are lost
            assert state["shard"] == a["history"][str(back)]["shard"]
            assert state["shard"] != a["history"][str(at)]["shard"]
        else:
            # survivors did not reload: their rows are those of the uninterrupted run at `at`
            assert b["recovered_from"] is None and b["lost_steps"] == 0
            assert state["shard"] == a["history"][str(at)]["shard"], f"rank {rank}: shard"
        # from then on the stale rows change every gradient (FM interactions, dense model), so
        # no rank ends where the uninterrupted run does
        assert b["shard_digest"] != a["shard_digest"], f"rank {rank}"
    assert results[0]["dense_digest"] != ref[0]["dense_digest"]
