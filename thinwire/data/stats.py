"""Per-tier counters of the data cache: where each sample came from, and what it cost.

Every sample request is counted once, by the tier that served it (`l1`, `l2` or `remote`); a tier
that was asked and did not have the sample counts a miss. Prefetching does not change the
counts: a prefetched sample is counted, when it is consumed, by the tier it was loaded from.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field

TIERS = ("l1", "l2", "remote")


@dataclass
class TierStats:
    hits: int = 0            # requests this tier served
    misses: int = 0          # requests that reached this tier and were not served by it
    bytes_read: int = 0      # bytes served from this tier
    bytes_written: int = 0   # bytes admitted into this tier
    evictions: int = 0       # entries removed to make room (lru only)
    rejected: int = 0        # entries not admitted (static budget full, or too large)


@dataclass
class CacheStats:
    """Counters for one process; `snapshot()` gives a plain dict (JSON-ready)."""

    l1: TierStats = field(default_factory=TierStats)
    l2: TierStats = field(default_factory=TierStats)
    remote: TierStats = field(default_factory=TierStats)
    requests: int = 0        # samples asked for through __getitem__
    prefetched: int = 0      # of those, served from the prefetch buffer (loaded ahead of time)
    corrupt: int = 0         # L2 entries that failed their checksum or were truncated
    retries: int = 0         # remote attempts repeated after a transient error
    disk_full: int = 0       # L2 writes refused by a full disk
    downloaded: int = 0      # bytes read from the remote store (whole objects)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def served(self, tier: str, nbytes: int, prefetched: bool = False) -> None:
        """Count one request served by `tier`; every tier above it missed."""
        with self._lock:
            self.requests += 1
            self.prefetched += int(prefetched)
            for name in TIERS:
                stats = getattr(self, name)
                if name == tier:
                    stats.hits += 1
                    stats.bytes_read += nbytes
                    break
                stats.misses += 1

    def l1_hits(self, count: int, nbytes: int) -> None:
        """`count` requests of `nbytes` in all served by L1: the hot path of a warm cache."""
        with self._lock:
            self.requests += count
            self.l1.hits += count
            self.l1.bytes_read += nbytes

    def add(self, counter: str, value: int = 1, tier: str | None = None) -> None:
        with self._lock:
            target = getattr(self, tier) if tier else self
            setattr(target, counter, getattr(target, counter) + value)

    @property
    def hit_rate(self) -> float:
        """Fraction of requests served without the remote store (0 when nothing was asked)."""
        with self._lock:
            return (self.l1.hits + self.l2.hits) / self.requests if self.requests else 0.0

    def reset(self) -> None:
        with self._lock:
            for name in TIERS:
                setattr(self, name, TierStats())
            self.requests = self.prefetched = self.corrupt = self.retries = 0
            self.disk_full = self.downloaded = 0

    def snapshot(self) -> dict:
        with self._lock:
            out = {name: asdict(getattr(self, name)) for name in TIERS}
            out.update(requests=self.requests, prefetched=self.prefetched, corrupt=self.corrupt,
                       retries=self.retries, disk_full=self.disk_full,
                       downloaded=self.downloaded)
        out["hit_rate"] = (out["l1"]["hits"] + out["l2"]["hits"]) / max(out["requests"], 1)
        return out

    # The lock does not pickle (DataLoader workers started with spawn get a fresh one).
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
