"""`thinwire bench cluster-resources`: node CPU quotas, OOM reporting delay, priority classes.

Three measurements on the emulated cluster (root), each repeated, the median reported:
  - cpu: 2 nodes, a busy loop on each at once; CPU rate / quota from the node cgroups'
    accounting, at each requested quota (default 0.25, 0.5, 1.0 cores per node);
  - oom: node 1 of a 2-node run allocates past its limit; delay from the kernel's kill (seen by
    a separate 5 ms poller of the cgroup's OOM counter) to the launcher's detection and to the
    NodeOutOfMemory error reaching the caller (after the whole run is stopped and cleaned up);
  - priority: a high-class TCP bulk flow against a low-class flow (a UDP flood by default) into
    one switch port (3 nodes; default 100mbit, 2 classes): the high class's wire rate against
    the link rate, and the low class's drops.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from thinwire.bench.report import format_table, save_if_asked

COLUMNS = ("measure", "setting", "median", "target", "met", "values")
HOG = textwrap.dedent("""
    import os, time
    if os.environ["GROUP_RANK"] == "1":
        blocks = [bytearray(16 << 20) for _ in range(4096)]
    time.sleep(120)
""")
POLL_S = 0.005


class KillWatcher:
    """Polls every node cgroup's OOM-kill counter every 5 ms, independently of the launcher:
    the time of the kernel's kill to within 5 ms, to time the launcher's report against."""

    def __init__(self):
        from thinwire.cluster.cgroups import discover

        h = discover()
        self.parent = h.dirs["memory"] if h.version == 1 else h.dirs["unified"]
        self.counter = "memory.oom_control" if h.version == 1 else "memory.events"
        self.killed_at: dict[str, float] = {}  # cgroup name -> monotonic time of first kill
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            for path in self.parent.glob("thinwire-*-n*"):
                if path.name in self.killed_at:
                    continue
                try:
                    text = (path / self.counter).read_text()
                except OSError:
                    continue
                m = re.search(r"^oom_kill (\d+)", text, re.M)
                if m and int(m.group(1)) > 0:
                    self.killed_at[path.name] = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def bench_cpu(quotas: list[float], repeats: int, seconds: float) -> list[dict]:
    from thinwire.cluster import ClusterSpec
    from thinwire.cluster.check_resources import measure_cpu
    from thinwire.cluster.launch import new_run_id
    from thinwire.cluster.netns import Network

    rows = []
    for quota in quotas:
        ratios = []
        for _ in range(repeats):
            network = Network(ClusterSpec(2, 1, node_cpus=quota), new_run_id())
            try:
                network.create()
                ratios += [r["ratio"] for r in measure_cpu(network, seconds)]
            finally:
                network.teardown()
        median = statistics.median(ratios)
        rows.append({"measure": "CPU rate / quota (2 nodes)", "setting": f"{quota:g} cores",
                     "median": median, "target": "within 10%", "met": abs(median - 1) <= 0.10,
                     "values": [round(r, 3) for r in ratios]})
    return rows


def bench_oom(repeats: int, memory: str = "160m") -> list[dict]:
    from thinwire.cluster import ClusterSpec, run
    from thinwire.cluster.accounting import NodeOutOfMemory

    detect, report = [], []
    watcher = KillWatcher()
    with tempfile.TemporaryDirectory(prefix="thinwire-bench-oom-") as tmp:
        script = Path(tmp) / "hog.py"
        script.write_text(HOG)
        for i in range(repeats):
            stats = Path(tmp) / f"stats{i}.json"
            try:
                with open(os.devnull, "w") as sink:
                    run(ClusterSpec(2, 1, node_memory=memory), [str(script)], timeout_s=120,
                        output=sink, stats_path=str(stats))
                raise RuntimeError("the over-limit node was not killed")
            except NodeOutOfMemory:
                raised = time.monotonic()
            result = json.loads(stats.read_text())
            killed = watcher.killed_at.get(f"thinwire-{result['run_id']}-n1")
            if killed is None:
                continue  # the kill was too quick for the poller to see the cgroup
            detect.append(result["oom"]["detected_monotonic_s"] - killed)
            report.append(raised - killed)
    watcher.stop()
    if not detect:
        return [{"measure": "OOM report delay", "setting": memory, "median": None,
                 "target": "<= 2 s", "met": None, "values": "no kill seen by the poller"}]
    return [{"measure": "OOM kill -> detected", "setting": memory,
             "median": statistics.median(detect), "target": "<= 2 s",
             "met": statistics.median(detect) <= 2, "values": [round(d, 3) for d in detect]},
            {"measure": "OOM kill -> error raised (after cleanup)", "setting": memory,
             "median": statistics.median(report), "target": "<= 2 s",
             "met": statistics.median(report) <= 2, "values": [round(d, 3) for d in report]}]


def bench_priority(rate: str, classes: int, queues: tuple[int, ...], repeats: int,
                   seconds: float, nodes: int = 3,
                   low: str = "udp") -> tuple[list[dict], list[dict]]:
    from thinwire.cluster import ClusterSpec
    from thinwire.cluster.check_resources import measure_priority
    from thinwire.cluster.launch import new_run_id
    from thinwire.cluster.netns import Network

    spec = ClusterSpec(nodes, 1, inter_node_bandwidth=rate, link_classes=classes,
                       class_queue=queues)
    details = []
    for _ in range(repeats):
        network = Network(spec, new_run_id())
        try:
            network.create()
            details.append(measure_priority(network, seconds, 29730, low_udp=low == "udp")[1])
        finally:
            network.teardown()
    share = [d["high_bps"] / d["link_bps"] for d in details]
    alone = [d["high_alone_bps"] / d["link_bps"] for d in details]
    drops = [d["low_class_drops"] for d in details]
    low_share = [d["low_bps"] / d["link_bps"] for d in details]
    setting = (f"{rate}, {classes} classes, queues {'/'.join(map(str, queues))}, low {low}, "
               f"{details[0]['where']}")
    rows = [{"measure": "high class / link, low class saturating", "setting": setting,
             "median": statistics.median(share), "target": ">= 0.90",
             "met": statistics.median(share) >= 0.9, "values": [round(s, 3) for s in share]},
            {"measure": "high class / link, alone", "setting": setting,
             "median": statistics.median(alone), "target": "-", "met": None,
             "values": [round(s, 3) for s in alone]},
            {"measure": "low class / link, during", "setting": setting,
             "median": statistics.median(low_share), "target": "-", "met": None,
             "values": [round(s, 4) for s in low_share]},
            {"measure": "low class drops (packets)", "setting": setting,
             "median": statistics.median(drops), "target": "> 0, counted",
             "met": min(drops) > 0, "values": drops}]
    return rows, details


def _main(args) -> int:
    from thinwire.cluster import missing_requirements

    missing = missing_requirements()
    if missing:
        print("thinwire: error: bench cluster-resources needs the shaped cluster; missing: "
              + ", ".join(missing))
        return 2
    rows, result = [], {"setting": vars(args).copy()}
    result["setting"].pop("func", None)
    if "cpu" in args.only:
        rows += bench_cpu(args.quotas, args.repeats, args.seconds)
    if "oom" in args.only:
        rows += bench_oom(args.repeats)
    if "priority" in args.only:
        prio_rows, result["priority_runs"] = bench_priority(
            args.rate, args.classes, tuple(args.class_queue), args.repeats, args.seconds,
            args.prio_nodes, args.low)
        rows += prio_rows
    result["rows"] = rows
    print(format_table(rows, COLUMNS))
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "cluster-resources", help="node CPU quotas, OOM report delay, link priority classes")
    parser.add_argument("--only", nargs="+", choices=("cpu", "oom", "priority"),
                        default=["cpu", "oom", "priority"], help="which measurements to run")
    parser.add_argument("--quotas", type=float, nargs="+", default=[0.25, 0.5, 1.0],
                        help="CPU quotas to measure, in cores per node")
    parser.add_argument("--rate", default="100mbit", help="link rate of the priority measurement")
    parser.add_argument("--classes", type=int, default=2, help="priority classes on the links")
    parser.add_argument("--class-queue", type=int, nargs="+", default=[100, 8],
                        help="packets per class, highest first")
    parser.add_argument("--prio-nodes", type=int, default=3,
                        help="3+: the flows meet at a switch port (from nodes 1 and 2); "
                             "2: at the sender's own egress")
    parser.add_argument("--low", choices=("udp", "tcp"), default="udp",
                        help="the low-class flow: a UDP flood (saturates) or TCP (backs off)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="repetitions of each measurement (the median is reported)")
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="measuring window of each CPU / priority measurement")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.set_defaults(func=_main)
