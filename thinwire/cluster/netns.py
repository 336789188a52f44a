"""The emulated network: one namespace per node, one for the switch, veth links, tc shaping.

Layout of run `<id>` (all names under the `thinwire-<id>-` prefix, so concurrent runs never meet):

    thinwire-<id>-sw   the switch: bridge `br0`, ports `p0..p{N-1}` (veths, switch side)
    thinwire-<id>-n<i> node i: `eth0` (veth, node side) = 10.77.0.<i+1>/24, and `lo`

With `links_per_node` K > 1, node i also has `eth1..eth{K-1}`, link k = 10.77.k.<i+1>/24 on
switch port `p<i>l<k>` of its own bridge `br<k>` (a "rail": link k of every node, one subnet):
an address is then reachable through one link only (one bridge for all would let a node answer
ARP for its link-1 address on link 0), and a sender picks the link by the peer address it sends
to. Every link is shaped at the node's rate / K (`ClusterSpec.link_bps`).

Every veth is created inside the switch namespace with its peer placed straight into the node's
namespace, so nothing is ever created on (or renamed in) the host's own namespace, and interface
names only need to be unique inside a namespace (well under the 15-character limit). The subnet
exists only inside these namespaces; there is no route or interface to the outside.

Shaping, per node (egress qdiscs, so the two directions of a link are two devices):
    node eth0 (node -> switch) and switch p<i> (switch -> node): HTB rate = inter-node bandwidth,
        leaf netem with half the one-way latency, loss split so that a node-to-node path loses
        `loss` percent; node lo: HTB rate = intra-node bandwidth.
Loss is done without netem: a classic-BPF classifier sends a random fraction of packets to an HTB
class whose queue holds zero packets, which works on kernels built without sch_netem.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from thinwire.cluster import qos
from thinwire.cluster.cgroups import (CgroupsUnavailable, NodeCgroups, cgroup_mounts,
                                      find_run_cgroups, node_cgroups_for, remove_cgroups)
from thinwire.cluster.spec import ClusterSpec

log = logging.getLogger(__name__)

PREFIX = "thinwire-"
LOG_DIR_PREFIX = "thinwire-cluster-logs-"  # + run id + "-": a run's launcher logs (in /tmp)
SUBNET = "10.77.0"
STATE_DIR = Path(os.environ.get("THINWIRE_STATE_DIR", "/run/thinwire"))
# `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc: each node gets an /etc/hosts naming
# the cluster's addresses, so reverse lookups of peers (c10d logs them) resolve instead of warning.
NETNS_ETC = Path("/etc/netns")
MTU_GSO = 65536  # the largest skb HTB may see on veth/lo (GSO), used to size bursts


class ShapingUnavailable(RuntimeError):
    """Root, `ip`, `tc` or a qdisc is missing: the shaped cluster cannot be built here."""


def _effective_capabilities() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return None


def missing_requirements() -> list[str]:
    """What the shaped cluster needs and this machine lacks (empty list: all there)."""
    missing = []
    if os.geteuid() != 0:
        missing.append(f"root (running as uid {os.geteuid()})")
    else:
        caps = _effective_capabilities()  # root in a container may lack them
        for bit, name in ((12, "CAP_NET_ADMIN"), (21, "CAP_SYS_ADMIN")):
            if caps is not None and not caps >> bit & 1:
                missing.append(f"the {name} capability (e.g. docker run --privileged)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            missing.append(f"the `{tool}` command (package iproute2)")
    return missing


def require_shaping_tools() -> None:
    missing = missing_requirements()
    if missing:
        raise ShapingUnavailable(
            "the emulated cluster needs root and the ip/tc tools to create network namespaces; "
            f"missing: {', '.join(missing)}. Run as root, or pass --no-shaping (shaping=False) "
            "to run the same launch on loopback without shaping.")


def sh(*argv: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    log.debug("$ %s", " ".join(argv))
    proc = subprocess.run(argv, capture_output=True, text=True, input=stdin)
    if check and proc.returncode != 0:
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(argv)}: "
                           f"{proc.stderr.strip()}")
    return proc


# --- tc --------------------------------------------------------------------------------------

def _loss_filter_bytecode(drop_fraction: float, drop_classid: int) -> str:
    """Classic BPF: A = random u32; if A >= threshold -> no match (default class), else drop class."""
    skf_ad_random = (-0x1000 + 56) & 0xFFFFFFFF  # SKF_AD_OFF + SKF_AD_RANDOM
    threshold = min(int(drop_fraction * 2**32), 2**32 - 1)
    prog = [(0x20, 0, 0, skf_ad_random),  # ld  [random]
            (0x35, 0, 1, threshold),      # jge #threshold, +0 (ret 0), +1 (ret drop)
            (0x06, 0, 0, 0),              # ret #0          -> no match
            (0x06, 0, 0, drop_classid)]   # ret #classid    -> drop class
    return f"{len(prog)}," + ",".join(" ".join(str(x) for x in ins) for ins in prog)


def htb_burst_bytes(rate_bps: int) -> int:
    # 2 ms worth of traffic, at least two GSO packets: smaller bursts make HTB undershoot at
    # Gbit rates (it can only release what the burst allows per timer tick).
    return max(int(rate_bps / 8 * 0.002), 2 * MTU_GSO)


def tc_commands(dev: str, rate_bps: int | None, delay_s: float | None = None,
                drop_fraction: float | None = None,
                class_queues: tuple[int, ...] | None = None) -> list[list[str]]:
    """tc argv lists (without `tc -n NS`) that shape egress of `dev`. Empty if nothing to shape.
    `class_queues`: strict-priority classes with these queue lengths (see thinwire.cluster.qos)."""
    if not rate_bps and not delay_s and not drop_fraction and not class_queues:
        return []
    rate = str(rate_bps or 100 * 10**9) + "bit"
    burst = str(htb_burst_bytes(rate_bps or 100 * 10**9))
    root = ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default"]
    if class_queues:
        cmds = [root + [qos.default_minor(len(class_queues))]]
        cmds += qos.priority_tc_commands(dev, rate_bps or 100 * 10**9, burst, class_queues,
                                         int(delay_s * 1e6) if delay_s else None)
    else:
        cmds = [root + ["10"], qos.htb_class("add", dev, "1:", "1:10", rate, rate, burst)]
        leaf = ["qdisc", "add", "dev", dev, "parent", "1:10", "handle", "10:"]
        if delay_s:
            cmds.append(leaf + ["netem", "delay", f"{delay_s * 1e6:.0f}us", "limit", "100000"])
        else:
            cmds.append(leaf + ["pfifo", "limit", "10000"])
    if drop_fraction:
        cmds += [
            ["class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", rate,
             "quantum", "200000"],
            # A queue that holds no packet: everything classified here is dropped.
            ["qdisc", "add", "dev", dev, "parent", "1:20", "handle", "20:", "pfifo", "limit", "0"],
            ["filter", "add", "dev", dev, "parent", "1:", "protocol", "all", "prio", "1", "bpf",
             "bytecode", _loss_filter_bytecode(drop_fraction, 0x10020), "classid", "1:20"],
        ]
    return cmds


def rate_change_commands(dev: str, rate_bps: int,
                         class_queues: tuple[int, ...] | None = None) -> list[list[str]]:
    """tc argv lists that move a link shaped by `tc_commands` to `rate_bps` while it carries
    traffic (HTB changes a class's rate in place; queued packets stay)."""
    burst = str(htb_burst_bytes(rate_bps))
    if class_queues:
        return qos.priority_rate_commands(dev, rate_bps, burst, len(class_queues))
    rate = f"{rate_bps}bit"
    return [qos.htb_class("change", dev, "1:", "1:10", rate, rate, burst)]


def parse_qdisc_drops(tc_json: str) -> tuple[int, int] | None:
    """(drops, overlimits) of a device's root qdisc from ``tc -s -j qdisc show``'s output
    (its children's are counted in the root's); None where it cannot be read."""
    try:
        qdiscs = json.loads(tc_json or "null")
    except ValueError:
        return None
    if not isinstance(qdiscs, list):
        return None
    root = next((q for q in qdiscs if isinstance(q, dict) and q.get("root")), None)
    if root is None:
        return None
    return int(root.get("drops", 0)), int(root.get("overlimits", 0))


def rail_address(node_address: str, link: int) -> str:
    """10.77.0.<n> -> 10.77.<link>.<n>: a node's address on its link ``link``."""
    first, second, _, last = node_address.split(".")
    return f"{first}.{second}.{link}.{last}"


def hop_drop_fraction(loss_percent: float | None) -> float | None:
    """Per-hop drop probability q such that a two-hop path loses `loss_percent`: 1-(1-q)^2 = p."""
    if not loss_percent:
        return None
    return 1.0 - (1.0 - loss_percent / 100.0) ** 0.5


# --- run ownership ---------------------------------------------------------------------------

def process_start_time(pid: int) -> str | None:
    """Kernel start time of `pid` (field 22 of /proc/PID/stat); None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_alive(state: dict) -> bool:
    start = process_start_time(int(state.get("pid", -1)))
    return start is not None and start == state.get("pid_start")


def list_namespaces() -> list[str]:
    proc = sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def kill_namespace_processes(ns: str) -> None:
    pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def delete_namespaces(names: list[str]) -> list[str]:
    """Kill what still runs inside `names`, delete them (and their /etc/netns files); returns
    the names that remain."""
    for ns in names:
        kill_namespace_processes(ns)
    for ns in names:
        sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
    existing = set(list_namespaces())
    return [ns for ns in names if ns in existing]


@dataclass
class Network:
    """The namespaces, links and qdiscs of one run. Use `create()` then, always, `teardown()`."""

    spec: ClusterSpec
    run_id: str
    created: list[str] = field(default_factory=list)
    accounting: bool = False  # node cgroups even without limits, for CPU/memory accounting
    node_cgroups: NodeCgroups | None = None  # set by create() when the spec asks for limits

    @property
    def switch_ns(self) -> str:
        return f"{PREFIX}{self.run_id}-sw"

    def node_ns(self, node: int) -> str:
        return f"{PREFIX}{self.run_id}-n{node}"

    def node_addr(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def link_addr(self, node: int, link: int) -> str:
        """Address of node's link ``link`` (link 0 is ``node_addr``)."""
        return rail_address(self.node_addr(node), link)

    @staticmethod
    def links(node: int, count: int) -> list[tuple[str, str, str]]:
        """(switch port, node device, bridge) of each of a node's links."""
        return [(f"p{node}" if k == 0 else f"p{node}l{k}", f"eth{k}", f"br{k}")
                for k in range(count)]

    def exec_prefix(self, node: int) -> list[str]:
        return ["ip", "netns", "exec", self.node_ns(node)]

    @property
    def state_file(self) -> Path:
        return STATE_DIR / f"{self.run_id}.json"

    def all_namespaces(self) -> list[str]:
        return [self.switch_ns] + [self.node_ns(i) for i in range(self.spec.nodes)]

    def _write_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {"run_id": self.run_id, "pid": os.getpid(),
                 "pid_start": process_start_time(os.getpid()),
                 "namespaces": self.all_namespaces(), "created_at": time.time(),
                 "cgroups": self.node_cgroups.paths() if self.node_cgroups else []}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_file)

    def _add_ns(self, ns: str) -> None:
        sh("ip", "netns", "add", ns)
        self.created.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")

    def _write_hosts(self, ns: str) -> None:
        lines = ["127.0.0.1 localhost", f"127.0.0.1 {socket.gethostname()}", "::1 localhost"]
        for i in range(self.spec.nodes):  # the store's dual-stack socket sees v4-mapped peers
            lines += [f"{self.node_addr(i)} thinwire-node{i}",
                      f"::ffff:{self.node_addr(i)} thinwire-node{i}"]
        if self.spec.fault_tolerant:  # the coordinator, on the switch's bridge
            from thinwire.cluster.coordinator import COORDINATOR_HOST

            lines += [f"{COORDINATOR_HOST} thinwire-coordinator",
                      f"::ffff:{COORDINATOR_HOST} thinwire-coordinator"]
        (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
        (NETNS_ETC / ns / "hosts").write_text("\n".join(lines) + "\n")

    def _tc(self, ns: str, cmds: list[list[str]]) -> None:
        for cmd in cmds:
            sh("tc", "-n", ns, *cmd)

    def _tc_batch(self, ns: str, cmds: list[list[str]]) -> None:
        """``cmds`` in one tc process (``tc -batch``): a rate change on a large cluster is
        hundreds of commands, which one process each took seconds to start while the links
        ran at mixed rates and the launcher's wait loop stood still. Arguments with spaces
        (a BPF filter's bytecode) need the batch parser's quoting: those run one by one."""
        if len(cmds) < 2 or any(not arg or any(c.isspace() for c in arg)
                                for cmd in cmds for arg in cmd):
            self._tc(ns, cmds)
            return
        sh("tc", "-n", ns, "-batch", "-", stdin="".join(" ".join(cmd) + "\n" for cmd in cmds))

    def set_inter_node_rate(self, rate_bps: int) -> None:
        """Every node's links, both directions, to `rate_bps` (split over a node's links):
        one tc process a namespace."""
        spec = self.spec
        per_link = rate_bps // spec.links_per_node
        switch = []
        for i in range(spec.nodes):
            node = []
            for port, dev, _ in self.links(i, spec.links_per_node):
                node += rate_change_commands(dev, per_link, spec.class_queue_packets)
                switch += rate_change_commands(port, per_link, spec.class_queue_packets)
            self._tc_batch(self.node_ns(i), node)
        self._tc_batch(self.switch_ns, switch)

    def netem_available(self) -> bool:
        probe = sh("tc", "-n", self.switch_ns, "qdisc", "add", "dev", "lo", "root", "netem",
                   "delay", "1ms", check=False)
        sh("tc", "-n", self.switch_ns, "qdisc", "del", "dev", "lo", "root", check=False)
        return probe.returncode == 0

    def create(self) -> None:
        require_shaping_tools()
        # Before anything exists: missing controllers fail (or warn) with nothing to clean.
        self.node_cgroups = node_cgroups_for(self.spec, self.run_id, self.accounting)
        # Ownership first: if we die half-way, `thinwire cluster cleanup` finds what we made.
        self._write_state()
        spec, sw = self.spec, self.switch_ns
        self._add_ns(sw)
        delay = spec.inter_node_latency_s
        if delay and not self.netem_available():
            raise ShapingUnavailable(
                f"inter_node_latency={spec.inter_node_latency!r} needs the netem qdisc, which "
                "this kernel does not provide (CONFIG_NET_SCH_NETEM / module sch_netem); "
                "leave the latency out, or run on a kernel with netem")
        for k in range(spec.links_per_node):
            sh("ip", "-n", sw, "link", "add", f"br{k}", "mtu", str(spec.link_mtu), "type",
               "bridge")
            sh("ip", "-n", sw, "link", "set", f"br{k}", "up")
        hop_delay = delay / 2 if delay else None  # one-way latency = node egress + switch egress
        drop = hop_drop_fraction(spec.loss_percent)
        queues, mtu = spec.class_queue_packets, str(spec.link_mtu)
        for i in range(spec.nodes):
            ns = self.node_ns(i)
            self._add_ns(ns)
            self._write_hosts(ns)
            for k, (port, dev, bridge) in enumerate(self.links(i, spec.links_per_node)):
                sh("ip", "-n", sw, "link", "add", port, "mtu", mtu, "type", "veth", "peer",
                   "name", dev, "mtu", mtu, "netns", ns)
                sh("ip", "-n", sw, "link", "set", port, "master", bridge, "up")
                sh("ip", "-n", ns, "addr", "add", f"{self.link_addr(i, k)}/24", "dev", dev)
                sh("ip", "-n", ns, "link", "set", dev, "up")
                self._tc(ns, tc_commands(dev, spec.link_bps, hop_delay, drop, queues))
                self._tc(sw, tc_commands(port, spec.link_bps, hop_delay, drop, queues))
            self._tc(ns, tc_commands("lo", spec.intra_node_bps))
        self._wait_links_up()
        self._create_cgroups()
        log.info("network %s: %s", self.run_id, spec.describe())

    def _create_cgroups(self) -> None:
        if self.node_cgroups is None:
            return
        try:
            self.node_cgroups.create()
        except CgroupsUnavailable as exc:
            self.node_cgroups.remove()
            if not self.spec.best_effort_limits:
                raise
            log.warning("running WITHOUT per-node CPU/memory limits (--best-effort-limits): %s",
                        exc)
            self.node_cgroups = None

    def class_stats(self) -> list[dict]:
        """Per node link and direction, the priority classes' sent bytes and drops (tc -s)."""
        classes = self.spec.link_classes
        if not classes:
            return []
        rows = []
        for i in range(self.spec.nodes):
            for k, (port, dev, _) in enumerate(self.links(i, self.spec.links_per_node)):
                for ns, name, direction in ((self.node_ns(i), dev, "egress"),
                                            (self.switch_ns, port, "ingress")):
                    out = sh("tc", "-n", ns, "-s", "class", "show", "dev", name,
                             check=False).stdout
                    for row in qos.parse_class_stats(out, classes):
                        rows.append({"node": i, "direction": direction, **row}
                                    | ({"link": k} if self.spec.links_per_node > 1 else {}))
        return rows

    def qdisc_drops(self) -> list[dict]:
        """Per node, the packets its links' qdiscs dropped (a full queue: the shaped link's
        overflow, which TCP repairs by resending) and held back over the rate (overlimits),
        both directions: the node's egress and the switch port towards it (tc -s)."""
        rows = []
        for i in range(self.spec.nodes):
            row = {"node": i, "dropped": 0, "overlimits": 0, "read": True}
            for k, (port, dev, _) in enumerate(self.links(i, self.spec.links_per_node)):
                for ns, name in ((self.node_ns(i), dev), (self.switch_ns, port)):
                    out = sh("tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", name,
                             check=False).stdout
                    counts = parse_qdisc_drops(out)
                    if counts is None:
                        row["read"] = False
                        continue
                    row["dropped"] += counts[0]
                    row["overlimits"] += counts[1]
            rows.append(row)
        return rows

    def _wait_links_up(self, timeout_s: float = 5.0) -> None:
        """veths come up asynchronously; launch only once every node sees its link as up."""
        deadline = time.monotonic() + timeout_s
        for i in range(self.spec.nodes):
            for _, dev, _ in self.links(i, self.spec.links_per_node):
                while True:
                    out = sh("ip", "-n", self.node_ns(i), "-o", "link", "show", dev).stdout
                    if "LOWER_UP" in out or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)

    def leftovers(self) -> list[str]:
        return run_leftovers(self.run_id)

    def teardown(self) -> None:
        """Delete every namespace of the run (their veths and qdiscs go with them) and the state
        file. Raises if something could not be removed, so leaks are never silent."""
        if self.node_cgroups is not None:  # first: kills what runs in them, frees the namespaces
            self.node_cgroups.remove()
        if not self.created:  # nothing was made (e.g. not root): only the record, if any
            if self.state_file.exists():
                self.state_file.unlink()
            return
        existing = set(list_namespaces())
        names = [ns for ns in self.all_namespaces()
                 if ns in existing or (NETNS_ETC / ns).exists()]
        remaining = delete_namespaces(names)
        if remaining:
            raise RuntimeError(f"could not delete namespaces {remaining} of run {self.run_id}")
        self.state_file.unlink(missing_ok=True)
        self.state_file.with_suffix(".tmp").unlink(missing_ok=True)
        log.debug("network %s removed", self.run_id)


