"""`thinwire cluster check`: requested against measured bandwidth and latency of a cluster.

Builds the same network `run` builds and measures, with real traffic:
  - inter-node: a TCP bulk transfer node1 -> node0 (bandwidth) and a 1-byte TCP ping-pong (latency,
    one-way = RTT / 2), between two node namespaces, i.e. through both shaped hops and the bridge;
  - intra-node: the same inside node 0 (over its loopback, which is what ranks of a node use);
  - with --node-cpus / --node-memory / --link-classes: the CPU rate a busy loop gets per node,
    whether the memory limit is enforced and a high-class flow's rate under low-class
    congestion (see check_resources.py);
  - a gloo all-reduce over all ranks, launched exactly like a training job, checked for the
    right result, reported as time and bus bandwidth (2 (W-1)/W * bytes / time).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tempfile
from typing import IO

from thinwire.cluster.check_resources import check_resources
from thinwire.cluster.launch import new_run_id, run
from thinwire.ports import free_port
from thinwire.cluster.netns import Network
from thinwire.cluster.probes import probe_argv
from thinwire.cluster.spec import ClusterSpec, format_latency, format_rate

PROBE_PORT = 29700


def _pair(server_prefix: list[str], client_prefix: list[str], host: str, port: int,
          client_args: list[str], timeout_s: float = 120.0) -> tuple[dict, dict]:
    """Start a probe server, wait for READY, run the client; returns (server, client) results."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    server = subprocess.Popen(probe_argv(server_prefix, "serve", "--host", host, "--port",
                                         str(port)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        ready = server.stdout.readline().strip()
        if ready != "READY":
            raise RuntimeError(f"probe server did not start: {ready} {server.stderr.read()}")
        client = subprocess.run(
            probe_argv(client_prefix, *client_args, "--host", host, "--port", str(port)),
            capture_output=True, text=True, timeout=timeout_s, env=env)
        if client.returncode != 0:
            raise RuntimeError(f"probe client failed: {client.stderr.strip()}")
        out, err = server.communicate(timeout=timeout_s)
        server_result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        return server_result, json.loads(client.stdout.strip().splitlines()[-1])
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def measure_bandwidth(server_prefix: list[str], client_prefix: list[str], host: str,
                      seconds: float = 1.0, port: int = PROBE_PORT, tos: int = 0) -> float:
    """Steady-state TCP goodput client -> server, in bit/s; `tos`: the sender's IP_TOS."""
    received, _ = _pair(server_prefix, client_prefix, host, port,
                        ["bandwidth", "--seconds", str(seconds), "--tos", str(tos)])
    if not received.get("seconds"):
        raise RuntimeError(f"bandwidth probe too short to measure: {received}")
    return received["bytes"] * 8 / received["seconds"]


def measure_rtt(server_prefix: list[str], client_prefix: list[str], host: str,
                count: int = 200, port: int = PROBE_PORT) -> float:
    """Median TCP round-trip time of a 1-byte message, in seconds."""
    _, result = _pair(server_prefix, client_prefix, host, port, ["latency", "--count", str(count)])
    return result["rtt_median_s"]


def _row(path: str, metric: str, requested: float | None, measured: float, fmt) -> dict:
    return {"path": path, "metric": metric,
            "requested": fmt(requested) if requested else "unshaped",
            "measured": fmt(measured), "requested_value": requested, "measured_value": measured,
            "ratio": (measured / requested) if requested else None}


