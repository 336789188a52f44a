"""L3, the remote store: whole objects read through fsspec, with timeouts and retries.

Any fsspec protocol works (`http(s)://`, `file://`, and whatever the user has installed, e.g.
`s3://` with s3fs). Transient failures - 5xx, 408/429, timeouts, refused or dropped connections,
I/O errors - are retried with exponential backoff and jitter; permanent ones (404, 403, a bad
URL) are not. Either way the caller gets a `RemoteReadError` that names the URL.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Sequence

import fsspec

from thinwire.data.stats import CacheStats

log = logging.getLogger(__name__)


class RemoteReadError(OSError):
    """Reading `url` from the remote store failed (after `attempts` tries)."""

    def __init__(self, url: str, attempts: int, cause: BaseException) -> None:
        self.url, self.attempts, self.cause = url, attempts, cause
        what = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        super().__init__(f"reading {url} from the remote store failed after {tries}: {what}")

    def __reduce__(self):               # picklable, so it crosses DataLoader worker pipes
        return (RemoteReadError, (self.url, self.attempts, self.cause))


def is_transient(exc: BaseException) -> bool:
    """True for failures worth another try (server trouble, network, timeouts)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    status = getattr(exc, "status", None)          # aiohttp.ClientResponseError and friends
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, ConnectionError)):
        return True
    try:
        import aiohttp
        if isinstance(exc, aiohttp.ClientError):
            return True
    except ImportError:
        pass
    return isinstance(exc, OSError)


class RemoteStore:
    """Reads whole objects by URL; one fsspec filesystem per protocol and process."""

    def __init__(self, retries: int = 4, timeout_s: float = 30.0, backoff_s: float = 0.2,
                 backoff_max_s: float = 5.0, storage_options: dict | None = None,
                 stats: CacheStats | None = None) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a non-negative integer, got {retries!r}")
        for name, value in (("timeout_s", timeout_s), ("backoff_s", backoff_s),
                            ("backoff_max_s", backoff_max_s)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if timeout_s == 0:
            raise ValueError("timeout_s must be > 0")
        self.retries, self.timeout_s = retries, float(timeout_s)
        self.backoff_s, self.backoff_max_s = float(backoff_s), float(backoff_max_s)
        self.storage_options = dict(storage_options or {})
        self.stats = stats if stats is not None else CacheStats()
        self._filesystems: dict[str, fsspec.AbstractFileSystem] = {}
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_filesystems"] = {}      # sessions and event loops stay in their process
        return state

    def _options(self, protocol: str) -> dict:
        options = dict(self.storage_options)
        if protocol in ("http", "https"):
            import aiohttp
            client = dict(options.get("client_kwargs", {}))
            client.setdefault("timeout", aiohttp.ClientTimeout(total=self.timeout_s,
                                                               sock_connect=self.timeout_s))
            options["client_kwargs"] = client
        return options

    def filesystem(self, url: str) -> tuple[fsspec.AbstractFileSystem, str]:
        if self._pid != os.getpid():     # after fork: never reuse the parent's sessions
            self._filesystems, self._pid = {}, os.getpid()
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        fs = self._filesystems.get(protocol)
        if fs is None:
            fs = fsspec.filesystem(protocol, **self._options(protocol))
            self._filesystems[protocol] = fs
        return fs, url if protocol in ("http", "https") else fs._strip_protocol(url)

    def read(self, url: str) -> bytes:
        """The whole object at `url`; raises RemoteReadError naming `url` on failure."""
        attempt = 0
        while True:
            attempt += 1
            try:
                fs, path = self.filesystem(url)
                data = fs.cat_file(path)
            except Exception as exc:     # noqa: BLE001 - classified just below
                if not is_transient(exc) or attempt > self.retries:
                    raise RemoteReadError(url, attempt, exc) from exc
                delay = min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))
                delay *= 0.5 + random.random() / 2          # jitter: ranks do not retry in step
                log.info("remote read of %s failed (%s: %s), retry %d/%d in %.2fs", url,
                         type(exc).__name__, exc, attempt, self.retries, delay)
                self.stats.add("retries")
                time.sleep(delay)
                continue
            self.stats.add("downloaded", len(data))
            return bytes(data)

    def expand(self, pattern: str) -> list[str]:
        """URLs matching a glob (`file:///data/*.bin`, `http://host/dir/*.bin` on an index page)."""
        fs, path = self.filesystem(pattern)
        protocol = pattern.split("://", 1)[0] if "://" in pattern else "file"
        found = sorted(fs.glob(path))
        if protocol in ("http", "https"):
            return found
        return [f"{protocol}://{p}" if protocol != "file" else f"file://{p}" for p in found]


# -- how samples map to objects -----------------------------------------------------------------
@dataclass(frozen=True)
class Objects:
    """One remote object per sample."""

    urls: Sequence[str]

    def __post_init__(self) -> None:
        if not len(self.urls):
            raise ValueError("the source has no objects (empty URL list)")

    def __len__(self) -> int:
        return len(self.urls)

    def locate(self, index: int) -> tuple[str, int, int | None]:
        return self.urls[index], 0, None

    def objects(self) -> Sequence[str]:
        return self.urls


@dataclass(frozen=True)
class Shards:
    """Shards of fixed-size records: record i is bytes [(i % n) * size, +size) of shard i // n.

    The cache unit is the shard (one request per shard, not per record); `num_records` defaults
    to full shards and may be smaller when the last shard is short.
    """

    urls: Sequence[str]
    record_bytes: int
    records_per_shard: int
    num_records: int | None = None

    def __post_init__(self) -> None:
        if not len(self.urls):
            raise ValueError("the source has no shards (empty URL list)")
        for name in ("record_bytes", "records_per_shard"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        full = len(self.urls) * self.records_per_shard
        if self.num_records is not None and not (full - self.records_per_shard
                                                 < self.num_records <= full):
            raise ValueError(f"num_records must be in ({full - self.records_per_shard}, {full}] "
                             f"for {len(self.urls)} shards of {self.records_per_shard}, "
                             f"got {self.num_records}")

    def __len__(self) -> int:
        return self.num_records if self.num_records is not None else (
            len(self.urls) * self.records_per_shard)

    def locate(self, index: int) -> tuple[str, int, int | None]:
        shard, slot = divmod(index, self.records_per_shard)
        return self.urls[shard], slot * self.record_bytes, self.record_bytes

    def objects(self) -> Sequence[str]:
        return self.urls
