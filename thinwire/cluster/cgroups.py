"""Per-node CPU and memory budgets: one cgroup per emulated node, every process of the node in it.

Two layouts are handled:
  - cgroup v1 (this project's machines): controllers `cpu`, `cpuacct` and `memory` each mounted
    on their own (or co-mounted) hierarchy. Quota via cpu.cfs_quota_us / cpu.cfs_period_us, hard
    memory limit via memory.limit_in_bytes (+ memory.memsw.limit_in_bytes, so swap cannot
    stretch it), CPU time from cpuacct.usage, peak from memory.max_usage_in_bytes and kernel
    OOM kills from the `oom_kill` line of memory.oom_control.
  - cgroup v2 (unified hierarchy with `cpu` and `memory` enabled): cpu.max, memory.max,
    memory.swap.max = 0, cpu.stat usage_usec, memory.peak, memory.events `oom_kill`.

A node's cgroups are named `thinwire-<run>-n<i>` and created *under the caller's own cgroup* in
each hierarchy (from /proc/self/cgroup), so whatever limits the caller itself runs under (a CI
container, a sandbox) still bound the nodes. Their paths go into the run's ownership record
before they are created, so `thinwire cluster cleanup` can remove them after a crash.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000
# A node's quota is a cap; the largest CFS weight makes it also what the node gets on a busy
# machine (without it a node competes as one task among all the host's runnable tasks and gets
# far less than its quota). The quota bounds what this takes from other work to the requested
# cores.
V1_MAX_SHARES, V2_MAX_WEIGHT = 262144, 10000
V1_CONTROLLERS = ("cpu", "cpuacct", "memory")
REMOVE_TIMEOUT_S = 5.0


class CgroupsUnavailable(RuntimeError):
    """The cpu/memory cgroup controllers cannot be used here (not mounted, not writable)."""


@dataclass(frozen=True)
class Hierarchies:
    """Where the controllers live. v1: controller -> the caller's cgroup dir in that hierarchy;
    v2: the single key 'unified'."""

    version: int
    dirs: dict[str, Path]


def _mounts(mounts_file: Path) -> list[tuple[Path, str, set[str]]]:
    found = []
    for line in mounts_file.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            found.append((Path(parts[1]), parts[2], set(parts[3].split(","))))
    return found


def cgroup_mounts() -> list[str]:
    """Where this machine's cgroup hierarchies are mounted (none where /proc is unreadable)."""
    try:
        return [str(mount) for mount, _, _ in _mounts(Path("/proc/self/mounts"))]
    except OSError:
        return []


def _own_paths(proc_cgroup: Path) -> dict[str, str]:
    """controller -> path of this process's cgroup ('' key for v2)."""
    own = {}
    for line in proc_cgroup.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def _under(mount: Path, path: str) -> Path:
    candidate = mount / path.lstrip("/")
    return candidate if candidate.is_dir() else mount  # path outside this mount's view


