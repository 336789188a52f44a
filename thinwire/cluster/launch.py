"""Run a torchrun job on the emulated cluster: one torchrun per node, output streamed, always cleaned.

`run(spec, command)` builds the network (unless `spec.shaping` is False), starts
`python -m torch.distributed.run --nnodes N --node-rank i --nproc-per-node G ...` per node inside
its namespace with a static rendezvous at node 0, streams every line with a `[node<i> rank<r>]`
prefix, and stops the whole job as soon as one node fails, the timeout passes or a signal
arrives. Namespaces, veths and qdiscs are deleted in every case.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator

from thinwire.output import write_json_atomic
from thinwire.cluster.fidelity import assess as assess_fidelity, rate_at
from thinwire.cluster.accounting import NodeMonitor
from thinwire.cluster.cgroups import join as join_cgroups
from thinwire.cluster.coordinator import STORE_ENV
from thinwire.cluster.netns import LOG_DIR_PREFIX, Network, kill_namespace_processes, sh
from thinwire.cluster.schedule import BandwidthSchedule, FailureSchedule
from thinwire.cluster.spec import TRAINING_STARTED_ENV, ClusterSpec
from thinwire.ports import free_port

log = logging.getLogger(__name__)

MASTER_PORT_IN_NAMESPACE = 29500  # each run's namespaces are fresh, so this port is always free
TERMINATE_GRACE_S = 5.0
# After a kernel OOM kill the job is lost anyway: a short grace gets the error to the user fast.
OOM_TERMINATE_GRACE_S = 0.3
EXIT_ALL_DOWN = 1  # a failure schedule killed every node and restarts none
EXIT_TIMEOUT = 124
EXIT_STOPPED = 125  # the caller's `stop_when` asked for the stop (a stalled run, say)
STACK_DUMP_GRACE_S = 3.0  # for the ranks' faulthandler output to reach the job's output
EXIT_OOM = 137  # what a shell reports for a SIGKILLed job; run() raises NodeOutOfMemory instead


def validate_command(command: list[str]) -> None:
    """`command` is what torchrun takes after its options: SCRIPT [ARGS] or -m MODULE [ARGS]."""
    if not isinstance(command, (list, tuple)) or not all(isinstance(c, str) for c in command):
        raise ValueError(f"command must be a list of strings, got {command!r}")
    if not command:
        raise ValueError("command is empty: give a script (train.py [ARGS]) or -m MODULE [ARGS]")
    if command[0] == "-m":
        if len(command) < 2 or not command[1] or command[1].startswith("-"):
            raise ValueError(f"command: -m needs a module name, got {command!r}")
        try:
            found = importlib.util.find_spec(command[1]) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ValueError(f"command: module {command[1]!r} not found by {sys.executable}")
    elif command[0].startswith("-"):
        raise ValueError(f"command must start with a script path or -m MODULE, got option "
                         f"{command[0]!r}")
    elif not Path(command[0]).is_file():
        raise FileNotFoundError(f"command: script {command[0]!r} not found "
                                f"(relative to {os.getcwd()})")


# glibc: allocations up to 32 MiB (its largest) from the heap, and the heap's free top kept
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def node_env(spec: ClusterSpec, node: int, ifname: str, extra: dict | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (extra or {}).items()})
    env.update({
        "GLOO_SOCKET_IFNAME": ifname,
        "TP_SOCKET_IFNAME": ifname,
        "THINWIRE_RANKS_PER_NODE": str(spec.ranks_per_node),
        "THINWIRE_NODES": str(spec.nodes),
        "THINWIRE_CLUSTER_SHAPED": "1" if spec.shaping else "0",
        "PYTHONUNBUFFERED": "1",
    })
    if spec.node_cpus:  # the ranks' CPU a step is spread over the nodes' quotas, not the host
        env["THINWIRE_NODE_CPUS"] = str(spec.node_cpus)
    if spec.node_memory_bytes:  # a node's /sys has no cgroup file systems (ip netns exec)
        env["THINWIRE_NODE_MEMORY_BYTES"] = str(spec.node_memory_bytes)
    if spec.link_classes:  # what a rank needs for qos.tos_for_class
        env["THINWIRE_LINK_CLASSES"] = str(spec.link_classes)
    if spec.shaping and spec.inter_node_bps:  # a paced sender (dlcp) needs its link's rate
        # a schedule's 0 s entry sets the start's rate
        env["THINWIRE_INTER_NODE_BPS"] = str(rate_at(spec, 0.0))
        if spec.bandwidth_steps:  # the rate above is the start's only (thinwire.link_probe)
            env["THINWIRE_LINK_RATE_SCHEDULED"] = "1"
    if spec.links_per_node > 1:  # dlcp sprays its datagrams over the node's links
        env["THINWIRE_LINKS_PER_NODE"] = str(spec.links_per_node)
    if spec.link_mtu != 1500:  # dlcp sizes its datagrams to the links' MTU
        env["THINWIRE_LINK_MTU"] = str(spec.link_mtu)
    if spec.max_restarts:
        # torch 2.13's elastic agent keeps rank 0's bootstrap address from its first round and
        # publishes it only then: a node whose launcher started again waits for it in vain.
        # Without the shared store, rank 0 publishes a fresh address every round.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    # glibc's allocator by default gives the top of the heap back to the kernel once more than
    # a threshold it moves with the program's history is free, so a rank may fault its
    # buffers in again at every step (8,200-10,600 minor faults a step, 20-40 ms of CPU on
    # this host, in PowerSGD's runs and not in an auto run beside them: docs/design.md).
    # Fixed thresholds keep what a rank freed for its next step: the memory it holds stays at
    # its peak, which its node's budget had to allow anyway. Set either variable to override.
    for name, value in MALLOC_ENV.items():
        env.setdefault(name, value)
    # torchrun --tee prefixes each rank's lines with this (it fills in ${rank}).
    env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = f"[node{node} rank${{rank}}]: "
    return env


def torchrun_argv(spec: ClusterSpec, node: int, master_addr: str, master_port: int,
                  log_dir: str, command: list[str], rendezvous: str | None = None,
                  local_addr: str | None = None) -> list[str]:
    """A fault-tolerant job's node is a world of its own (one node, rendezvous at itself).
    ``rendezvous`` (HOST:PORT, with ``spec.max_restarts``): the coordinator's store, where
    torchrun's elastic (c10d) rendezvous forms the job again after a restart; the rendezvous
    gives the node its rank, and ``local_addr`` is where its rank 0 can be reached."""
    nodes, rank = (1, 0) if spec.fault_tolerant else (spec.nodes, node)
    if spec.max_restarts and rendezvous:
        where = ["--rdzv-backend", "c10d", "--rdzv-endpoint", rendezvous,
                 # a lost node's agent leaves the rendezvous after 3 missed 1 s heartbeats
                 # (torchrun's default: 3 x 5 s), as fault tolerance's 1 s heartbeat timeout
                 # (thinwire.cluster.coordinator): the same tuning for both ways through
                 "--rdzv-id", "thinwire", "--rdzv-conf",
                 "is_host=false,keep_alive_interval=1,keep_alive_max_attempt=3",
                 *(["--local-addr", local_addr] if local_addr else [])]
    else:
        where = ["--node-rank", str(rank), "--master-addr", master_addr,
                 "--master-port", str(master_port)]
    return [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(nodes), *where,
            "--nproc-per-node", str(spec.ranks_per_node),
            "--max-restarts", str(spec.max_restarts),
            "--log-dir", os.path.join(log_dir, f"node{node}"), "--tee", "3", *command]


def _stream(proc: subprocess.Popen, node: int, output: IO[str], lock: threading.Lock) -> None:
    """Copy one torchrun's output line by line; lines without a rank prefix get the node's."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if not line.startswith("[node"):
            line = f"[node{node}] {line}"
        with lock:
            output.write(line if line.endswith("\n") else line + "\n")
            output.flush()


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc: parents, transitively), ``pid`` left out."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _stop(procs: list[subprocess.Popen], network: Network | None,
          grace_s: float = TERMINATE_GRACE_S) -> None:
    """SIGTERM every torchrun (it stops its ranks), then SIGKILL whatever is left."""
    alive = [p for p in procs if p.poll() is None]
    tree = {pid for p in alive for pid in descendants(p.pid)}
    for p in alive:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for p in alive:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    tree |= {pid for p in alive if p.poll() is None for pid in descendants(p.pid)}
    for pid in tree | {p.pid for p in alive if p.poll() is None}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if network is not None and network.created:
        for node in range(network.spec.nodes):
            kill_namespace_processes(network.node_ns(node))
    for p in procs:
        try:
            p.wait(timeout=TERMINATE_GRACE_S)
        except subprocess.TimeoutExpired:
            log.error("process %d did not exit after SIGKILL", p.pid)


