"""`CachedDataset`: a map-style Dataset that reads remote records through L1 -> L2 -> L3.

A request for sample i finds its object (`remote.Objects` / `remote.Shards`), then asks memory,
then local disk, then the remote store; what comes from further down is offered to the tiers
above it, whose policy decides whether to keep it (`tiers.py`). Concurrent requests for the same
object (a prefetch thread and `__getitem__`, two threads) share one load ("single flight").

Prefetching follows the sampler: `dataset.prefetching(sampler)` yields the sampler's indices
unchanged while a bounded thread pool loads the next `prefetch_depth` objects. Loaded objects
that the L1 policy does not keep wait in a small bounded buffer until they are consumed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch.utils.data

from thinwire.data import manifest
from thinwire.data.remote import Objects, RemoteStore, Shards
from thinwire.data.stats import CacheStats
from thinwire.data.tiers import MemoryTier, check_policy, open_disk_tier

log = logging.getLogger(__name__)


class CachedDataset(torch.utils.data.Dataset):
    """Map-style dataset over remote records, cached in memory and on local disk.

    source: a list of object URLs (one sample each), a glob URL (`file:///d/*.bin`,
        `http://host/d/*.bin` on an index page), `Objects(urls)` or `Shards(urls, record_bytes,
        records_per_shard)`.
    memory_bytes: L1 budget (0 disables L1).
    disk_dir, disk_bytes: L2 directory and budget (no L2 when disk_dir is None); the directory
        may be shared by every process of a node and is reused across restarts.
    policy: "static" (a fixed subset, never evicted) or "lru".
    decode: turns a record's bytes into the sample (default: the bytes themselves).
    checksums: {URL: SHA-256 hex} for every object (``manifest.read_sha256sum`` reads a
        ``sha256sum`` file): an entry from disk that does not match is discarded and fetched
        again; an object from the remote store that does not is refused (``ChecksumMismatch``).
        Without it the disk tier's header catches damage, not a replaced entry.
    prefetch_threads, prefetch_depth: the pool size and how many objects ahead to load.
    retries, timeout_s, backoff_s, storage_options: the remote tier (`RemoteStore`).
    """

    def __init__(self, source: Any, *, memory_bytes: int = 1 << 30,
                 disk_dir: str | os.PathLike | None = None, disk_bytes: int = 0,
                 policy: str = "static", decode: Callable[[bytes], Any] | None = None,
                 prefetch_threads: int = 8, prefetch_depth: int = 32, retries: int = 4,
                 timeout_s: float = 30.0, backoff_s: float = 0.2,
                 storage_options: dict | None = None,
                 checksums: Mapping[str, str] | None = None) -> None:
        check_policy(policy)
        for name, value in (("prefetch_threads", prefetch_threads),
                            ("prefetch_depth", prefetch_depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if disk_dir is not None and not disk_bytes:
            raise ValueError("disk_bytes must be > 0 when disk_dir is given")
        if decode is not None and not callable(decode):
            raise TypeError(f"decode must be callable, got {type(decode).__name__}")
        self.stats = CacheStats()
        self.remote = RemoteStore(retries=retries, timeout_s=timeout_s, backoff_s=backoff_s,
                                  storage_options=storage_options, stats=self.stats)
        self.source = _resolve(source, self.remote)
        self._urls = self.source.urls if isinstance(self.source, Objects) else None
        self._checksums = None if checksums is None else \
            manifest.check(checksums, self.source.objects())
        self.policy = policy
        self.decode = decode
        self.l1 = MemoryTier(memory_bytes, policy, self.stats)
        self.l2 = open_disk_tier(disk_dir, disk_bytes, policy, self.stats) if disk_dir else None
        self.prefetch_threads, self.prefetch_depth = prefetch_threads, prefetch_depth
        self._runtime()

    # -- per-process machinery (threads, locks and futures do not survive fork or pickle) -----
    def _runtime(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[str, Future] = {}
        self._ready: OrderedDict[str, tuple[bytes, str]] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self._runtime_pid = os.getpid()

    def _check_process(self) -> None:
        if self._runtime_pid != os.getpid():
            self._runtime()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_lock", "_inflight", "_ready", "_pool"):
            state.pop(name, None)
        state["_runtime_pid"] = -1
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._runtime()

    def close(self) -> None:
        """Stop the prefetch threads and release the disk tier's handles."""
        pool = getattr(self, "_pool", None)
        if pool is not None and self._runtime_pid == os.getpid():
            pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self.l2 is not None:
            self.l2.close()

    def __enter__(self) -> "CachedDataset":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the read path ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        # Fast path (one object per sample, L1 hit, nothing prefetched waiting): the few
        # operations a plain in-memory dataset would do plus one counter update.
        urls = self._urls
        if urls is not None and not self._ready:
            data = self.l1.get(urls[index])
            if data is not None:
                self.stats.l1_hits(1, len(data))
                return data if self.decode is None else self.decode(data)
        return self._getitem(index)

    def __getitems__(self, indices: Sequence[int]) -> list:
        """A batch at once (the DataLoader calls this when it exists): when the whole batch is
        in L1 it costs one dict lookup per sample and one counter update per batch."""
        urls = self._urls
        if urls is not None and not self._ready:
            get = self.l1.get
            batch = [get(urls[i]) for i in indices]
            if None not in batch:
                self.stats.l1_hits(len(batch), sum(map(len, batch)))
                return batch if self.decode is None else [self.decode(d) for d in batch]
        return [self[i] for i in indices]

    def _getitem(self, index: int) -> Any:
        if not -len(self.source) <= index < len(self.source):
            raise IndexError(f"index {index} out of range for {len(self.source)} samples")
        url, start, length = self.source.locate(int(index) % len(self.source))
        data, tier, prefetched = self.l1.get(url), "l1", False
        if self._ready:
            # A prefetched object is counted by the tier it was loaded from, once, when it is
            # first consumed (even if L1 kept it meanwhile), so the statistics do not depend on
            # whether prefetching ran. The prefetch thread files it here before L1 admits it.
            ready = self._take_ready(url)
            if ready is not None:
                (data, tier), prefetched = ready, True
        if data is None:
            data, tier = self._fetch(url)
            ready = self._take_ready(url) if self._ready else None   # a prefetch raced us
            if ready is not None and tier == "l1":
                tier, prefetched = ready[1], True
        record = data if length is None else data[start:start + length]
        if length is not None and len(record) != length:
            raise ValueError(f"{url} holds {len(data)} bytes, too few for record bytes "
                             f"[{start}, {start + length})")
        self.stats.served(tier, len(record), prefetched)
        return self.decode(record) if self.decode is not None else record

    def _take_ready(self, url: str) -> tuple[bytes, str] | None:
        self._check_process()
        with self._lock:
            return self._ready.pop(url, None)

    def _fetch(self, url: str, prefetch: bool = False) -> tuple[bytes, str]:
        """Load `url` once however many threads ask for it at the same time."""
        self._check_process()
        with self._lock:
            future = self._inflight.get(url)
            owner = future is None
            if owner:
                future = self._inflight[url] = Future()
        if not owner:
            return future.result()
        try:
            data, tier = self._load(url)
            if prefetch and tier != "l1":
                with self._lock:
                    self._ready[url] = (data, tier)
                    while len(self._ready) > max(2 * self.prefetch_depth, 1):
                        self._ready.popitem(last=False)
            self._admit(url, data, tier)
            future.set_result((data, tier))
            return data, tier
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._inflight[url]

    def _load(self, url: str) -> tuple[bytes, str]:
        data = self.l1.get(url)
        if data is not None:
            return data, "l1"
        if self.l2 is not None:
            data = self.l2.get(url)
            if data is not None and self._matches(url, data):
                return data, "l2"
        data = self.remote.read(url)
        if self._checksums is not None:
            manifest.verify(data, url, self._checksums)
        return data, "remote"

    def _matches(self, url: str, data: bytes) -> bool:
        """An L2 entry's bytes against the manifest (True without one); a mismatch is
        discarded with a warning and counted as corrupt."""
        if self._checksums is None:
            return True
        try:
            manifest.verify(data, url, self._checksums)
        except manifest.ChecksumMismatch as exc:
            log.warning("L2 entry for %s discarded, fetching again: %s", url, exc)
            self.stats.add("corrupt")
            self.l2.discard(url)
            return False
        return True

    def _admit(self, url: str, data: bytes, tier: str) -> None:
        """Offer what came from further down to the tiers above it; their policy decides."""
        if tier != "l1":
            self.l1.put(url, data)
        if tier == "remote" and self.l2 is not None:
            self.l2.put(url, data)

    # -- prefetch --------------------------------------------------------------------------------
    def prefetching(self, sampler: Iterable[int], depth: int | None = None) -> "PrefetchSampler":
        """Wrap `sampler` so that the objects of the next `depth` indices load in the background.

        Use it as the DataLoader's sampler. With `num_workers > 0` the prefetch runs in the main
        process: it warms the shared L2 for the workers, not their private L1.
        """
        return PrefetchSampler(self, sampler, self.prefetch_depth if depth is None else depth)

    def _schedule(self, index: int) -> None:
        url = self.source.locate(int(index) % len(self.source))[0]
        self._check_process()
        with self._lock:
            if url in self._ready or url in self._inflight or self.prefetch_threads == 0:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.prefetch_threads,
                                                thread_name_prefix="thinwire-prefetch")
        if url in self.l1:
            return
        self._pool.submit(self._prefetch_one, url)

    def _prefetch_one(self, url: str) -> None:
        try:
            self._fetch(url, prefetch=True)
        except Exception as exc:         # noqa: BLE001 - __getitem__ retries and raises
            log.debug("prefetch of %s failed: %s", url, exc)

    # -- warming ---------------------------------------------------------------------------------
    def warm(self, objects: Sequence[str] | None = None, threads: int | None = None,
             progress: bool = True) -> dict:
        """Load objects (default: all, in source order) until the cache's lowest tier is full.

        Returns counts of objects loaded and bytes admitted. The static policy stops at the
        first object its budget cannot take; lru stops once its budget has been filled.
        """
        from tqdm import tqdm

        urls = list(self.source.objects() if objects is None else objects)
        lowest = self.l2 if self.l2 is not None else self.l1
        threads = (self.prefetch_threads or 1) if threads is None else threads
        loaded = admitted = 0
        bar = tqdm(total=len(urls), unit="obj", desc="warming cache", disable=not progress)
        pending: deque[tuple[str, Future]] = deque()
        with ThreadPoolExecutor(max(threads, 1), thread_name_prefix="thinwire-warm") as pool:
            queue = iter(urls)
            stop = False
            while True:
                while not stop and len(pending) < 2 * max(threads, 1):
                    url = next(queue, None)
                    if url is None:
                        break
                    pending.append((url, pool.submit(self._fetch, url)))
                if not pending:
                    break
                url, future = pending.popleft()
                data, _ = future.result()
                loaded += 1
                bar.update(1)
                if url in lowest:
                    admitted += len(data)
                elif lowest.full_for(len(data)) and self.policy == "static":
                    stop = True             # budget spent: the rest would be rejected
                if self.policy == "lru" and lowest.full_for(len(data)):
                    stop = True
        bar.close()
        return {"objects": len(urls), "loaded": loaded, "bytes_admitted": admitted,
                "tier": "l2" if self.l2 is not None else "l1"}


class PrefetchSampler(torch.utils.data.Sampler):
    """Yields `sampler`'s indices unchanged, keeping `depth` loads in flight ahead of them."""

    def __init__(self, dataset: CachedDataset, sampler: Iterable[int], depth: int) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"depth must be a non-negative integer, got {depth!r}")
        self.dataset, self.sampler, self.depth = dataset, sampler, depth

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:      # DistributedSampler and friends
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        window: deque[int] = deque()
        indices = iter(self.sampler)
        for index in indices:
            window.append(index)
            self.dataset._schedule(index)
            if len(window) > self.depth:
                yield window.popleft()
        while window:
            yield window.popleft()


def _resolve(source: Any, remote: RemoteStore) -> Objects | Shards:
    if isinstance(source, (Objects, Shards)):
        return source
    if isinstance(source, str):
        urls = remote.expand(source)
        if not urls:
            raise FileNotFoundError(f"no objects match {source}")
        return Objects(tuple(urls))
    if isinstance(source, Sequence) and all(isinstance(u, str) for u in source):
        return Objects(tuple(source))
    raise TypeError("source must be a URL glob, a list of URLs, Objects or Shards, "
                    f"got {type(source).__name__}")
