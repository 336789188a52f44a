"""`thinwire cluster check` for node budgets and priority classes: requested against measured.

  - CPU: a busy loop per node (ceil(quota) processes, all nodes at once, inside the node's
    cgroups and namespace); the CPU rate each node got = its cgroup's CPU seconds / wall time.
  - memory: inside node 0, a process allocates (and touches) 16 MiB blocks up to twice the
    limit; the limit is enforced if the kernel kills it before it gets past the limit.
  - priority: a low-class bulk TCP flow saturates node1 -> node0; a high-class flow runs on the
    same link meanwhile. Reported: the high flow's rate against the link rate and against the
    same flow alone, the low flow's rate, and the drops counted on the low class.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
import threading
import time

from thinwire.cluster import qos
from thinwire.cluster.cgroups import join as join_cgroups
from thinwire.cluster.netns import Network, sh
from thinwire.cluster.spec import ClusterSpec, format_rate, format_size

BUSY_LOOP = "while True: pass"
ALLOC_STEP = 16 * 2**20
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
    procs, before = [], []
    try:
        for node in range(spec.nodes):
            before.append(cg.cpu_seconds(node) or 0.0)
            for _ in range(workers):
                procs.append(subprocess.Popen(
                    network.exec_prefix(node) + [sys.executable, "-c", BUSY_LOOP],
                    preexec_fn=functools.partial(join_cgroups, cg.procs_files(node))))
        start = time.monotonic()
        time.sleep(seconds)
        used = [(cg.cpu_seconds(n) or 0.0) - before[n] for n in range(spec.nodes)]
        wall = time.monotonic() - start
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


def _flow(network: Network, port: int, seconds: float, tos: int, results: dict, key: str):
    from thinwire.cluster.check import measure_bandwidth
    results[key] = measure_bandwidth(network.exec_prefix(0), network.exec_prefix(1),
                                     network.node_addr(0), seconds, port, tos=tos)


def measure_priority(network: Network, seconds: float, port: int) -> tuple[list[dict], dict]:
    """High-class flow alone, then again while a low-class bulk flow saturates the link."""
    spec = network.spec
    classes = spec.link_classes
    if not classes or spec.nodes < 2:
        return [], {}
    link = spec.inter_node_bps
    high, low = qos.tos_for_class(0, classes), qos.tos_for_class(classes - 1, classes)
    alone: dict = {}
    _flow(network, port, seconds, high, alone, "high")
    drops_before = _low_class_drops(network, classes)
    both: dict = {}
    low_thread = threading.Thread(target=_flow, args=(network, port + 1, 2 * seconds + 1.0,
                                                      low, both, "low"))
    low_thread.start()
    time.sleep(seconds / 2 + 0.5)  # the low flow has filled its queue
    _flow(network, port, seconds, high, both, "high")
    low_thread.join()
    drops = _low_class_drops(network, classes) - drops_before
    detail = {"link_bps": link, "high_alone_bps": alone["high"], "high_bps": both["high"],
              "low_bps": both["low"], "low_class_drops": drops, "classes": classes}
    rows = [
        _row("1->0", "high class under low-class load", format_rate(link) if link else "-",
             format_rate(both["high"]), both["high"] / link if link else None,
             requested_value=link, measured_value=both["high"]),
        _row("1->0", "high class vs alone", format_rate(alone["high"]),
             format_rate(both["high"]), both["high"] / alone["high"]),
        _row("1->0", "low class (congesting)", "rest", format_rate(both["low"]),
             both["low"] / link if link else None, drops=drops),
        _row("1->0", "low class drops (packets)", "-", str(drops), None),
    ]
    return rows, detail


def _low_class_drops(network: Network, classes: int) -> int:
    out = sh("tc", "-n", network.node_ns(1), "-s", "class", "show", "dev", "eth0").stdout
    return qos.parse_class_stats(out, classes)[-1]["dropped"] or 0


def check_resources(spec: ClusterSpec, network: Network, seconds: float, port: int) -> dict:
    """The resource rows of `thinwire cluster check` (empty when nothing was requested)."""
    rows = measure_cpu(network, max(seconds, 1.0)) + measure_memory(network)
    prio_rows, prio = measure_priority(network, max(seconds, 1.0), port)
    return {"rows": rows + prio_rows, "priority": prio}
