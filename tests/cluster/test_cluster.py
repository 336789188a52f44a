"""The emulated cluster end to end: launch, shaping fidelity, failure handling and cleanup.

Tests marked `root` build real network namespaces (skipped with the reason without root/ip/tc).
Bandwidth is goodput over TCP, so it sits ~4-5% under the shaped wire rate (headers); the bound
is 15%.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from thinwire.cluster import ClusterSpec, cleanup_dead_runs, run
from thinwire.cluster.check import measure_bandwidth, measure_rtt
from thinwire.cluster.launch import new_run_id
from thinwire.cluster.netns import Network, list_namespaces, sh

REPO = Path(__file__).resolve().parents[2]


def _results(out_dir: Path, world: int) -> list[dict]:
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def _expected_sum(world: int) -> list[float]:
    return [float(i * world * (world + 1) // 2) for i in range(8)]


@pytest.mark.root
def test_2x2_allreduce_right_result_and_torchrun_env(cluster_leaks, allreduce_script, tmp_path):
    out = io.StringIO()
    spec = ClusterSpec(nodes=2, ranks_per_node=2, inter_node_bandwidth="1gbit")
    status = run(spec, [str(allreduce_script)], env={"OUT_DIR": tmp_path, "EXTRA": "x"},
                 timeout_s=120, output=out)
    assert status == 0, out.getvalue()
    seen = _results(tmp_path, 4)
    for rank, s in enumerate(seen):
        assert s["result"] == _expected_sum(4)
        assert s["RANK"] == str(rank) and s["WORLD_SIZE"] == "4"
        assert s["LOCAL_WORLD_SIZE"] == "2" and s["THINWIRE_RANKS_PER_NODE"] == "2"
        assert s["GROUP_RANK"] == str(rank // 2) and s["LOCAL_RANK"] == str(rank % 2)
        assert s["MASTER_ADDR"] == "10.77.0.1" and s["GLOO_SOCKET_IFNAME"] == "eth0"
        assert s["EXTRA"] == "x"
    assert len(cluster_leaks) == 1


def test_no_shaping_runs_on_loopback_without_root(allreduce_script, tmp_path):
    out = io.StringIO()
    spec = ClusterSpec(nodes=2, ranks_per_node=1, shaping=False)
    status = run(spec, [str(allreduce_script)], env={"OUT_DIR": tmp_path}, timeout_s=120,
                 output=out)
    assert status == 0, out.getvalue()
    seen = _results(tmp_path, 2)
    assert [s["GROUP_RANK"] for s in seen] == ["0", "1"]
    assert all(s["MASTER_ADDR"] == "127.0.0.1" and s["result"] == _expected_sum(2) for s in seen)


@pytest.mark.root
@pytest.mark.parametrize("rate", ["100mbit", "1gbit"])
def test_inter_node_bandwidth_within_15_percent(cluster_leaks, rate):
    spec = ClusterSpec(nodes=2, ranks_per_node=1, inter_node_bandwidth=rate)
    network = Network(spec, new_run_id())
    cluster_leaks.append(network.run_id)
    try:
        network.create()
        measured = measure_bandwidth(network.exec_prefix(0), network.exec_prefix(1),
                                     network.node_addr(0), seconds=1.0)
    finally:
        network.teardown()
    assert abs(measured / spec.inter_node_bps - 1) <= 0.15, f"{rate}: measured {measured:.3g}"


@pytest.mark.root
def test_intra_node_bandwidth_shapes_loopback(cluster_leaks):
    spec = ClusterSpec(nodes=1, ranks_per_node=2, inter_node_bandwidth=None,
                       intra_node_bandwidth="200mbit")
    network = Network(spec, new_run_id())
    cluster_leaks.append(network.run_id)
    try:
        network.create()
        n0 = network.exec_prefix(0)
        measured = measure_bandwidth(n0, n0, network.node_addr(0), seconds=1.0)
    finally:
        network.teardown()
    assert abs(measured / 200e6 - 1) <= 0.15, f"measured {measured:.3g}"


@pytest.mark.root
def test_loss_drops_packets_on_both_hops(cluster_leaks):
    spec = ClusterSpec(nodes=2, ranks_per_node=1, loss="10%")
    network = Network(spec, new_run_id())
    cluster_leaks.append(network.run_id)
    try:
        network.create()
        # 100 round trips: each lost packet costs TCP a 200 ms retransmission timeout (300
        # took 20 s); a hop that drops ~5% of 200+ packets drops none with p < 1e-4
        measure_rtt(network.exec_prefix(0), network.exec_prefix(1), network.node_addr(0), count=100)
        stats = sh("tc", "-n", network.node_ns(1), "-s", "class", "show", "dev", "eth0").stdout
        stats += sh("tc", "-n", network.switch_ns, "-s", "class", "show", "dev", "p1").stdout
    finally:
        network.teardown()
    # The drop class (1:20) of each hop must have dropped packets: ~5% per hop of ~100.
    drops = [int(n) for n in re.findall(r"class htb 1:20 .*?dropped (\d+)", stats, re.S)]
    assert len(drops) == 2 and all(d > 0 for d in drops), stats


@pytest.mark.root
def test_latency_adds_requested_delay(cluster_leaks):
    spec = ClusterSpec(nodes=2, ranks_per_node=1, inter_node_latency="5ms")
    network = Network(spec, new_run_id())
    cluster_leaks.append(network.run_id)
    try:
        try:
            network.create()
        except RuntimeError as exc:
            if "netem" in str(exc):
                pytest.skip(f"kernel without netem: {exc}")
            raise
        one_way = measure_rtt(network.exec_prefix(0), network.exec_prefix(1),
                              network.node_addr(0), count=50) / 2
    finally:
        network.teardown()
    assert 0.005 <= one_way <= 0.0065, f"one-way {one_way * 1e3:.3f} ms"


@pytest.mark.root
def test_rank_crash_fails_fast_and_cleans_up(cluster_leaks, allreduce_script, tmp_path):
    out = io.StringIO()
    spec = ClusterSpec(nodes=2, ranks_per_node=2)
    start = time.monotonic()
    status = run(spec, [str(allreduce_script)], env={"OUT_DIR": tmp_path, "CRASH_RANK": "3"},
                 timeout_s=100, output=out)
    assert status != 0
    assert time.monotonic() - start < 90, "a crashed rank must end the run before the timeout"
    assert re.search(r"exitcode\s*:\s*7", out.getvalue()), out.getvalue()


@pytest.mark.root
def test_hung_rank_ends_at_timeout(cluster_leaks, allreduce_script, tmp_path):
    spec = ClusterSpec(nodes=2, ranks_per_node=1)
    status = run(spec, [str(allreduce_script)], env={"OUT_DIR": tmp_path, "HANG": "1"},
                 timeout_s=12, output=io.StringIO())
    assert status == 124


def _hanging_cluster_run(script, out_dir, nodes: int):
    """`thinwire cluster run` (the real main, only the cluster commands registered) of a job
    whose every rank hangs: (the process, its output so far) once every rank runs."""
    argv = [sys.executable, "-c", "import sys, thinwire.cli as c; "
            "c.COMMAND_MODULES = ['thinwire.cluster.cli']; sys.exit(c.main(sys.argv[1:]))",
            "cluster", "run", "--nodes", str(nodes), "--ranks-per-node", "1", "--timeout",
            "120", "--", str(script)]
    env = dict(os.environ, OUT_DIR=str(out_dir), HANG="1")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=REPO)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if sum("HANGING" in l for l in lines) == nodes:
            break
    return proc, lines


@pytest.mark.root
def test_sigint_stops_run_and_cleans_up(allreduce_script, tmp_path, run_leftovers,
                                        run_ids_of_pid):
    proc, lines = _hanging_cluster_run(allreduce_script, tmp_path, 2)
    run_ids = run_ids_of_pid(proc.pid)
    assert len(run_ids) == 1 and run_leftovers(run_ids[0]), "".join(lines)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(lines) + rest
    assert run_leftovers(run_ids[0]) == []
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(allreduce_script) not in ps, "a rank survived SIGINT"


@pytest.mark.root
@pytest.mark.parametrize("signals, status", [  # (SIGTERM twice: tried by hand, same path)
    (("SIGINT", "SIGINT", "SIGINT"), 130), (("SIGHUP", "SIGINT"), 129)])
def test_impatient_signals_during_the_cleanup_do_not_abandon_it(
        allreduce_script, tmp_path, run_leftovers, run_ids_of_pid, signals, status):
    """A second (third) Ctrl-C, SIGTERM or SIGHUP while the run cleans up waits for the
    clean-up: it used to interrupt the teardown and leak every namespace, cgroup, the state
    file, /etc/netns and the log folder while printing "cleaned up" (issue 33, item 3)."""
    proc, lines = _hanging_cluster_run(allreduce_script, tmp_path, 3)
    run_ids = run_ids_of_pid(proc.pid)
    logs = list(Path(tempfile.gettempdir()).glob(f"thinwire-cluster-logs-{run_ids[0]}-*"))
    assert len(logs) == 1
    for name in signals:
        proc.send_signal(getattr(signal, name))
        time.sleep(0.2)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == status, "".join(lines) + rest
    assert run_leftovers(run_ids[0]) == [] and not logs[0].exists(), rest
    assert "cluster run stopped and cleaned up" in rest and "remain" not in rest, rest
    assert "during the clean-up: finishing it first" in rest or len(signals) == 1, rest


@pytest.mark.root
def test_cleanup_removes_dead_runs_only(cluster_leaks, run_leftovers, run_ids_of_pid):
    # A run whose owner is SIGKILLed leaves its namespaces; a live run must be kept.
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from thinwire.cluster import ClusterSpec\n"
         "from thinwire.cluster.netns import Network\n"
         "net = Network(ClusterSpec(2, 1), sys.argv[1])\n"
         "net.create(); print('UP', flush=True); time.sleep(600)\n", new_run_id()],
        stdout=subprocess.PIPE, text=True)
    assert owner.stdout.readline().strip() == "UP"
    dead_id = run_ids_of_pid(owner.pid)[0]
    owner.kill()
    owner.wait()
    live = Network(ClusterSpec(1, 1), new_run_id())
    cluster_leaks.append(live.run_id)
    try:
        live.create()
        assert run_leftovers(dead_id), "the killed run should have left its namespaces"
        removed = cleanup_dead_runs()
        assert set(removed) >= {f"thinwire-{dead_id}-sw", f"thinwire-{dead_id}-n0"}
        assert run_leftovers(dead_id) == []
        assert f"thinwire-{live.run_id}-n0" in list_namespaces(), "a live run was removed"
    finally:
        live.teardown()


def test_a_launcher_log_folder_belongs_to_its_live_owner_only(tmp_path):
    from thinwire.cluster import netns

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = tmp_path / f"{netns.LOG_DIR_PREFIX}abcd1234-{os.getpid()}-x1"
    gone = tmp_path / f"{netns.LOG_DIR_PREFIX}abcd1234-{dead.pid}-x2"
    old_style = tmp_path / f"{netns.LOG_DIR_PREFIX}x3"
    for path in (mine, gone, old_style):
        path.mkdir()
    assert netns._log_dir_owner_alive(mine) and not netns._log_dir_owner_alive(gone)
    assert netns._log_dir_owner_alive(old_style)  # no pid: kept for an hour
    os.utime(old_style, (time.time() - 7200, time.time() - 7200))
    assert not netns._log_dir_owner_alive(old_style)