def run_leftovers(run_id: str) -> list[str]:
    """What of run ``run_id`` still exists: namespaces, /etc/netns entries, node cgroups, the
    state file (empty once a teardown is complete)."""
    from thinwire.cluster.cgroups import find_run_cgroups

    prefix = f"{PREFIX}{run_id}-"
    found = [f"namespace {ns}" for ns in list_namespaces() if ns.startswith(prefix)]
    if NETNS_ETC.is_dir():
        found += [f"{NETNS_ETC / p.name}" for p in NETNS_ETC.iterdir()
                  if p.name.startswith(prefix)]
    found += [f"cgroup {c}" for c in find_run_cgroups(prefix)]
    state = STATE_DIR / f"{run_id}.json"
    if state.exists():
        found.append(str(state))
    return found


def cleanup_dead_runs() -> list[str]:
    """Remove namespaces left behind by runs whose owning process is dead; returns their names.

    A run records its owner before creating any namespace, so a `thinwire-<id>-*` namespace
    with no state file belongs to a run that is finishing its own teardown or that lost its
    record; both are safe to remove. Live runs are never touched.
    """
    require_shaping_tools()
    namespaces = [ns for ns in list_namespaces() if ns.startswith(PREFIX)]
    live: set[str] = set()
    dead_states: list[Path] = []
    if STATE_DIR.is_dir():
        for path in STATE_DIR.glob("*.json"):
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(state, dict) or isinstance(state.get("pid"), bool) or \
                    not isinstance(state.get("pid"), int) or \
                    not isinstance(state.get("run_id"), str):
                dead_states.append(path)  # not a record this module wrote: no owner to keep
            elif owner_alive(state):
                live.add(state["run_id"])
            else:
                dead_states.append(path)
    namespaces += [p.name for p in NETNS_ETC.glob(PREFIX + "*") if p.name not in namespaces]
    doomed = [ns for ns in namespaces if ns[len(PREFIX):].rsplit("-", 1)[0] not in live]
    # Cgroups: those the dead runs recorded, and any `thinwire-<id>-n<i>` of no live run.
    cgroups = [c for path in dead_states for c in _recorded_cgroups(path)]
    cgroups += [c for c in find_run_cgroups(PREFIX) if c not in cgroups
                and os.path.basename(c)[len(PREFIX):].rsplit("-", 1)[0] not in live]
    cgroups = [c for c in cgroups if os.path.isdir(c)]
    stuck = remove_cgroups(cgroups)
    remaining = delete_namespaces(doomed)
    for path in dead_states:
        path.unlink(missing_ok=True)
    # The launchers' log folders (torchrun's per-rank files) whose owner is gone.
    logs = [str(p) for p in Path(tempfile.gettempdir()).glob(LOG_DIR_PREFIX + "*")
            if not _log_dir_owner_alive(p)]
    for path in logs:
        shutil.rmtree(path, ignore_errors=True)
    if remaining or stuck:
        raise RuntimeError(f"could not delete namespaces {remaining} / cgroups {stuck}")
    return doomed + cgroups + logs


