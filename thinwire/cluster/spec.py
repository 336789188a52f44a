"""What an emulated cluster looks like: `ClusterSpec` and the parsing of rates, latencies, loss.

All checks happen here, before anything touches the system, so that a bad argument fails with a
message naming the parameter, the value and what is allowed - and nothing needs cleaning up.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

# Decimal units, as tc reads them ("mbit" = 10**6 bit/s). tc's "bps" means *bytes* per second,
# which is a classic source of 8x mistakes, so it is deliberately not accepted.
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
LATENCY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}

MIN_RATE_BPS = 10**5           # 100kbit: below this HTB's quanta make the rate coarse
MAX_RATE_BPS = 100 * 10**9     # 100gbit: far above what a veth pair can carry anyway
MAX_LATENCY_S = 10.0
MAX_NODES = 250                # node i gets 10.77.0.(i+1) on a /24
MAX_RANKS_PER_NODE = 256
MIN_NODE_MEMORY = 64 * 2**20   # below this a torchrun agent plus one rank cannot even start
# cgroup v1 takes a limit up to LONG_MAX rounded down to a page; a larger number wrapped to a
# tiny limit there (1e30g: "node 0 exceeded its memory limit", its peak 0 B)
MAX_NODE_MEMORY = 2**62
SIZE_UNITS = {"b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20,
              "mib": 2**20, "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40,
              "tib": 2**40}
MIN_LINK_CLASSES, MAX_LINK_CLASSES = 2, 8  # 3 precedence bits of the TOS byte: at most 8
MAX_CLASS_QUEUE = 100_000
DEFAULT_CLASS_QUEUE = 1000
MIN_LINK_MTU, MAX_LINK_MTU = 1280, 9000  # IPv6's minimum .. the usual jumbo frame
MAX_LINKS_PER_NODE = 8         # link k of node i is 10.77.k.(i+1): k = 0..7 (10.77.0.0/21)
MAX_SCHEDULE_STEPS = 1000
MAX_SCHEDULE_S = 7 * 86400.0   # a week: beyond any run the emulator is for
SCHEDULE_TIME_UNITS = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}

_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z%]*)\s*$", re.IGNORECASE)


def _split(param: str, value: object, example: str, units: str) -> tuple[float, str]:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{param} must be a string like {example} ({units}), got {value!r}")
    match = _NUMBER_UNIT.match(value)
    if not match:
        raise ValueError(f"{param} must be a number followed by a unit, like {example} "
                         f"({units}), got {value!r}")
    return float(match.group(1)), match.group(2).lower()


def parse_rate(value: str, param: str = "bandwidth") -> int:
    """'100mbit' -> 100_000_000 (bits per second). Units: bit, kbit, mbit, gbit, tbit."""
    units = "units: " + ", ".join(RATE_UNITS)
    number, unit = _split(param, value, "'100mbit' or '1gbit'", units)
    if unit not in RATE_UNITS:
        what = f"unknown unit {unit!r}" if unit else "missing unit"
        raise ValueError(f"{param}: {what} in {value!r}; allowed {units}")
    bps = number * RATE_UNITS[unit]
    if not (MIN_RATE_BPS <= bps <= MAX_RATE_BPS):
        raise ValueError(f"{param} must be between {format_rate(MIN_RATE_BPS)} and "
                         f"{format_rate(MAX_RATE_BPS)}, got {value!r}")
    return int(round(bps))


def parse_latency(value: str, param: str = "latency") -> float:
    """'0.5ms' -> 0.0005 (seconds). Units: us, ms, s."""
    units = "units: " + ", ".join(LATENCY_UNITS)
    number, unit = _split(param, value, "'0.5ms' or '20ms'", units)
    if unit not in LATENCY_UNITS:
        what = f"unknown unit {unit!r}" if unit else "missing unit"
        raise ValueError(f"{param}: {what} in {value!r}; allowed {units}")
    seconds = number * LATENCY_UNITS[unit]
    if seconds > MAX_LATENCY_S:
        raise ValueError(f"{param} must be between 0 and {MAX_LATENCY_S:g}s, got {value!r}")
    return seconds


def parse_loss(value: str | float | int, param: str = "loss") -> float:
    """'1%', '1' or 1.0 -> 1.0 (percent of packets dropped on each shaped hop), in [0, 100)."""
    if isinstance(value, bool):
        raise ValueError(f"{param} must be a percentage in [0, 100), got {value!r}")
    if isinstance(value, (int, float)):
        percent = float(value)
    else:
        text = value.strip().rstrip("%") if isinstance(value, str) else None
        try:
            percent = float(text)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"{param} must be a percentage like '0.1%' or '1', "
                             f"in [0, 100), got {value!r}") from None
    if not (math.isfinite(percent) and 0.0 <= percent < 100.0):
        raise ValueError(f"{param} must be a percentage in [0, 100), got {value!r}")
    return percent


def parse_size(value: str | int, param: str = "node_memory") -> int:
    """'512m', '2GiB', '1g' or a byte count -> bytes. Binary units (m = MiB), as cgroups use."""
    if isinstance(value, bool):
        raise ValueError(f"{param} must be a size like '512m' or '2g', got {value!r}")
    if isinstance(value, int):
        return value
    units = "units: b, k, m, g, t (binary: m = MiB; 'mb', 'mib' also accepted)"
    number, unit = _split(param, value, "'512m' or '2g'", units)
    if unit not in SIZE_UNITS:
        what = f"unknown unit {unit!r}" if unit else "missing unit"
        raise ValueError(f"{param}: {what} in {value!r}; allowed {units}")
    size = number * SIZE_UNITS[unit]
    if not math.isfinite(size):  # '1e400g'
        raise ValueError(f"{param} must be a finite size, got {value!r}")
    return int(size)


SCHEDULE_CLOCKS = ("job", "training")
MAX_RESTARTS = 100  # torchrun's restarts of a job (a schedule of failures, not a retry loop)
# the file a rank touches when training begins (schedule_clock "training"), in the launcher's env
TRAINING_STARTED_ENV = "THINWIRE_TRAINING_STARTED"


def parse_bandwidth_schedule(value: str, param: str = "bandwidth_schedule"
                             ) -> tuple[tuple[float, int], ...]:
    """'0s:200mbit,40s:25mbit,80s:200mbit' -> ((0.0, 200_000_000), (40.0, 25_000_000), ...):
    from each time on (seconds after the job starts) the inter-node links run at that rate.
    Times strictly increasing, each >= 0; rates as parse_rate takes them."""
    example = "'0s:200mbit,40s:25mbit,80s:200mbit'"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{param} must be a string like {example}, got {value!r}")
    steps: list[tuple[float, int]] = []
    for item in value.split(","):
        time_text, sep, rate_text = item.strip().partition(":")
        if not sep:
            raise ValueError(f"{param}: every entry must be TIME:RATE (e.g. 40s:25mbit), got "
                             f"{item.strip()!r} in {value!r}")
        seconds = _schedule_time(time_text, param)
        if steps and not seconds > steps[-1][0]:
            raise ValueError(f"{param}: times must increase, got {time_text.strip()!r} after "
                             f"{steps[-1][0]:g}s in {value!r}")
        steps.append((seconds, parse_rate(rate_text.strip(), f"{param} rate")))
    if len(steps) > MAX_SCHEDULE_STEPS:
        raise ValueError(f"{param}: at most {MAX_SCHEDULE_STEPS} entries, got {len(steps)}")
    return tuple(steps)


def _schedule_time(text: str, param: str) -> float:
    if text.strip().startswith("-"):
        raise ValueError(f"{param}: time {text.strip()!r} is negative; times are seconds "
                         f"after the job starts, >= 0 (like '0s' or '40s')")
    number, unit = _split(f"{param} time", text, "'40s'", "units: " + ", ".join(SCHEDULE_TIME_UNITS))
    if unit not in SCHEDULE_TIME_UNITS:
        raise ValueError(f"{param}: time {text.strip()!r} " + (
            f"has an unknown unit {unit!r}" if unit else "needs a unit")
            + f"; units: {', '.join(SCHEDULE_TIME_UNITS)}")
    seconds = number * SCHEDULE_TIME_UNITS[unit]
    if not seconds <= MAX_SCHEDULE_S:
        raise ValueError(f"{param}: time {text.strip()!r} is past {MAX_SCHEDULE_S:g} s")
    return seconds


def parse_failure_schedule(value: str, nodes: int, param: str = "failure_schedule"
                           ) -> tuple[tuple[float, int, str], ...]:
    """'node1@30s,restart@45s;node2@90s' -> ((30.0, 1, 'kill'), (45.0, 1, 'restart'),
    (90.0, 2, 'kill')): at each time (seconds after the job starts) every process of the node
    is killed (SIGKILL), or the node's launcher is started again. One ';'-separated group per
    outage: ``nodeN@TIME`` and optionally ``restart@LATER``. A node is not killed while it is
    down, nor restarted while it runs."""
    example = "'node1@30s,restart@45s;node2@90s'"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{param} must be a string like {example}, got {value!r}")
    events: list[tuple[float, int, str]] = []
    for group in value.split(";"):
        items = [item.strip() for item in group.split(",")]
        head, sep, when = items[0].partition("@")
        if not (sep and head.startswith("node") and head[4:].isdigit()) or len(items) > 2:
            raise ValueError(f"{param}: every group must be nodeN@TIME[,restart@LATER] (e.g. "
                             f"{example}), got {group.strip()!r}")
        node = int(head[4:])
        if node >= nodes:
            raise ValueError(f"{param}: {head} does not exist (nodes are node0..node"
                             f"{nodes - 1}), in {group.strip()!r}")
        killed = _schedule_time(when, param)
        events.append((killed, node, "kill"))
        if len(items) == 2:
            word, sep, later = items[1].partition("@")
            if not sep or word != "restart":
                raise ValueError(f"{param}: after {items[0]!r} only restart@TIME may follow, "
                                 f"got {items[1]!r}")
            restarted = _schedule_time(later, param)
            if not restarted > killed:
                raise ValueError(f"{param}: {head} restarts at {restarted:g}s, not after it is "
                                 f"killed at {killed:g}s")
            events.append((restarted, node, "restart"))
    if len(events) > MAX_SCHEDULE_STEPS:
        raise ValueError(f"{param}: at most {MAX_SCHEDULE_STEPS} events, got {len(events)}")
    events.sort(key=lambda e: (e[0], e[2] != "restart"))  # a restart before a kill at one time
    down: dict[int, float] = {}
    for at, node, action in events:
        if action == "kill":
            if node in down:
                raise ValueError(f"{param}: node{node} is killed at {at:g}s while it is down "
                                 f"(since {down[node]:g}s, not restarted yet): the outages "
                                 f"overlap")
            down[node] = at
        else:
            down.pop(node)
    return tuple(events)


def parse_node_cpus(value: float | str, param: str = "node_cpus") -> float:
    """CPU cores per node as a positive number no larger than the machine's core count."""
    try:
        cpus = float(value) if not isinstance(value, bool) else float("nan")
    except (TypeError, ValueError):
        cpus = float("nan")
    available = machine_cpus()
    if not (math.isfinite(cpus) and 0.01 <= cpus <= available):
        raise ValueError(f"{param} must be a number of CPU cores between 0.01 and {available} "
                         f"(this machine's cores), got {value!r}")
    return cpus