def discover(mounts_file: Path = Path("/proc/self/mounts"),
             proc_cgroup: Path = Path("/proc/self/cgroup")) -> Hierarchies:
    """Find usable cpu+memory controllers; raises CgroupsUnavailable saying what is missing."""
    try:
        mounts, own = _mounts(mounts_file), _own_paths(proc_cgroup)
    except OSError as exc:
        raise CgroupsUnavailable(f"cannot read the cgroup mounts: {exc}") from None
    v1 = {}
    for mount, kind, options in mounts:
        if kind == "cgroup":
            for controller in V1_CONTROLLERS:
                if controller in options:
                    v1[controller] = _under(mount, own.get(controller, "/"))
    if "cpu" in v1 and "memory" in v1:
        return Hierarchies(1, v1)
    for mount, kind, _ in mounts:
        if kind != "cgroup2":
            continue
        try:
            available = set((mount / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        if {"cpu", "memory"} <= available:
            return Hierarchies(2, {"unified": _under(mount, own.get("", "/"))})
    have = sorted(v1) or "none"
    raise CgroupsUnavailable(
        f"per-node CPU/memory limits need the cgroup controllers cpu and memory (v1 hierarchies "
        f"or the v2 unified hierarchy); found v1 controllers: {have}, and no v2 hierarchy with "
        "both. Mount them (e.g. a privileged container), or pass --best-effort-limits "
        "(best_effort_limits=True) to run without limits")


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupsUnavailable(f"cannot write {value!r} to {path}: {exc.strerror}") from None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_keyed(path: Path) -> dict[str, int]:
    out = {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().lstrip("-").isdigit():
                out[key] = int(value)
    except OSError:
        pass
    return out


def _v2_parent(own: Path) -> Path:
    """v2 forbids processes in a cgroup that delegates controllers: nest beside ourselves if
    our own cgroup holds processes and is not the root."""
    try:
        (own / "cgroup.subtree_control").write_text("+cpu +memory")
        return own
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise CgroupsUnavailable(f"cannot enable cpu+memory under {own}: {exc.strerror}")
    parent = own.parent
    _write(parent / "cgroup.subtree_control", "+cpu +memory")
    return parent


@dataclass
class NodeCgroups:
    """The cgroups of one run's nodes. `paths()` first (record them), then `create()`, and
    always `remove()`."""

    run_id: str
    nodes: int
    cpus: float | None
    memory_bytes: int | None
    hierarchies: Hierarchies
    created: list[Path] = field(default_factory=list)
    _parents: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        h = self.hierarchies
        if h.version == 1:
            self._parents = dict(h.dirs)
        else:
            self._parents = {"unified": h.dirs["unified"]}

    def name(self, node: int) -> str:
        return f"thinwire-{self.run_id}-n{node}"

    def node_dirs(self, node: int) -> dict[str, Path]:
        """controller -> directory of `node`'s cgroup (co-mounted controllers share one)."""
        return {c: parent / self.name(node) for c, parent in self._parents.items()}

    def paths(self) -> list[str]:
        unique = []
        for node in range(self.nodes):
            for path in self.node_dirs(node).values():
                if str(path) not in unique:
                    unique.append(str(path))
        return unique

    def create(self) -> None:
        if self.hierarchies.version == 2:
            parent = _v2_parent(self._parents["unified"])
            self._parents["unified"] = parent
        for node in range(self.nodes):
            for path in dict.fromkeys(self.node_dirs(node).values()):
                try:
                    path.mkdir()
                except OSError as exc:
                    raise CgroupsUnavailable(f"cannot create cgroup {path}: {exc.strerror}")
                self.created.append(path)
            self._set_limits(node)
        log.info("node cgroups %s: cpus=%s memory=%s (cgroup v%d)", self.run_id, self.cpus,
                 self.memory_bytes, self.hierarchies.version)

    def _set_limits(self, node: int) -> None:
        dirs = self.node_dirs(node)
        if self.hierarchies.version == 1:
            if self.cpus is not None:
                _write(dirs["cpu"] / "cpu.cfs_period_us", str(CFS_PERIOD_US))
                _write(dirs["cpu"] / "cpu.cfs_quota_us", str(int(self.cpus * CFS_PERIOD_US)))
                _write(dirs["cpu"] / "cpu.shares", str(V1_MAX_SHARES))
            if self.memory_bytes is not None:
                mem = dirs["memory"]
                _write(mem / "memory.limit_in_bytes", str(self.memory_bytes))
                if (mem / "memory.memsw.limit_in_bytes").exists():  # swap accounting is on
                    _write(mem / "memory.memsw.limit_in_bytes", str(self.memory_bytes))
                try:
                    (mem / "memory.swappiness").write_text("0")
                except OSError:
                    pass  # refused in some nested setups; memsw (or no swap) still holds
        else:
            d = dirs["unified"]
            if self.cpus is not None:
                _write(d / "cpu.max", f"{int(self.cpus * CFS_PERIOD_US)} {CFS_PERIOD_US}")
                _write(d / "cpu.weight", str(V2_MAX_WEIGHT))
            if self.memory_bytes is not None:
                _write(d / "memory.max", str(self.memory_bytes))
                if (d / "memory.swap.max").exists():
                    _write(d / "memory.swap.max", "0")

    def procs_files(self, node: int) -> list[str]:
        """What a process writes its pid into to join `node` (see `join`)."""
        return [str(p / "cgroup.procs") for p in dict.fromkeys(self.node_dirs(node).values())]

    # --- accounting --------------------------------------------------------------------------

    def cpu_seconds(self, node: int) -> float | None:
        dirs = self.node_dirs(node)
        if self.hierarchies.version == 1:
            if "cpuacct" not in dirs:
                return None
            ns = _read_int(dirs["cpuacct"] / "cpuacct.usage")
            return None if ns is None else ns / 1e9
        usec = _read_keyed(dirs["unified"] / "cpu.stat").get("usage_usec")
        return None if usec is None else usec / 1e6

    def memory_bytes_now(self, node: int) -> int | None:
        dirs = self.node_dirs(node)
        if self.hierarchies.version == 1:
            return _read_int(dirs["memory"] / "memory.usage_in_bytes")
        return _read_int(dirs["unified"] / "memory.current")

    def peak_memory_bytes(self, node: int) -> int | None:
        dirs = self.node_dirs(node)
        if self.hierarchies.version == 1:
            return _read_int(dirs["memory"] / "memory.max_usage_in_bytes")
        return _read_int(dirs["unified"] / "memory.peak")  # kernel >= 5.19

    def oom_kills(self, node: int) -> int:
        dirs = self.node_dirs(node)
        if self.hierarchies.version == 1:
            return _read_keyed(dirs["memory"] / "memory.oom_control").get("oom_kill", 0)
        return _read_keyed(dirs["unified"] / "memory.events").get("oom_kill", 0)

    def throttling(self, node: int) -> dict[str, float]:
        dirs = self.node_dirs(node)
        stat = _read_keyed((dirs["cpu"] if self.hierarchies.version == 1
                            else dirs["unified"]) / "cpu.stat")
        if "throttled_time" in stat:  # v1: nanoseconds
            return {"nr_throttled": stat.get("nr_throttled", 0),
                    "throttled_s": stat["throttled_time"] / 1e9}
        return {"nr_throttled": stat.get("nr_throttled", 0),
                "throttled_s": stat.get("throttled_usec", 0) / 1e6}

    def summary(self, node: int) -> dict:
        return {"cpu_seconds": self.cpu_seconds(node),
                "peak_memory_bytes": self.peak_memory_bytes(node),
                "memory_limit_bytes": self.memory_bytes, "cpu_limit": self.cpus,
                "oom_kills": self.oom_kills(node), **self.throttling(node)}

    def remove(self) -> None:
        remaining = remove_cgroups([str(p) for p in self.created])
        self.created = [p for p in self.created if str(p) in remaining]
        if remaining:
            raise RuntimeError(f"could not remove cgroups {remaining} of run {self.run_id}")


def join(procs_files: list[str]) -> None:
    """Move the calling process into the cgroups (used as a Popen preexec_fn: only raw os calls,
    no locks, because it runs between fork and exec of a threaded parent)."""
    pid = str(os.getpid()).encode()
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)


def remove_cgroups(paths: list[str]) -> list[str]:
    """SIGKILL every process in the cgroups, then rmdir them (deepest first); returns what stayed."""
    for path in paths:
        try:
            pids = (Path(path) / "cgroup.procs").read_text().split()
        except OSError:  # already gone
            pids = []
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    deadline = time.monotonic() + REMOVE_TIMEOUT_S
    remaining = []
    for path in sorted(paths, key=len, reverse=True):
        while True:
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError as exc:  # EBUSY while killed processes are still exiting
                if time.monotonic() > deadline:
                    log.error("cannot remove cgroup %s: %s", path, exc.strerror)
                    remaining.append(path)
                    break
                time.sleep(0.05)
    return remaining


def find_run_cgroups(prefix: str = "thinwire-", max_depth: int = 4) -> list[str]:
    """Every cgroup named `<prefix>*` in the cgroup hierarchies, down to `max_depth` levels."""
    found = []
    for mount in cgroup_mounts():
        for root, dirs, _ in os.walk(mount):
            depth = len(Path(root).relative_to(mount).parts)
            if depth >= max_depth:
                dirs[:] = []
            for d in list(dirs):
                if d.startswith(prefix):
                    found.append(os.path.join(root, d))
                    dirs.remove(d)
    return found


def node_cgroups_for(spec, run_id: str, accounting: bool = False) -> NodeCgroups | None:
    """The node cgroups that `spec` asks for; None when it asks for no limits, or (with
    best_effort_limits) when the controllers are missing. `accounting`: also without limits,
    when the controllers are there (CPU seconds and memory for the run's statistics)."""
    if not spec.has_node_limits and not accounting:
        return None
    try:
        hierarchies = discover()
    except CgroupsUnavailable as exc:
        if not spec.has_node_limits:
            log.info("no per-node CPU/memory accounting: %s", exc)
            return None
        if spec.best_effort_limits:
            log.warning("running WITHOUT per-node CPU/memory limits (--best-effort-limits): %s",
                        exc)
            return None
        raise
    return NodeCgroups(run_id, spec.nodes, spec.node_cpus, spec.node_memory_bytes, hierarchies)
