"""Per-node accounting of a cluster run: CPU seconds, memory, bytes on each node's link, OOM kills.

A `NodeMonitor` thread samples every `interval_s` (default 100 ms):
  - from the node's cgroups (when the run has them): CPU seconds used, memory in use;
  - from /proc/<pid>/net/dev of the node's torchrun (a process inside the node's namespace, so
    the file shows that namespace's interfaces): bytes sent and received on its links to the
    switch (eth0, and eth1.. with several links per node, summed) and on lo (between ranks of
    the node). No subprocess per sample.
It also watches the cgroups' OOM-kill counters: when the kernel kills a process of a node for
exceeding its memory limit, `oom` is set within one interval and the launcher stops the run with
`NodeOutOfMemory` naming the node, the limit and the peak usage.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from thinwire.cluster.cgroups import NodeCgroups
from thinwire.cluster.spec import format_size
# the whole host's CPU: every node of the emulated cluster shares these cores
from thinwire.link_probe import read_host_cpu

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 0.1


class NodeOutOfMemory(RuntimeError):
    """A node exceeded its memory limit and the kernel killed one of its processes."""

    def __init__(self, node: int, limit_bytes: int | None, peak_bytes: int | None, kills: int):
        self.node, self.limit_bytes, self.peak_bytes, self.kills = node, limit_bytes, peak_bytes, kills
        limit = format_size(limit_bytes) if limit_bytes else "?"
        peak = format_size(peak_bytes) if peak_bytes is not None else "unknown"
        super().__init__(
            f"node {node} exceeded its memory limit of {limit} (node_memory / --node-memory) and "
            f"the kernel killed {kills} of its processes (out of memory); peak usage of node "
            f"{node}: {peak}. Give the nodes more memory or make the job smaller")


def read_net_dev(pid: int) -> dict[str, tuple[int, int]]:
    """interface -> (rx_bytes, tx_bytes) in the network namespace of process `pid`."""
    counters = {}
    for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        counters[name.strip()] = (int(fields[0]), int(fields[8]))
    return counters


def read_run_queue() -> int | None:
    """Tasks runnable on the host now, this reader not counted (/proc/loadavg's fourth field,
    'running/total'); None where it cannot be read."""
    try:
        running = Path("/proc/loadavg").read_text().split()[3].split("/")[0]
        return max(int(running) - 1, 0)
    except (OSError, IndexError, ValueError):
        return None


class NodeMonitor:
    """Samples every node of a run in a background thread. `start()`, then `stop()`, then
    `report()` (before the cgroups are removed)."""

    def __init__(self, nodes: int, cgroups: NodeCgroups | None,
                 interval_s: float = SAMPLE_INTERVAL_S):
        self.nodes, self.cgroups, self.interval_s = nodes, cgroups, interval_s
        self.pids: dict[int, int] = {}  # node -> a pid inside its namespace (its torchrun)
        # throttled_s: the node's CPU quota's hold so far (per phase of a bandwidth schedule);
        # tx_link_bytes: each of its links' own bytes sent (eth0, eth1, ...: gloo drives one
        # of K links, whose share of the node's rate is 1/K; the fidelity monitor judges each)
        self.series = [{"t": [], "cpu_seconds": [], "memory_bytes": [], "tx_bytes": [],
                        "tx_link_bytes": [], "rx_bytes": [], "lo_bytes": [], "throttled_s": []}
                       for _ in range(nodes)]
        self._last_net = [(0, 0, 0)] * nodes
        self._last_links: list[list[int]] = [[] for _ in range(nodes)]
        # the host's CPU busy share per interval, and its run queue (tasks ready to run,
        # the sampler itself not counted) at the sample: more than its cores, CPUs were short
        self.host = {"t": [], "cpu_busy": [], "run_queue": []}
        self._last_cpu: tuple[int, int] | None = None
        self._oom_base = [cgroups.oom_kills(i) if cgroups else 0 for i in range(nodes)]
        self.oom: NodeOutOfMemory | None = None
        self.oom_detected_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="thinwire-node-monitor",
                                        daemon=True)
        self._t0 = time.monotonic()

    @property
    def started_monotonic(self) -> float:
        """time.monotonic() at the series' 0 s."""
        return self._t0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        self.sample()  # the final values

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # never let accounting kill a run; say so once per failure
                log.exception("node accounting sample failed")

    def check_oom(self) -> NodeOutOfMemory | None:
        """Reads the OOM counters now (also used right after a node fails)."""
        if self.oom is not None or self.cgroups is None:
            return self.oom
        for node in range(self.nodes):
            kills = self.cgroups.oom_kills(node) - self._oom_base[node]
            if kills > 0:
                self.oom = NodeOutOfMemory(node, self.cgroups.memory_bytes,
                                           self.cgroups.peak_memory_bytes(node), kills)
                self.oom_detected_at = time.monotonic()
                log.error("%s", self.oom)
                break
        return self.oom

    def _sample_host(self, t: float) -> None:
        try:
            busy, total = read_host_cpu()
        except (OSError, ValueError, IndexError):
            return
        if self._last_cpu is not None and total > self._last_cpu[1]:
            self.host["t"].append(round(t, 4))
            self.host["cpu_busy"].append(
                round((busy - self._last_cpu[0]) / (total - self._last_cpu[1]), 4))
            self.host["run_queue"].append(read_run_queue())
        self._last_cpu = (busy, total)

    def sample(self) -> None:
        t = time.monotonic() - self._t0
        self._sample_host(t)
        for node in range(self.nodes):
            s = self.series[node]
            cpu = self.cgroups.cpu_seconds(node) if self.cgroups else None
            mem = self.cgroups.memory_bytes_now(node) if self.cgroups else None
            held = self.cgroups.throttling(node).get("throttled_s") if self.cgroups else None
            net = self._last_net[node]
            pid = self.pids.get(node)
            if pid is not None:
                try:
                    dev = read_net_dev(pid)
                    links = [v for k, v in sorted(dev.items()) if k.startswith("eth")]  # K
                    rx, tx = sum(v[0] for v in links), sum(v[1] for v in links)
                    net = (tx, rx, dev.get("lo", (0, 0))[1])
                    self._last_net[node] = net
                    self._last_links[node] = [v[1] for v in links]
                except (OSError, ValueError, IndexError):
                    pass  # the node's process is gone: keep its last counters
            s["t"].append(round(t, 4))
            s["cpu_seconds"].append(cpu)
            s["memory_bytes"].append(mem)
            s["tx_bytes"].append(net[0])
            s["tx_link_bytes"].append(list(self._last_links[node]))
            s["rx_bytes"].append(net[1])
            s["lo_bytes"].append(net[2])
            s["throttled_s"].append(held)
        self.check_oom()

    def report(self) -> dict:
        nodes = []
        for node in range(self.nodes):
            s = self.series[node]
            summary = self.cgroups.summary(node) if self.cgroups else {}
            mems = [m for m in s["memory_bytes"] if m is not None]
            if summary.get("peak_memory_bytes") is None and mems:
                summary["peak_memory_bytes"] = max(mems)  # v2 kernels without memory.peak
            nodes.append({"node": node, **summary,
                          "tx_bytes": s["tx_bytes"][-1] if s["tx_bytes"] else None,
                          "rx_bytes": s["rx_bytes"][-1] if s["rx_bytes"] else None,
                          "lo_bytes": s["lo_bytes"][-1] if s["lo_bytes"] else None,
                          "series": s})
        return {"interval_s": self.interval_s, "nodes": nodes, "host": self.host,
                "oom": None if self.oom is None else {
                    "node": self.oom.node, "limit_bytes": self.oom.limit_bytes,
                    "peak_bytes": self.oom.peak_bytes, "kills": self.oom.kills,
                    "detected_monotonic_s": self.oom_detected_at, "message": str(self.oom)}}