def measure_links(spec: ClusterSpec, network: Network | None, seconds: float = 1.0) -> list[dict]:
    """Bandwidth and latency rows, between nodes (if there are 2+) and inside node 0."""
    if network is not None:  # fresh namespaces: the fixed port is free
        n0, host0, port = network.exec_prefix(0), network.node_addr(0), PROBE_PORT
        n1 = network.exec_prefix(1) if spec.nodes > 1 else None
    else:  # the host's loopback, maybe shared with other runs
        n0, n1, host0 = [], ([] if spec.nodes > 1 else None), "127.0.0.1"
        port = free_port()
    shaped = network is not None
    rows = []
    if n1 is not None:
        bps = measure_bandwidth(n0, n1, host0, seconds, port)
        # one TCP flow takes link 0 only: with K links per node, the node's rate / K
        path = "inter-node" if spec.links_per_node == 1 else "inter-node, link 0"
        rows.append(_row(path, "bandwidth", spec.link_bps if shaped else None, bps,
                         format_rate))
        one_way = measure_rtt(n0, n1, host0, port=port) / 2
        rows.append(_row("inter-node", "latency (one-way)",
                         spec.inter_node_latency_s if shaped else None, one_way, format_latency))
    bps = measure_bandwidth(n0, n0, host0, seconds, port)
    rows.append(_row("intra-node", "bandwidth", spec.intra_node_bps if shaped else None, bps,
                     format_rate))
    one_way = measure_rtt(n0, n0, host0, port=port) / 2
    rows.append(_row("intra-node", "latency (one-way)", None, one_way, format_latency))
    return rows


def allreduce_numel(spec: ClusterSpec, target_s: float = 0.5) -> int:
    """A tensor size whose ring all-reduce takes about `target_s` at the inter-node rate."""
    rate = spec.link_bps if spec.shaping and spec.inter_node_bps else 10**9  # gloo: link 0
    world = spec.world_size
    factor = 2 * (world - 1) / world if world > 1 else 1.0
    numel = int(rate / 8 * target_s / factor / 4)
    return max(1 << 14, min(numel, 1 << 25))


def measure_allreduce(spec: ClusterSpec, timeout_s: float = 300.0,
                      output: IO[str] | None = None) -> dict:
    """Run a gloo all-reduce over the whole cluster; its time, bus bandwidth and correctness."""
    numel = allreduce_numel(spec)
    captured = io.StringIO()  # the ranks' lines, shown only if the probe fails
    with tempfile.TemporaryDirectory(prefix="thinwire-check-") as tmp:
        path = os.path.join(tmp, "allreduce.json")
        stats = os.path.join(tmp, "accounting.json") if spec.shaping else None
        status = run(spec, ["-m", "thinwire.cluster.probe", "allreduce", "--numel", str(numel),
                            "--iters", "3", "--json", path],
                     timeout_s=timeout_s, output=output if output is not None else captured,
                     stats_path=stats)
        if status != 0 or not os.path.exists(path):
            tail = "".join(captured.getvalue().splitlines(keepends=True)[-20:])
            raise RuntimeError(f"all-reduce probe failed with status {status}:\n{tail}")
        with open(path) as handle:
            result = json.load(handle)
        if stats is not None and os.path.exists(stats):
            # Per-node CPU, memory and link bytes over the all-reduce run, 100 ms series.
            with open(stats) as handle:
                result["accounting"] = json.load(handle)
    world = result["world_size"]
    factor = 2 * (world - 1) / world if world > 1 else 1.0
    result["busbw_bps"] = factor * result["bytes"] * 8 / result["seconds_median"]
    return result


def check(spec: ClusterSpec, seconds: float = 1.0, allreduce: bool = True) -> dict:
    """Everything `thinwire cluster check` reports, as a JSON-ready dict."""
    network = Network(spec, new_run_id()) if spec.shaping else None
    try:
        if network is not None:
            network.create()
        rows = measure_links(spec, network, seconds)
        resources = (check_resources(spec, network, seconds, PROBE_PORT + 10)
                     if network is not None else {"rows": [], "priority": {}})
    finally:
        if network is not None:
            network.teardown()
    report = {"spec": spec.describe(), "shaping": spec.shaping, "rows": rows,
              "resources": resources["rows"], "priority": resources["priority"]}
    if allreduce:
        ar = measure_allreduce(spec)
        report["allreduce"] = ar
        rows.append({"path": f"all-reduce {ar['world_size']} ranks", "metric": "bus bandwidth",
                     "requested": format_rate(spec.link_bps)  # gloo uses link 0
                     if spec.shaping and spec.inter_node_bps else "unshaped",
                     "measured": format_rate(ar["busbw_bps"]) + (" ok" if ar["correct"]
                                                                 else " WRONG RESULT"),
                     "requested_value": spec.link_bps if spec.shaping else None,
                     "measured_value": ar["busbw_bps"], "ratio": None})
    return report
