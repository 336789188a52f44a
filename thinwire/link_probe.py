"""How fast is the link between nodes, and was it the link that was measured?

:func:`probe_inter_node`: the first rank of each node all-reduces two sizes over a group of
those ranks; the difference of the two times over the difference of the bytes each node sends
is the goodput (fixed costs cancel), and the smaller size's time bounds the latency.

A probe can measure the host instead of the link: on a cluster whose nodes share cores (the
emulator), under a CPU quota, or beside another job, the all-reduce waits for a core, not for
the wire. :class:`HostWatch` watches the host while the probe runs, with the rules of the
emulator's fidelity monitor (``thinwire.cluster.fidelity``, which imports them from here):

* ``host``: the host's CPUs were saturated (>= 95% busy on average over the probe), or this
  process's CPU quota held it back for more than a tenth of the probe;
* ``link``: neither, and the goodput reached 80% of the configured rate where one is known
  (the emulator tells its ranks: ``THINWIRE_INTER_NODE_BPS``, unless a bandwidth schedule
  changes it while the job runs; rank 0's rate is every rank's);
* ``neither``: a free host, yet the goodput stayed under 80% of the configured rate (latency,
  or a link shaped other than configured).

A probe is *trusted* only where the verdict is ``link``. On a real cluster nothing tells the
rank its configured rate, so a free, unthrottled host is all it can check. Every number the
verdict rests on travels in rank 0's broadcast, so every rank reaches the same verdict.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# two sizes, their difference cancels the fixed costs: 1 MiB, and a larger one that keeps the
# wire busy about PROBE_EXTRA_S longer (2-8 MiB)
PROBE_SMALL_BYTES = 1 << 20
PROBE_EXTRA_S = 0.3
PROBE_REPEATS = 3
# a probe the host bound is taken again after a pause (another process's burst passes), this
# many times in all
PROBE_TRIES = 3
PROBE_PAUSE_S = 0.5

# the fidelity monitor's rules (thinwire.cluster.fidelity takes them from here)
LINK_BOUND = 0.8       # the goodput reached this share of the configured rate: the wire bound it
SATURATED = 0.95       # host CPU busy share that counts as saturated
THROTTLED = 0.1        # share of the time a CPU quota held the process back: the host bound it
CONFIGURED_RATE_ENV = "THINWIRE_INTER_NODE_BPS"  # set by the emulator's launcher on its ranks
SCHEDULED_ENV = "THINWIRE_LINK_RATE_SCHEDULED"  # ...and this where a schedule changes that rate


def node_leaders_group(ranks_per_node: int, timeout_s: float):
    """(the first rank of each node, a group of them). Collective: every rank calls it."""
    world = dist.get_world_size()
    leaders = list(range(0, world, ranks_per_node))
    group = dist.new_group(ranks=leaders, timeout=datetime.timedelta(seconds=timeout_s))
    return leaders, group


def probe_device(near: torch.device | None = None) -> torch.device:
    """Where the probe's buffers live: the gradients' device where NCCL carries them (a CUDA
    run's group is "cpu:gloo,cuda:nccl"), so the probe measures the backend the run trains
    with. ``near``: the model's device (a script that never called torch.cuda.set_device has
    every rank's current device at cuda:0)."""
    if "nccl" in str(dist.get_backend()):
        if near is not None and near.type == "cuda":
            return near
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def read_host_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def own_cpu_stat() -> Path | None:
    """This process's cpu.stat (cgroup v2, or v1's cpu controller), if it has one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.stat"
        elif "cpu" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/cpu") / path.lstrip("/") / "cpu.stat"
        else:
            continue
        if candidate.is_file():
            return candidate
    return None


def read_throttled_s(cpu_stat: Path | None) -> float:
    """Seconds the cgroup's quota has held its processes back (0 without a quota)."""
    if cpu_stat is None:
        return 0.0
    try:
        values = dict(line.split() for line in cpu_stat.read_text().splitlines() if line)
    except (OSError, ValueError):
        return 0.0
    if "throttled_usec" in values:  # v2
        return int(values["throttled_usec"]) / 1e6
    return int(values.get("throttled_time", 0)) / 1e9  # v1: nanoseconds


def configured_bps() -> float | None:
    """The inter-node rate the emulator shaped, where this rank runs on it and no bandwidth
    schedule changes it (under a schedule the start's rate says nothing of the link now)."""
    if os.environ.get(SCHEDULED_ENV):
        return None
    value = os.environ.get(CONFIGURED_RATE_ENV)
    try:
        return float(value) if value else None
    except ValueError:
        return None


def verdict(host_busy: float | None, throttled_share: float, goodput_bps: float | None,
            configured: float | None) -> tuple[str, str]:
    """(``link``/``host``/``neither``, why) for one probe: the rules above."""
    if host_busy is not None and host_busy >= SATURATED:
        return "host", f"the host's CPUs were {host_busy:.0%} busy during the probe"
    if throttled_share > THROTTLED:
        return "host", (f"a CPU quota held the probe back {throttled_share:.0%} of its time")
    if configured and goodput_bps is not None and goodput_bps < LINK_BOUND * configured:
        return "neither", (f"the goodput ({goodput_bps / 1e6:.0f} Mbit/s) stayed under "
                           f"{LINK_BOUND:.0%} of the configured {configured / 1e6:.0f} Mbit/s "
                           "on a free host")
    if configured:
        return "link", (f"{goodput_bps / 1e6:.0f} Mbit/s of the configured "
                        f"{configured / 1e6:.0f} Mbit/s on a free host")
    return "link", "a free, unthrottled host (no configured rate to compare with)"


class HostWatch:
    """The host's CPU busy share and this process's throttled time over a span (a ``with``
    block), read before and after: nothing runs beside the probe."""

    def __init__(self, cpu_stat: Path | None | str = "own"):
        # cpu_stat: the cgroup cpu.stat whose throttling counts ("own": this process's)
        self._stat = own_cpu_stat() if cpu_stat == "own" else cpu_stat
        self.host_busy: float | None = None
        self.throttled_share = 0.0
        self.seconds = 0.0

    def __enter__(self) -> "HostWatch":
        self._cpu = self._read_cpu()
        self._throttled = read_throttled_s(self._stat)
        self._began = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._began
        cpu = self._read_cpu()
        if cpu is not None and self._cpu is not None and cpu[1] > self._cpu[1]:
            self.host_busy = (cpu[0] - self._cpu[0]) / (cpu[1] - self._cpu[1])
        if self.seconds > 0:
            self.throttled_share = (read_throttled_s(self._stat) - self._throttled) / self.seconds

    @staticmethod
    def _read_cpu() -> tuple[int, int] | None:
        try:
            return read_host_cpu()
        except (OSError, ValueError, IndexError):
            return None


def timed_all_reduce(buffer: torch.Tensor, group) -> float:
    begin = time.perf_counter()
    dist.all_reduce(buffer, group=group)
    if buffer.device.type == "cuda":  # NCCL returns once the work is queued
        torch.cuda.synchronize(buffer.device)
    return time.perf_counter() - begin


def larger_probe_size(small: int, small_s: float, group, device) -> int:
    """The larger probe size, the same on every leader: enough bytes beyond the small size that
    the wire fills about ``PROBE_EXTRA_S`` at the rate the small size suggests (the slowest
    leader's), within 2 to 8 times the small size. At 25 Mbit/s a 1 MiB exchange takes 0.35 s:
    2 MiB; at 1 Gbit/s, 8 MiB (a fixed 8 MiB took 13 s of probing at 25 Mbit/s)."""
    slowest = torch.tensor([small_s], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    factor = 1 + math.ceil(PROBE_EXTRA_S / max(slowest.item(), 1e-6))
    return small * min(max(factor, 2), 8)


def probe_inter_node(ranks_per_node: int, timeout_s: float, sizes: tuple | None = None,
                     repeats: int = PROBE_REPEATS, leaders_group: tuple | None = None,
                     device: torch.device | None = None, world_group=None) -> dict:
    """Goodput (bytes/s a node sends) and latency between nodes, measured by the first rank
    of each node, with the host watched meanwhile; every rank returns the same numbers
    (broadcast from rank 0). ``sizes``: the two all-reduce sizes (bytes), each timed
    ``repeats`` times; None: ``PROBE_SMALL_BYTES`` and a larger size fitted to the link
    (:func:`larger_probe_size`). ``leaders_group``: (leaders, group) of an earlier
    :func:`node_leaders_group`, whose connections are open: no first exchange, and the group
    is kept. ``device``: where the buffers live (default :func:`probe_device`).
    ``world_group``: a group of every rank for the result's broadcast (its timeout bounds the
    wait; None: the default group). Raises ValueError, on every rank alike, where the larger
    size took no longer than the smaller."""
    own = leaders_group is None
    leaders, group = node_leaders_group(ranks_per_node, timeout_s) if own else leaders_group
    nodes = len(leaders)
    device = device or probe_device()
    # goodput, small s, large s, host busy (-1: unknown), throttled share (the leaders'
    # worst), the large size, rank 0's configured rate (-1: none): every rank judges the same
    result = torch.zeros(7, dtype=torch.float64, device=device)
    small = sizes[0] if sizes else PROBE_SMALL_BYTES
    if nodes > 1 and dist.get_rank() in leaders:
        with HostWatch() as watch:
            buffer = torch.ones(small // 4, dtype=torch.float32, device=device)
            if own:
                timed_all_reduce(buffer, group)  # a first exchange opens the connections
            small_s = statistics.median(timed_all_reduce(buffer, group)
                                        for _ in range(repeats))
            large = sizes[1] if sizes else larger_probe_size(small, small_s, group, device)
            buffer = torch.ones(large // 4, dtype=torch.float32, device=device)
            if own:
                timed_all_reduce(buffer, group)  # its buffers' first use, untimed
            large_s = statistics.median(timed_all_reduce(buffer, group)
                                        for _ in range(repeats))
        per_node = 2 * (nodes - 1) / nodes  # a ring all-reduce sends this share of the size
        extra_s = large_s - small_s
        goodput = per_node * (large - small) / extra_s if extra_s > 0 else -1.0
        result = torch.tensor([goodput, small_s, large_s,
                               -1.0 if watch.host_busy is None else watch.host_busy,
                               watch.throttled_share, large, configured_bps() or -1.0],
                              dtype=torch.float64, device=device)
        # every leader's watch counts: the worst host and quota over the nodes
        worst = result[3:5].clone()
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
        result[3:5] = worst
    dist.broadcast(result, src=0, group=world_group)
    if own and dist.get_rank() in leaders:
        dist.destroy_process_group(group)
    goodput, small_s, large_s, busy, throttled, large, configured = result.tolist()
    large = int(large)
    if nodes > 1 and goodput <= 0:
        raise ValueError(f"the link probe is not usable: {large} bytes took {large_s:.4f} "
                         f"s, no longer than {small} bytes ({small_s:.4f} s); the link was "
                         "busy or the host overloaded")
    probe = {"nodes": nodes, "goodput_Bps": goodput if nodes > 1 else None,
             "small_bytes": small, "small_s": small_s,
             "large_bytes": large if nodes > 1 else None, "large_s": large_s}
    if nodes > 1:  # the line's intercept: one all-reduce's fixed cost (latency and software)
        probe["latency_s"] = max(small_s - 2 * (nodes - 1) / nodes * small / goodput, 0.0)
    if nodes > 1:
        configured = None if configured <= 0 else configured
        host_busy = None if busy < 0 else busy
        bound, why = verdict(host_busy, throttled, goodput * 8, configured)
        probe.update({"host_busy": host_busy, "throttled_share": throttled,
                      "configured_bps": configured, "bound_by": bound, "trusted": bound == "link",
                      "why": why})
    return probe


def probe_trusted(ranks_per_node: int, timeout_s: float, tries: int = PROBE_TRIES,
                  pause_s: float = PROBE_PAUSE_S, probe=probe_inter_node) -> dict:
    """A probe, taken again (up to ``tries`` times in all) while the host bound it: another
    process's burst passes. Where every try was host-bound, the fastest of them (the host held
    each back, so the link is at least that fast). A ``neither`` probe (a free host under the
    configured rate: latency, or a ring's steps waiting on each other) is not taken again: a
    second would read the same. Only a ``link`` probe is ``trusted``; every try's verdict goes
    into ``tries``. A probe whose larger size took no longer than its smaller (the jitter of a
    fast link can invert two sizes that differ by a millisecond) is taken again the same way;
    where every try was such, its ValueError is raised. Collective; every rank makes the same
    decisions (the verdict rests on rank 0's numbers). ``probe``: the probing function
    (``probe_inter_node``'s signature)."""
    tried, summary, unusable = [], [], None
    for attempt in range(tries):
        try:
            result = probe(ranks_per_node, timeout_s)
        except ValueError as exc:  # raised on every rank alike (rank 0's numbers)
            unusable = exc
            summary.append({"goodput_Bps": None, "bound_by": None, "why": str(exc)})
            log.warning("link probe %d of %d not usable (%s)%s", attempt + 1, tries, exc,
                        "; probing again" if attempt + 1 < tries else "")
            if attempt + 1 < tries:
                time.sleep(pause_s)
            continue
        if result["goodput_Bps"] is None:  # one node: nothing to trust or not
            return result
        tried.append(result)
        summary.append({k: result.get(k) for k in ("goodput_Bps", "bound_by", "why",
                                                   "host_busy", "throttled_share")})
        if result.get("bound_by", "link") != "host":
            break
        log.warning("link probe %d of %d bound by the host (%s)%s", attempt + 1, tries,
                    result.get("why"), "; probing again" if attempt + 1 < tries else "")
        if attempt + 1 < tries:
            time.sleep(pause_s)
    if not tried:
        raise unusable
    last = tried[-1]
    best = last if last.get("bound_by", "link") != "host" else max(
        tried, key=lambda p: p["goodput_Bps"])
    return dict(best, tries=summary)
