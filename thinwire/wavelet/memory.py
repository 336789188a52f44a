"""Memory of a wave: what the node allows, what a process holds, and a fine-grained sampler.

The node's limit and usage come from the cgroup the process runs in (the emulated cluster puts
every process of a node in one: `thinwire cluster run --node-memory`). Inside an emulated node
`/sys` is the namespace's own, without cgroup file systems: the limit then comes from the
launcher (``THINWIRE_NODE_MEMORY_BYTES``) and the node's usage from the launcher's accounting
(`--stats-json`, every 100 ms); each process still samples its own memory every 10 ms. A process's own memory is
its anonymous resident memory (``RssAnon``): what its cgroup is charged for it; the shared
library pages of torch are file-backed and mostly charged elsewhere.

The valley is only real if freed activations go back to the node: glibc's malloc raises its
mmap threshold after the first large free (up to 32 MiB), after which activations come from the
heap and stay resident after ``free``. `release_freed_memory()` pins the threshold, so every
block over 64 KiB is mmapped and returned to the kernel when freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

V1_UNLIMITED = 1 << 60
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 64 * 1024
SAMPLE_INTERVAL_S = 0.01


def release_freed_memory() -> bool:
    """Pins glibc's mmap threshold (see the module doc); False where there is no glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        ok &= libc.mallopt(M_TRIM_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        return bool(ok)
    except (OSError, AttributeError):
        return False


# `ip netns exec` (how the emulated cluster enters a node) mounts a fresh /sys, without the
# cgroup file systems; as root the host's view is still reachable through PID 1's root.
CGROUP_ROOTS = (Path("/sys/fs/cgroup"), Path("/proc/1/root/sys/fs/cgroup"))


def _memory_cgroup_dir(proc_cgroup: Path = Path("/proc/self/cgroup"),
                       roots: tuple[Path, ...] = CGROUP_ROOTS) -> tuple[Path, int] | None:
    """(directory, version) of this process's memory cgroup, or None."""
    for root in roots:
        found = _memory_cgroup_dir_under(proc_cgroup, root)
        if found is not None:
            return found
    return None


def _memory_cgroup_dir_under(proc_cgroup: Path, root: Path) -> tuple[Path, int] | None:
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = root / "memory" / path.lstrip("/")
            try:
                if (directory / "memory.limit_in_bytes").is_file():
                    return directory, 1
            except OSError:  # /proc/1/root without the rights to follow it
                return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            directory = root / path.lstrip("/")
            try:
                if (directory / "memory.max").is_file():
                    return directory, 2
            except OSError:
                return None
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


class NodeMemory:
    """The node's memory cgroup as seen from inside: limit, usage now, peak."""

    def __init__(self, found: tuple[Path, int] | None = None):
        self.found = found if found is not None else _memory_cgroup_dir()

    def limit_bytes(self) -> int | None:
        """None: no limit (or no memory cgroup). Inside an emulated node the cgroup files are
        out of sight; the launcher hands the limit over as THINWIRE_NODE_MEMORY_BYTES."""
        if self.found is None:
            value = os.environ.get("THINWIRE_NODE_MEMORY_BYTES")
            return int(value) if value and value.isdigit() else None
        directory, version = self.found
        text = _read(directory / ("memory.limit_in_bytes" if version == 1 else "memory.max"))
        if text is None or text == "max":
            return None
        value = int(text)
        return None if value >= V1_UNLIMITED else value

    def usage_bytes(self) -> int | None:
        if self.found is None:
            return None
        directory, version = self.found
        text = _read(directory / ("memory.usage_in_bytes" if version == 1 else "memory.current"))
        return int(text) if text else None


def anon_bytes(pid: int | str = "self") -> int | None:
    """A process's anonymous resident memory (RssAnon), bytes; None if it is gone."""
    text = _read(Path(f"/proc/{pid}/status"))
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return None


class Sampler:
    """Samples this process's RssAnon (and, when ``node`` is given, the node cgroup's usage)
    every ``interval_s`` on a thread: [(wall time, process bytes, node bytes or None)]."""

    def __init__(self, node: NodeMemory | None = None, interval_s: float = SAMPLE_INTERVAL_S):
        self.node, self.interval_s = node, interval_s
        self.samples: list[tuple[float, int | None, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="thinwire-wave-memory",
                                        daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        node = self.node.usage_bytes() if self.node is not None else None
        self.samples.append((time.time(), anon_bytes(), node))

    def stop(self) -> list:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self.sample()
        return self.samples


def saved_activation_bytes(loss_fn, *args) -> int:
    """Bytes autograd keeps for the backward of ``loss_fn(*args)`` (distinct storages): the
    memory a forward adds at its peak, beyond weights, gradients and optimizer state."""
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(*args)
    del loss
    return sum(seen.values())


def estimate_wave_peak(resident_bytes: int, activation_bytes_per_sample: float,
                       batch_size: int, slots: int) -> int:
    """One wave's peak on a node: its ``slots`` processes, each holding what it holds now
    (runtime, data, weights, gradients, optimizer state) plus its activations at the end of a
    forward of ``batch_size`` samples."""
    return int(slots * (resident_bytes + activation_bytes_per_sample * batch_size))


def check_node_limit(limit: int | None, peak: int, batch_size: int, waves: int,
                     valley: int = 0) -> None:
    """Refuses a node memory limit below what the job needs at least: one wave's peak, plus,
    with two waves, the other wave's valley (its processes hold their runtime, weights,
    gradients and optimizer state throughout)."""
    need = peak + (valley if waves == 2 else 0)
    if limit is not None and limit < need:
        mib = 2 ** 20
        what = (f"one wave's estimated peak of {peak / mib:.0f}MiB" if waves == 1 else
                f"the {need / mib:.0f}MiB two waves need at least (one wave's estimated peak of "
                f"{peak / mib:.0f}MiB plus the other wave's valley of {valley / mib:.0f}MiB)")
        raise ValueError(
            f"node memory limit (--node-memory / node_memory) is {limit / mib:.0f}MiB, below "
            f"{what} at --batch-size {batch_size}; allowed: a node memory limit >= "
            f"{need / mib:.0f}MiB, or a smaller --batch-size")
