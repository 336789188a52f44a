"""`thinwire cluster check` for node budgets and priority classes: requested against measured.

  - CPU: a busy loop per node (ceil(quota) processes, all nodes at once, inside the node's
    cgroups and namespace); the CPU rate each node got = its cgroup's CPU seconds / wall time.
  - memory: inside node 0, a process allocates (and touches) 16 MiB blocks up to twice the
    limit; the limit is enforced if the kernel kills it before it gets past the limit.
  - priority: a low-class flow (a UDP flood, which does not back off; or TCP) saturates
    node1 -> node0; a high-class TCP bulk flow to node 0
    runs meanwhile, from node 2 when there are 3+ nodes (both meet at the switch port toward
    node 0, a congested switch) or else from node 1 (they meet at node 1's egress). Both rates
    come from the classes' byte counters of that queue over the same window. Reported: the high class's rate against the link rate and alone, the low
    class's rate, and the drops counted per class.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
import tempfile
import time

from thinwire.cluster import qos
from thinwire.cluster.cgroups import join as join_cgroups
from thinwire.cluster.netns import Network, sh
from thinwire.cluster.probes import PROBE_SCRIPT
from thinwire.cluster.spec import ClusterSpec, format_rate, format_size

BUSY_LOOP = "while True: pass"
CPU_WARMUP_S = 1.0
ALLOC_STEP = 16 * 2**20
FLOW_MAX_S = 300.0  # a flow's upper bound; it is stopped through its stop file long before
ALLOCATE = (
    "import sys\n"
    "blocks, step, limit = [], int(sys.argv[1]), int(sys.argv[2])\n"
    "while len(blocks) * step < limit:\n"
    "    b = bytearray(step)\n"
    "    b[::4096] = b'\\x01' * len(b[::4096])  # touch every page: really resident\n"
    "    blocks.append(b)\n"
    "    print(len(blocks) * step, flush=True)\n"
)


def _row(node, metric: str, requested: str, measured: str, ratio: float | None, **values) -> dict:
    return {"node": node, "metric": metric, "requested": requested, "measured": measured,
            "ratio": ratio, **values}


def measure_cpu(network: Network, seconds: float) -> list[dict]:
    """Every node busy at once for `seconds`; CPU rate per node from its cgroup's accounting."""
    cg, spec = network.node_cgroups, network.spec
    if cg is None or spec.node_cpus is None:
        return []
    workers = max(1, math.ceil(spec.node_cpus))
    procs = []
    try:
        for node in range(spec.nodes):
            for _ in range(workers):
                procs.append(subprocess.Popen(
                    network.exec_prefix(node) + [sys.executable, "-c", BUSY_LOOP],
                    preexec_fn=functools.partial(join_cgroups, cg.procs_files(node))))
        # The window opens once every loop runs (starting them takes a while on a busy host),
        # and the counters are read at its two ends only.
        time.sleep(CPU_WARMUP_S)
        before, start = [cg.cpu_seconds(n) or 0.0 for n in range(spec.nodes)], time.monotonic()
        time.sleep(seconds)
        after, wall = [cg.cpu_seconds(n) or 0.0 for n in range(spec.nodes)], \
            time.monotonic() - start
        used = [a - b for a, b in zip(after, before)]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    rows = []
    for node, cpu_s in enumerate(used):
        rate = cpu_s / wall
        rows.append(_row(node, "CPU rate (busy loop)", f"{spec.node_cpus:g} cores",
                         f"{rate:.3f} cores", rate / spec.node_cpus,
                         requested_value=spec.node_cpus, measured_value=rate,
                         **cg.throttling(node)))
    return rows


def measure_memory(network: Network, timeout_s: float = 60.0) -> list[dict]:
    """Node 0 allocates up to twice its limit: enforced if it is killed before passing it."""
    cg, spec = network.node_cgroups, network.spec
    if cg is None or spec.node_memory_bytes is None:
        return []
    limit = spec.node_memory_bytes
    kills_before = cg.oom_kills(0)
    proc = subprocess.run(
        network.exec_prefix(0) + [sys.executable, "-c", ALLOCATE, str(ALLOC_STEP), str(2 * limit)],
        capture_output=True, text=True, timeout=timeout_s,
        preexec_fn=functools.partial(join_cgroups, cg.procs_files(0)))
    lines = proc.stdout.split()
    reached = int(lines[-1]) if lines else 0
    kills = cg.oom_kills(0) - kills_before
    enforced = proc.returncode != 0 and reached < limit and kills > 0
    peak = cg.peak_memory_bytes(0)
    return [_row(0, "memory limit enforced", format_size(limit),
                 f"{'yes' if enforced else 'NO'}: allocated {format_size(reached)} then "
                 f"{'killed' if proc.returncode < 0 else f'exit {proc.returncode}'}, "
                 f"peak {format_size(peak or 0)}", None, requested_value=limit,
                 measured_value=reached, enforced=enforced, oom_kills=kills, peak_bytes=peak)]