def _handles(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (its SigCgt mask in /proc): SIGUSR1
    kills a process that has none (torchrun itself, say)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def dump_stacks(procs: list[subprocess.Popen]) -> int:
    """SIGUSR1 to every process under `procs` that handles it; waits for the dumps to be copied
    into the output. Returns how many processes were asked."""
    asked = 0
    for pid in {pid for p in procs if p.poll() is None for pid in descendants(p.pid)}:
        if _handles(pid, signal.SIGUSR1):
            try:
                os.kill(pid, signal.SIGUSR1)
                asked += 1
            except OSError:  # gone since, or not ours: the run is stopped all the same
                pass
    if asked:
        time.sleep(STACK_DUMP_GRACE_S)
    return asked


class _Signalled(BaseException):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _SignalGuard:
    """The first stop signal raises `_Signalled` (so the `finally` clean-up runs); any signal
    during the clean-up is remembered, never raised there: a second Ctrl-C used to land in the
    middle of the teardown (Python runs a handler at the next bytecode, even one whose signal
    arrived just before the mask went up) and leaked every namespace and cgroup."""

    def __init__(self):
        self.cleaning = False
        self.received: int | None = None
        self.raised = False

    def handler(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
        if self.cleaning:
            log.warning("received %s during the clean-up: finishing it first",
                        signal.Signals(signum).name)
            return
        self.cleaning = self.raised = True
        raise _Signalled(signum)


@contextmanager
def _signals_raise(guard: _SignalGuard) -> Iterator[None]:
    """In the main thread, SIGINT, SIGTERM and SIGHUP go to `guard` (the first raises
    `_Signalled`, so `finally` blocks run)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, guard.handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """Teardown must not be interrupted half-way by a second Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def new_run_id() -> str:
    return uuid.uuid4().hex[:8]


def run(spec: ClusterSpec, command: list[str], env: dict | None = None,
        timeout_s: float | None = None, output: IO[str] | None = None,
        stats_path: str | None = None,
        stop_when: Callable[[], str | None] | None = None) -> int:
    """Run `command` (SCRIPT [ARGS] or -m MODULE [ARGS]) on every rank of `spec`'s cluster.

    Returns 0 if every rank succeeded; otherwise the first failing node's torchrun status,
    124 on timeout. `spec.failure_schedule` kills and restarts nodes while the job runs: a node
    down by schedule does not fail the run (the others decide; 1 if every node is down for
    good). SIGINT raises KeyboardInterrupt and SIGTERM SystemExit(143) after cleanup.
    `stop_when`: called about every 0.1 s while the job runs; a string it returns (the reason)
    stops the job and makes the status 125, after every rank that has a SIGUSR1 handler
    (``python -m thinwire.train``'s faulthandler) got the signal to write its threads' stacks
    into the output: a stalled job shows where it stood.
    A node killed for exceeding `spec.node_memory` raises `NodeOutOfMemory` (after cleanup).
    `stats_path`: write the per-node accounting there as JSON (CPU seconds, peak memory, link
    bytes, time series every 100 ms, priority-class drops, the bandwidth schedule's changes);
    shaped runs only. `spec.bandwidth_schedule` changes the inter-node links' rate while the
    job runs (`thinwire.cluster.schedule`).
    """
    if not isinstance(spec, ClusterSpec):
        raise TypeError(f"spec must be a ClusterSpec, got {type(spec).__name__}")
    validate_command(list(command))
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds or None, got {timeout_s!r}")
    if stats_path is not None and not spec.shaping:
        raise ValueError("stats_path needs the shaped cluster (shaping=True): the accounting "
                         "reads the nodes' cgroups and namespaces")
    output = output if output is not None else sys.stdout
    # a run id names the system objects of a shaped run (namespaces, cgroups, state); an
    # unshaped run only tags its log folder with one
    run_id = new_run_id() if spec.shaping else uuid.uuid4().hex[:8]
    network = Network(spec, run_id, accounting=stats_path is not None) if spec.shaping else None
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    monitors: list[NodeMonitor] = []
    schedule = BandwidthSchedule(network, spec.bandwidth_steps) if spec.bandwidth_steps \
        else None
    nodes = failures = None
    # run id and owner pid in the name: `thinwire cluster cleanup` removes it once we are gone
    log_dir = tempfile.mkdtemp(prefix=f"{LOG_DIR_PREFIX}{run_id}-{os.getpid()}-")
    marker = None
    if spec.schedule_clock == "training":  # rank 0 touches it at its first training step
        marker = Path(log_dir) / "training-started"
        env = dict(env or {}, **{TRAINING_STARTED_ENV: str(marker)})
    status = None
    guard = _SignalGuard()
    try:
        with _signals_raise(guard):
            try:
                nodes = _Nodes(spec, list(command), env, network, log_dir, output, procs,
                               threads, monitors)
                nodes.start()
                failures = FailureSchedule(nodes, spec.failure_events) \
                    if spec.failure_events else None
                for clock in (schedule, failures):
                    if clock is not None:
                        clock.start(marker)

                def tick() -> None:
                    for clock in (schedule, failures):
                        if clock is not None:
                            clock.tick()
                status = _wait(procs, timeout_s, monitors[0] if monitors else None, stop_when,
                               tick, nodes.down,
                               failures.restarts_pending if failures is not None else None)
                if status != 0 and monitors and monitors[0].check_oom() is not None:
                    raise monitors[0].oom
                return status
            finally:
                # From here on a stop signal only waits for the clean-up (the guard), and the
                # mask keeps new ones pending until it is complete.
                guard.cleaning = True
                with _signals_blocked():
                    oom = bool(monitors) and monitors[0].oom is not None
                    retired = nodes.retired + nodes.helpers if nodes is not None else []
                    _stop(procs + retired, network,
                          OOM_TERMINATE_GRACE_S if oom else TERMINATE_GRACE_S)
                    for thread in threads:
                        thread.join(timeout=2.0)
                    shutil.rmtree(log_dir, ignore_errors=True)
                    for clock in (schedule, failures):
                        if clock is not None and clock.pending and clock.clock_started_s is None:
                            log.warning("%s: its clock never started (schedule_clock "
                                        "'training': the job's rank 0 never began training)",
                                        type(clock).__name__)
                    try:
                        stats = _collect_stats(network, monitors, status, schedule)
                        if stats is not None and schedule is not None:
                            stats["bandwidth_changes"] = schedule.changes
                        if stats is not None and failures is not None:
                            stats["failures"] = failures.applied
                            stats["failure_clock_started_unix"] = failures.started_unix
                    except Exception:  # never let accounting stand in the way of teardown
                        log.exception("could not collect the run's accounting")
                        stats = None
                    if network is not None:
                        network.teardown()
                    if stats_path is not None and stats is not None:
                        write_json_atomic(stats_path, stats)
                if guard.received is not None and not guard.raised:
                    raise _Signalled(guard.received)  # asked to stop during the clean-up
    except _Signalled as sig:
        left = network.leftovers() if network is not None else []
        if left:
            log.error("received %s: cluster run stopped, but %s remain: run `thinwire cluster "
                      "cleanup`", signal.Signals(sig.signum).name, ", ".join(left))
        else:
            log.warning("received %s: cluster run stopped and cleaned up",
                        signal.Signals(sig.signum).name)
        if sig.signum == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise SystemExit(128 + sig.signum) from None


def changes_on(schedule: BandwidthSchedule, monitor: NodeMonitor) -> list:
    """The schedule's applied changes as (seconds of the monitor's series, bits/s); a change
    planned at 0 s at 0 (it was made as the job started). Only what was applied: where the
    clock never started (schedule_clock "training"), the later changes never happened.
    None of it where the schedule never started (a launch that failed first)."""
    if schedule.job_started_monotonic is None:
        return []
    offset = schedule.job_started_monotonic - monitor.started_monotonic
    return [(0.0 if c["planned_s"] <= 0 else max(c["job_s"] + offset, 0.0), c["rate_bps"])
            for c in schedule.changes]


def _collect_stats(network: Network | None, monitors: list[NodeMonitor],
                   status: int | None, schedule: BandwidthSchedule | None = None) -> dict | None:
    """The run's accounting, read before the cgroups and qdiscs are removed. ``schedule``:
    the bandwidth schedule, whose applied changes mark the fidelity verdict's phases."""
    if network is None or not monitors:
        return None
    monitor = monitors[0]
    monitor.stop()
    stats = {"run_id": network.run_id, "spec": network.spec.describe(), "status": status,
             "cgroups": network.node_cgroups is not None, **monitor.report()}
    stats["link_classes"] = network.class_stats()
    if network.spec.shaping:
        stats["qdisc_drops"] = network.qdisc_drops()
    stats["fidelity"] = assess_fidelity(stats, network.spec,
                                        None if schedule is None else changes_on(schedule, monitor))
    log.info("fidelity: %s-bound (best second of each node's link: %s of its rate; host "
             "saturated during %s of the traffic)", stats["fidelity"]["verdict"],
             [n["link_peak_share"] for n in stats["fidelity"]["nodes"]],
             [n["busy_share"] for n in stats["fidelity"]["nodes"]])
    return stats


class _Nodes:
    """Starts (and, on a failure schedule, restarts) one torchrun per node; ``procs[node]`` is
    the node's current launcher, ``retired`` the ones a schedule killed."""

    def __init__(self, spec: ClusterSpec, command: list[str], env: dict | None,
                 network: Network | None, log_dir: str, output: IO[str],
                 procs: list[subprocess.Popen], threads: list[threading.Thread],
                 monitors: list[NodeMonitor]):
        self.spec, self.command, self.env, self.network = spec, command, env, network
        self.log_dir, self.output = log_dir, output
        self.procs, self.threads, self.monitors = procs, threads, monitors
        self.retired: list[subprocess.Popen] = []
        self.down: set[int] = set()  # killed by the schedule, not restarted (yet)
        self.helpers: list[subprocess.Popen] = []  # a fault-tolerant job's coordinator
        self.coordinator_env: dict[str, str] = {}
        self.lock = threading.Lock()
        self.master_addr, self.port = None, None

    def start(self) -> None:
        """Build the network and start every node (appending to `procs` as it goes, so that
        a failure half-way still lets the caller stop what was started)."""
        if self.network is not None:
            self.network.create()
            if self.network.accounting or self.network.node_cgroups is not None:
                self.monitors.append(NodeMonitor(self.spec.nodes, self.network.node_cgroups))
            self.master_addr, self.port = self.network.node_addr(0), MASTER_PORT_IN_NAMESPACE
        else:
            self.master_addr, self.port = "127.0.0.1", free_port()
        if self.spec.fault_tolerant or self.spec.max_restarts:
            self._start_coordinator()
        for node in range(self.spec.nodes):
            self.procs.append(self._launch(node))
        if self.monitors:
            self.monitors[0].start()
        log.info("cluster run: %s (%d ranks): %s", self.spec.describe(), self.spec.world_size,
                 " ".join(self.command))

    def _start_coordinator(self, timeout_s: float = 60.0) -> None:
        """torchft's Lighthouse and the job store, in the switch's namespace (an address on
        its bridge: no node's death takes them along) or on 127.0.0.1; waits for "ready"."""
        from thinwire.cluster import coordinator

        if self.network is not None:
            host = coordinator.COORDINATOR_HOST
            lighthouse_port, store_port = coordinator.LIGHTHOUSE_PORT, coordinator.STORE_PORT
            sh("ip", "-n", self.network.switch_ns, "addr", "add", f"{host}/24", "dev", "br0")
            prefix = ["ip", "netns", "exec", self.network.switch_ns]
        else:
            host, lighthouse_port, store_port, prefix = "127.0.0.1", 0, 0, []  # the OS's
        proc = subprocess.Popen(
            prefix + [sys.executable, "-m", "thinwire.cluster.coordinator", "--host", host,
                      "--lighthouse-port", str(lighthouse_port), "--store-port",
                      str(store_port)],
            # stdout carries only its "ready" line: on one pipe with stderr, the Lighthouse's
            # log (written by its own threads) cut into that line and the launcher never saw
            # it (a start that failed after 60 s, one in a few runs on a busy host)
            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, start_new_session=True, bufsize=1, errors="replace")
        self.helpers.append(proc)
        ready = threading.Event()
        ports: list[str] = []

        def relay(stream) -> None:  # its "ready", then the quorum changes and problems it logs
            for line in stream:
                if stream is proc.stdout and line.startswith("ready "):
                    ports.extend(line.split()[1:3])  # "ready LIGHTHOUSE_PORT STORE_PORT"
                    ready.set()
                    continue
                if "[INFO]" in line and "quorum change" not in line:
                    continue  # a line per quorum request: every step of every node
                with self.lock:
                    self.output.write(f"[coordinator] {line.rstrip()}\n")
                    self.output.flush()
        for stream in (proc.stdout, proc.stderr):
            thread = threading.Thread(target=relay, args=(stream,), daemon=True)
            thread.start()
            self.threads.append(thread)
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fault-tolerant job's coordinator did not start "
                                   f"(status {proc.poll()})")
        lighthouse_port, store_port = ports
        self.coordinator_env = {coordinator.LIGHTHOUSE_ENV: f"http://{host}:{lighthouse_port}",
                                coordinator.STORE_ENV: f"{host}:{store_port}"}

    def _launch(self, node: int) -> subprocess.Popen:
        network = self.network
        prefix = network.exec_prefix(node) if network else []
        master, port = self.master_addr, self.port
        if self.spec.fault_tolerant:  # each node's own rendezvous, on its own loopback
            master = "127.0.0.1"
            port = port if network is not None else free_port()  # unshaped: one loopback
        argv = prefix + torchrun_argv(
            self.spec, node, master, port, self.log_dir, self.command,
            rendezvous=self.coordinator_env.get(STORE_ENV),
            local_addr=network.node_addr(node) if network else "127.0.0.1")
        ifname = "eth0" if network else "lo"
        log.debug("node %d: %s", node, " ".join(argv))
        cgroups = network.node_cgroups if network else None
        # The node's torchrun joins its cgroups before exec; its ranks inherit them.
        join = functools.partial(join_cgroups, cgroups.procs_files(node)) if cgroups else None
        env = node_env(self.spec, node, ifname, self.env)
        if self.spec.fault_tolerant:
            from thinwire.cluster.coordinator import NODE_ENV

            env.update(self.coordinator_env, **{NODE_ENV: str(node)})
        proc = subprocess.Popen(
            argv, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, bufsize=1, errors="replace", preexec_fn=join)
        if self.monitors:
            self.monitors[0].pids[node] = proc.pid
        thread = threading.Thread(target=_stream, args=(proc, node, self.output, self.lock),
                                  daemon=True)
        thread.start()
        self.threads.append(thread)
        return proc

    def kill(self, node: int) -> None:
        """Every process of the node, at once (SIGKILL: a reclaimed spot instance)."""
        proc = self.procs[node]
        for pid in [proc.pid, *descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.network is not None and self.network.created:
            kill_namespace_processes(self.network.node_ns(node))
        proc.wait()
        self.down.add(node)

    def restart(self, node: int) -> None:
        self.retired.append(self.procs[node])
        self.procs[node] = self._launch(node)
        self.down.discard(node)


def _wait(procs: list[subprocess.Popen], timeout_s: float | None,
          monitor: NodeMonitor | None = None,
          stop_when: Callable[[], str | None] | None = None,
          tick: Callable[[], None] | None = None, down: set[int] | None = None,
          restarts_pending: Callable[[], bool] | None = None) -> int:
    """0 when all nodes succeed; as soon as one fails or time runs out, the status to report.
    ``tick``: called every round (the schedules' due changes); ``down``: nodes a failure
    schedule killed and has not restarted (their exit is not the job's failure)."""
    down = down if down is not None else set()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        if tick is not None:
            tick()
        reason = stop_when() if stop_when is not None else None
        if reason:
            log.error("cluster run stopped: %s; the ranks' stacks follow in the output", reason)
            dump_stacks(procs)
            return EXIT_STOPPED
        if monitor is not None and monitor.oom is not None:
            return EXIT_OOM  # the kernel killed part of a node: the rest cannot go on
        codes = {node: p.poll() for node, p in enumerate(procs) if node not in down}
        if not codes and not (restarts_pending is not None and restarts_pending()):
            log.error("every node was killed by the failure schedule and none restarts")
            return EXIT_ALL_DOWN
        for node, code in codes.items():
            if code not in (None, 0):
                if any(c is None for c in codes.values()):
                    log.error("node %d exited with status %d: stopping the other nodes", node, code)
                return code if code > 0 else 128 - code  # killed by a signal: shell convention
        if codes and all(c == 0 for c in codes.values()):
            return 0  # the nodes that run have finished (a node down by schedule stays down)
        if deadline is not None and time.monotonic() > deadline:
            log.error("cluster run timed out after %.0f s: stopping all ranks", timeout_s)
            return EXIT_TIMEOUT
        time.sleep(0.1)