def _log_dir_owner_alive(path: Path) -> bool:
    """A launcher log folder is named LOG_DIR_PREFIX + run id + "-" + owner pid + "-" + random;
    an older one without the pid counts as owned for an hour after its last change."""
    fields = path.name[len(LOG_DIR_PREFIX):].split("-")
    if len(fields) >= 3 and fields[1].isdigit():
        try:
            os.kill(int(fields[1]), 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's live process
            return True
    try:
        return time.time() - path.stat().st_mtime < 3600
    except OSError:
        return False


def _recorded_cgroups(state_path: Path) -> list[str]:
    """The cgroups a dead run's state file records: only this module's own (named
    ``thinwire-<run id>-...`` inside a cgroup hierarchy). Everything in them is killed as
    root: a damaged or planted state file must not name another cgroup (system.slice)."""
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(state, dict) or not isinstance(state.get("run_id"), str) or \
            not isinstance(state.get("cgroups"), list):
        return []
    mounts = cgroup_mounts()
    own = f"{PREFIX}{state['run_id']}-"
    return [str(c) for c in state["cgroups"] if isinstance(c, str)
            and os.path.basename(os.path.normpath(c)).startswith(own)
            and any(os.path.normpath(c).startswith(mount.rstrip("/") + "/") for mount in mounts)]