class _Flow:
    """A bulk flow `sender` -> node 0 in one priority class, running until its stop file
    exists: TCP (backs off under loss) or a UDP flood (does not: it saturates)."""

    def __init__(self, network: Network, port: int, tos: int, stop_file: str, sender: int = 1,
                 udp: bool = False):
        probe = [sys.executable, PROBE_SCRIPT]
        host = network.node_addr(0)
        self.server = self.client = None
        if not udp:
            self.server = subprocess.Popen(
                network.exec_prefix(0) + probe + ["serve", "--host", host, "--port", str(port)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            if self.server.stdout.readline().strip() != "READY":
                self.stop()
                raise RuntimeError(f"priority probe: the server on port {port} did not start")
        self.client = subprocess.Popen(
            network.exec_prefix(sender) + probe + [
                "flood" if udp else "bandwidth", "--host", host, "--port", str(port),
                "--seconds", str(FLOW_MAX_S), "--tos", str(tos), "--stop-file", stop_file],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> None:
        for proc in (self.client, self.server):
            if proc is None:
                continue
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _congested_port(network: Network) -> tuple[str, str, str]:
    """(namespace, device, label) of the queue the priority flows contend for: with 3+ nodes
    the switch port toward node 0, fed by two senders (a congested switch, where a sender's
    own TCP cannot hold its packets back); with 2 nodes node 1's own egress."""
    if network.spec.nodes >= 3:
        return network.switch_ns, "p0", "1,2->0 at the switch"
    return network.node_ns(1), "eth0", "1->0 at the sender"


def _class_counters(network: Network, classes: int) -> list[dict]:
    ns, dev, _ = _congested_port(network)
    out = sh("tc", "-n", ns, "-s", "class", "show", "dev", dev).stdout
    return qos.parse_class_stats(out, classes)


def _wait_flowing(network: Network, classes: int, k: int, timeout_s: float = 60.0) -> None:
    """Until class `k` carries traffic (the flow's processes start slowly on a busy machine)."""
    deadline = time.monotonic() + timeout_s
    first = _class_counters(network, classes)[k]["sent_bytes"] or 0
    while (_class_counters(network, classes)[k]["sent_bytes"] or 0) - first < 10 * 2**20:
        if time.monotonic() > deadline:
            raise RuntimeError(f"priority probe: no traffic in class {k} after {timeout_s:g} s")
        time.sleep(0.1)


def _rates(network: Network, classes: int, seconds: float) -> tuple[list[float], list[int]]:
    """Wire rate (bit/s) and drops of every class over the same `seconds` window."""
    before, t0 = _class_counters(network, classes), time.monotonic()
    time.sleep(seconds)
    after, t1 = _class_counters(network, classes), time.monotonic()
    rates = [((a["sent_bytes"] or 0) - (b["sent_bytes"] or 0)) * 8 / (t1 - t0)
             for a, b in zip(after, before)]
    drops = [(a["dropped"] or 0) - (b["dropped"] or 0) for a, b in zip(after, before)]
    return rates, drops


def measure_priority(network: Network, seconds: float, port: int,
                     low_udp: bool = True) -> tuple[list[dict], dict]:
    """A high-class flow alone, then with a low-class bulk flow on the same link (node1 ->
    node0), both measured on the class counters of node 1's egress over one window."""
    spec = network.spec
    classes = spec.link_classes
    if not classes or spec.nodes < 2:
        return [], {}
    link = spec.inter_node_bps
    high, low = qos.tos_for_class(0, classes), qos.tos_for_class(classes - 1, classes)
    high_sender = 2 if spec.nodes >= 3 else 1
    path = _congested_port(network)[2]
    with tempfile.TemporaryDirectory(prefix="thinwire-prio-") as tmp:
        flows = []
        try:
            stop_alone = os.path.join(tmp, "stop-alone")
            flows.append(_Flow(network, port, high, stop_alone, sender=high_sender))
            _wait_flowing(network, classes, 0)
            alone, _ = _rates(network, classes, seconds)
            open(stop_alone, "w").close()
            flows.pop().stop()
            stop = os.path.join(tmp, "stop")
            flows.append(_Flow(network, port + 1, low, stop, udp=low_udp))
            _wait_flowing(network, classes, classes - 1)
            congestion_start = _class_counters(network, classes)
            flows.append(_Flow(network, port + 2, high, stop, sender=high_sender))
            _wait_flowing(network, classes, 0)
            rates, _ = _rates(network, classes, seconds)
            # Drops over the whole congestion episode: the low queue overflows when the high
            # flow arrives, then the starved low flow's TCP backs off.
            drops = [(a["dropped"] or 0) - (b["dropped"] or 0) for a, b in
                     zip(_class_counters(network, classes), congestion_start)]
        finally:
            for name in ("stop-alone", "stop"):
                open(os.path.join(tmp, name), "w").close()
            for flow in flows:
                flow.stop()
    detail = {"link_bps": link, "classes": classes, "window_s": seconds, "where": path,
              "low_flow": "udp flood" if low_udp else "tcp",
              "high_alone_bps": alone[0], "high_bps": rates[0], "low_bps": rates[-1],
              "high_class_drops": drops[0], "low_class_drops": drops[-1],
              "note": "wire rates (with headers) from the classes' byte counters of the contended "
                      "queue, over one window while both flows ran; drops over the whole time "
                      "the high flow ran"}
    rows = [
        _row(path, "high class under low-class load", format_rate(link) if link else "-",
             format_rate(rates[0]), rates[0] / link if link else None,
             requested_value=link, measured_value=rates[0]),
        _row(path, "high class alone", format_rate(link) if link else "-",
             format_rate(alone[0]), alone[0] / link if link else None),
        _row(path, "low class (congesting)", "what is left", format_rate(rates[-1]),
             rates[-1] / link if link else None),
        _row(path, "drops high / low class (packets)", "-", f"{drops[0]} / {drops[-1]}",
             None),
    ]
    return rows, detail


def check_resources(spec: ClusterSpec, network: Network, seconds: float, port: int) -> dict:
    """The resource rows of `thinwire cluster check` (empty when nothing was requested)."""
    rows = measure_cpu(network, max(seconds, 1.0)) + measure_memory(network)
    prio_rows, prio = measure_priority(network, max(seconds, 1.0), port)
    return {"rows": rows + prio_rows, "priority": prio}