def machine_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def format_size(nbytes: float) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            return f"{nbytes / factor:.4g}{unit}"
    return f"{nbytes:.0f}B"


def format_rate(bps: float) -> str:
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bps >= RATE_UNITS[unit]:
            return f"{bps / RATE_UNITS[unit]:.4g}{unit}"
    return f"{bps:.4g}bit"


def format_latency(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.4g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.4g}ms"
    return f"{seconds * 1e6:.4g}us"


def _check_count(name: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise ValueError(f"{name} must be an integer between 1 and {maximum}, got {value!r}")


@dataclass(frozen=True)
class ClusterSpec:
    """An emulated cluster: `nodes` machines with `ranks_per_node` ranks each.

    inter_node_bandwidth: each node's link to the switch, both directions ('1gbit'); None = unshaped.
    inter_node_latency: one-way node-to-node latency ('0.5ms'); half of it on each hop.
    intra_node_bandwidth: rate of each node's loopback, i.e. between ranks of one node.
    loss: percent of packets dropped on each shaped hop of the inter-node path.
    shaping: False runs the same launch on 127.0.0.1 without namespaces or tc (no root needed).
    node_cpus: CPU cores each node may use (CFS quota), e.g. 0.5; None = no limit.
    node_memory: hard memory limit of each node, all its processes together, swap off ('512m').
    best_effort_limits: without cgroup controllers, warn and run without limits instead of failing.
    link_classes: number of strict-priority classes on every shaped link (2..8; None = one FIFO).
        Traffic picks its class by the IP precedence bits of its TOS byte: see
        `thinwire.cluster.qos.tos_for_class`; unmarked traffic is in the lowest class.
    class_queue: queue length in packets of each class (one number for all, or one per class,
        highest class first); default 1000.
    links_per_node: K links from every node to the switch (default 1), each its own rail
        (link k of every node on bridge k, subnet 10.77.k.0/24); each link is shaped at
        inter_node_bandwidth / K, so a node's capacity does not change with K, only how it is
        split. Ordinary traffic (gloo) uses link 0; dlcp sprays its datagrams over all K.
    link_mtu: MTU of every node link (default 1500, Ethernet's; 9000 is a jumbo frame, as
        public clouds offer inside a VPC, e.g. 9001 on AWS).
    failure_schedule: nodes that vanish and come back while the job runs,
        'node1@30s,restart@45s;node2@90s': at each time every process of the node is killed
        (SIGKILL, as a reclaimed spot instance), or its launcher started again; a scheduled
        death does not end the run (the surviving nodes decide its status).
    bandwidth_schedule: the inter-node rate over time, '0s:200mbit,40s:25mbit,80s:200mbit':
        from each time on (seconds after the job starts) every node's links run at that rate
        (split over its links as inter_node_bandwidth is); the links start at
        inter_node_bandwidth, which must be set. Each change is logged with its time.
    schedule_clock: what the schedules' times count from: "job" (the nodes' launchers have
        started) or "training" (the job's rank 0 begins its first training step, after its
        set-up, compute probe and, for --algorithm auto, its choice; events at 0 s still apply
        at the job's start). "training" lets runs whose start-up differs meet a link change
        at the same point of their training.
    fault_tolerant: every node its own torchrun world (one node, its ranks), the nodes joined
        by a coordinator the launcher runs beside them (torchft's Lighthouse and a job store:
        `thinwire.cluster.coordinator`), so that a node can vanish and come back while the
        others train on (`thinwire.ft.per_step`). Ranks read the coordinator's addresses and
        their node's index from the environment.
    max_restarts: how many times torchrun may restart the job's workers after a failure (its
        ``--max-restarts``), with an elastic rendezvous (c10d) held by the coordinator beside
        the nodes instead of the static one at node 0: the checkpoint-restart way through a
        lost node (every node restarts its ranks, they wait for the lost node's launcher to
        come back, and resume from the job's checkpoint). 0: a failure ends the job.
    """

    nodes: int
    ranks_per_node: int
    inter_node_bandwidth: str | None = "1gbit"
    inter_node_latency: str | None = None
    intra_node_bandwidth: str | None = None
    loss: str | float | None = None
    shaping: bool = True
    node_cpus: float | None = None
    node_memory: str | int | None = None
    best_effort_limits: bool = False
    link_classes: int | None = None
    class_queue: int | tuple[int, ...] | None = None
    links_per_node: int = 1
    link_mtu: int = 1500
    bandwidth_schedule: str | None = None
    failure_schedule: str | None = None
    schedule_clock: str = "job"
    fault_tolerant: bool = False
    max_restarts: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.class_queue, list):  # frozen dataclass: keep it hashable
            object.__setattr__(self, "class_queue", tuple(self.class_queue))
        _check_count("nodes", self.nodes, MAX_NODES)
        _check_count("ranks_per_node", self.ranks_per_node, MAX_RANKS_PER_NODE)
        if not isinstance(self.shaping, bool):
            raise ValueError(f"shaping must be True or False, got {self.shaping!r}")
        # Parsing validates; the parsed values are exposed as properties below.
        _ = (self.inter_node_bps, self.inter_node_latency_s, self.intra_node_bps, self.loss_percent)
        if self.node_cpus is not None:
            parse_node_cpus(self.node_cpus)
        _ = self.node_memory_bytes
        if not isinstance(self.best_effort_limits, bool):
            raise ValueError(f"best_effort_limits must be True or False, "
                             f"got {self.best_effort_limits!r}")
        if self.link_classes is not None:
            if (isinstance(self.link_classes, bool) or not isinstance(self.link_classes, int)
                    or not MIN_LINK_CLASSES <= self.link_classes <= MAX_LINK_CLASSES):
                raise ValueError(f"link_classes must be an integer between {MIN_LINK_CLASSES} "
                                 f"and {MAX_LINK_CLASSES}, got {self.link_classes!r}")
            if not self.shaping:
                raise ValueError("link_classes needs the shaped cluster (shaping=True): "
                                 "priority classes live in the links' qdiscs")
        elif self.class_queue is not None:
            raise ValueError(f"class_queue={self.class_queue!r} needs link_classes")
        _ = self.class_queue_packets
        _check_count("links_per_node", self.links_per_node, MAX_LINKS_PER_NODE)
        if self.links_per_node > 1:
            if not self.shaping:
                raise ValueError(f"links_per_node={self.links_per_node} needs the shaped cluster "
                                 f"(shaping=True): the links are veths between namespaces")
            if self.inter_node_bps and self.inter_node_bps / self.links_per_node < MIN_RATE_BPS:
                raise ValueError(f"links_per_node={self.links_per_node} splits inter_node_"
                                 f"bandwidth={self.inter_node_bandwidth!r} into links below "
                                 f"{format_rate(MIN_RATE_BPS)}; use fewer links or a higher rate")
        if (isinstance(self.link_mtu, bool) or not isinstance(self.link_mtu, int)
                or not MIN_LINK_MTU <= self.link_mtu <= MAX_LINK_MTU):
            raise ValueError(f"link_mtu must be an integer between {MIN_LINK_MTU} and "
                             f"{MAX_LINK_MTU} bytes, got {self.link_mtu!r}")
        if self.link_mtu != 1500 and not self.shaping:
            raise ValueError(f"link_mtu={self.link_mtu} needs the shaped cluster (shaping=True): "
                             f"the loopback's MTU is not the cluster's to change")
        _ = self.failure_events
        if not isinstance(self.fault_tolerant, bool):
            raise ValueError(f"fault_tolerant must be True or False, got {self.fault_tolerant!r}")
        if (isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int)
                or not 0 <= self.max_restarts <= MAX_RESTARTS):
            raise ValueError(f"max_restarts must be an integer between 0 and {MAX_RESTARTS}, "
                             f"got {self.max_restarts!r}")
        if self.max_restarts and self.fault_tolerant:
            raise ValueError(f"max_restarts={self.max_restarts} restarts the whole job after a "
                             f"failure; fault_tolerant goes on without a restart: choose one")
        if self.schedule_clock not in SCHEDULE_CLOCKS:
            raise ValueError(f"schedule_clock must be one of {', '.join(SCHEDULE_CLOCKS)}, got "
                             f"{self.schedule_clock!r}")
        if self.schedule_clock != "job" and self.bandwidth_schedule is None \
                and self.failure_schedule is None:
            raise ValueError(f"schedule_clock={self.schedule_clock!r} (--schedule-clock) times "
                             "a schedule: give bandwidth_schedule (--bandwidth-schedule) or "
                             "failure_schedule (--fail) too")
        if self.bandwidth_schedule is not None:
            if not self.shaping or self.inter_node_bps is None:
                raise ValueError(f"bandwidth_schedule={self.bandwidth_schedule!r} needs "
                                 f"shaped inter-node links "
                                 f"(shaping=True, not --no-shaping, and an inter_node_bandwidth, "
                                 f"--inter-node-bandwidth, to start from; not 'none')")
            for _, bps in self.bandwidth_steps:
                if bps // self.links_per_node < MIN_RATE_BPS:
                    raise ValueError(f"bandwidth_schedule: {format_rate(bps)} split over "
                                     f"{self.links_per_node} links is below "
                                     f"{format_rate(MIN_RATE_BPS)} per link")
        if (self.node_cpus is not None or self.node_memory is not None) and not self.shaping:
            raise ValueError("node_cpus / node_memory need the shaped cluster (shaping=True, "
                             "root): the node cgroups are created with the namespaces")

    @property
    def node_memory_bytes(self) -> int | None:
        if self.node_memory is None:
            return None
        nbytes = parse_size(self.node_memory, "node_memory")
        if not MIN_NODE_MEMORY <= nbytes <= MAX_NODE_MEMORY:
            raise ValueError(f"node_memory must be between {format_size(MIN_NODE_MEMORY)} "
                             f"(a torchrun agent and one rank) and 4 EiB"
                             f" (the kernel's range), got {self.node_memory!r}")
        return nbytes

    @property
    def class_queue_packets(self) -> tuple[int, ...] | None:
        """Queue length in packets of each priority class, highest class first."""
        if self.link_classes is None:
            return None
        value = self.class_queue if self.class_queue is not None else DEFAULT_CLASS_QUEUE
        queues = (value,) if isinstance(value, int) else tuple(value)
        if len(queues) == 1:  # one length for every class
            queues *= self.link_classes
        if len(queues) != self.link_classes or not all(
                isinstance(q, int) and not isinstance(q, bool) and 1 <= q <= MAX_CLASS_QUEUE
                for q in queues):
            raise ValueError(f"class_queue must be one integer or {self.link_classes} integers "
                             f"(one per class, highest first), each between 1 and "
                             f"{MAX_CLASS_QUEUE} packets, got {self.class_queue!r}")
        return queues

    @property
    def has_node_limits(self) -> bool:
        return self.node_cpus is not None or self.node_memory is not None

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def inter_node_bps(self) -> int | None:
        if self.inter_node_bandwidth is None:
            return None
        return parse_rate(self.inter_node_bandwidth, "inter_node_bandwidth")

    @property
    def bandwidth_steps(self) -> tuple[tuple[float, int], ...]:
        """The parsed bandwidth_schedule: ((seconds, bits per second), ...); () without one."""
        if self.bandwidth_schedule is None:
            return ()
        return parse_bandwidth_schedule(self.bandwidth_schedule)

    @property
    def failure_events(self) -> tuple[tuple[float, int, str], ...]:
        """The parsed failure_schedule: ((seconds, node, 'kill' | 'restart'), ...) in time
        order; () without one."""
        if self.failure_schedule is None:
            return ()
        return parse_failure_schedule(self.failure_schedule, self.nodes)

    @property
    def link_bps(self) -> int | None:
        """The shaped rate of each of a node's links: the node's rate split over its links."""
        bps = self.inter_node_bps
        return None if bps is None else bps // self.links_per_node

    @property
    def inter_node_latency_s(self) -> float | None:
        if self.inter_node_latency is None:
            return None
        return parse_latency(self.inter_node_latency, "inter_node_latency")

    @property
    def intra_node_bps(self) -> int | None:
        if self.intra_node_bandwidth is None:
            return None
        return parse_rate(self.intra_node_bandwidth, "intra_node_bandwidth")

    @property
    def loss_percent(self) -> float | None:
        if self.loss is None:
            return None
        return parse_loss(self.loss, "loss")

    def describe(self) -> str:
        parts = [f"{self.nodes} nodes x {self.ranks_per_node} ranks"]
        if not self.shaping:
            return parts[0] + ", loopback, no shaping"
        bps, lat = self.inter_node_bps, self.inter_node_latency_s
        parts.append(f"inter-node {format_rate(bps) if bps else 'unshaped'}")
        if self.links_per_node > 1:
            parts.append(f"{self.links_per_node} links per node"
                         + (f" of {format_rate(self.link_bps)}" if bps else ""))
        if self.link_mtu != 1500:
            parts.append(f"MTU {self.link_mtu}")
        if lat:
            parts.append(f"latency {format_latency(lat)}")
        if self.intra_node_bps:
            parts.append(f"intra-node {format_rate(self.intra_node_bps)}")
        if self.loss_percent:
            parts.append(f"loss {self.loss_percent:g}%")
        if self.link_classes:
            parts.append(f"{self.link_classes} priority classes "
                         f"(queues {'/'.join(map(str, self.class_queue_packets or ()))} pkts)")
        if self.bandwidth_steps:
            parts.append("bandwidth schedule " + ", ".join(
                f"{t:g}s:{format_rate(bps)}" for t, bps in self.bandwidth_steps))
        if self.failure_events:
            parts.append("failures " + ", ".join(
                f"node{n} {a} at {t:g}s" for t, n, a in self.failure_events))
        if self.node_cpus is not None:
            parts.append(f"{self.node_cpus:g} CPU/node")
        if self.node_memory_bytes is not None:
            parts.append(f"{format_size(self.node_memory_bytes)}/node")
        return ", ".join(parts)
