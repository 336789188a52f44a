"""Shared fixtures for the emulated-cluster tests.

Tests marked `root` need root plus `ip` and `tc`; elsewhere they are skipped with the reason.
`cluster_leaks` records every run this test starts and, afterwards, asserts that none of its
namespaces, veths, qdiscs or state files remain and that the host's own links and qdiscs are
exactly as they were.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from thinwire.cluster import cgroups, launch, netns


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") is not None:
        missing = netns.missing_requirements()
        if missing:
            pytest.skip("emulated cluster needs root, ip and tc; missing: " + ", ".join(missing))


def _host_snapshot() -> tuple[str, str]:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    names = "\n".join(sorted(line.split(":")[1].strip() for line in links.splitlines()))
    return names, qdiscs


def _run_leftovers(run_id: str) -> list[str]:
    """Everything of run `run_id` still present: namespaces, host links, /etc/netns, state,
    node cgroups."""
    found = [ns for ns in netns.list_namespaces() if ns.startswith(f"thinwire-{run_id}-")]
    found += cgroups.find_run_cgroups(f"thinwire-{run_id}-")
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [line for line in links.splitlines() if run_id in line]
    found += [str(p) for p in netns.NETNS_ETC.glob(f"thinwire-{run_id}-*")]
    state = netns.STATE_DIR / f"{run_id}.json"
    if state.exists():
        found.append(str(state))
    return found


def _run_ids_of_pid(pid: int) -> list[str]:
    """Run ids whose state file names `pid` as owner (for runs started in a subprocess)."""
    ids = []
    for path in netns.STATE_DIR.glob("*.json") if netns.STATE_DIR.is_dir() else []:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if state.get("pid") == pid:
            ids.append(state["run_id"])
    return ids


@pytest.fixture
def cluster_leaks(monkeypatch):
    """Yields the list of run ids started in this process; checks nothing of them remains."""
    run_ids: list[str] = []
    original = launch.new_run_id

    def recording_new_run_id() -> str:
        run_id = original()
        run_ids.append(run_id)
        return run_id

    monkeypatch.setattr(launch, "new_run_id", recording_new_run_id)
    monkeypatch.setattr("thinwire.cluster.check.new_run_id", recording_new_run_id)
    before = _host_snapshot()
    yield run_ids
    for run_id in run_ids:
        assert _run_leftovers(run_id) == [], f"run {run_id} left things behind"
    assert _host_snapshot() == before, "the host's own links or qdiscs changed"


@pytest.fixture
def allreduce_script(tmp_path: Path) -> Path:
    """A training-like script: each rank all-reduces and writes what it saw to OUT_DIR."""
    script = tmp_path / "allreduce_job.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys, time
        import torch, torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        if rank == int(os.environ.get("CRASH_RANK", "-1")):
            sys.exit(7)
        if os.environ.get("HANG"):
            print("HANGING", flush=True)
            time.sleep(3600)
        tensor = torch.arange(8, dtype=torch.float32) * (rank + 1)
        dist.all_reduce(tensor)
        seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "THINWIRE_RANKS_PER_NODE",
                "GLOO_SOCKET_IFNAME", "EXTRA")}
        seen["result"] = tensor.tolist()
        with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as f:
            json.dump(seen, f)
        dist.destroy_process_group()
    """))
    return script


@pytest.fixture
def run_leftovers():
    """`run_leftovers(run_id)`: what of that run still exists (namespaces, links, state file)."""
    return _run_leftovers


@pytest.fixture
def run_ids_of_pid():
    """`run_ids_of_pid(pid)`: ids of the runs owned by process `pid` (from their state files)."""
    return _run_ids_of_pid
