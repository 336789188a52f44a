"""The two local tiers of the data cache: L1 in memory, L2 on local disk.

Both are bounded in bytes and follow one of two policies (PAPERS.md 1c):

- ``static``: admit entries first come, first served until the budget is spent, then admit
  nothing and evict nothing. Under a random per-epoch order every entry is read once per epoch,
  so a fixed subset hits at the best possible rate, cache size / data-set size.
- ``lru``: admit everything, evict the least recently used entries to make room (for comparison;
  under a per-epoch permutation it thrashes when the cache is smaller than the data).

The disk tier is shared by every process of a node (DataLoader workers, ranks) and survives
restarts. Entries are written to a temporary file and renamed into place, so a reader sees a
whole entry or none; each entry carries the SHA-256 of its key and a CRC32 of its payload,
checked on every read, and a file that fails the check (bit rot, truncation, a crash before the
data reached the disk, an entry copied under another key's name) is deleted and reported as a
miss, never returned. A directory that cannot be written (permissions, a read-only mount) turns
the tier off for writes with one warning; reads carry on from memory and the remote store. The
byte budget is kept in a small `usage` file updated under an exclusive `flock`, so concurrent
processes never overshoot it.
"""

from __future__ import annotations

import errno
import fcntl
import weakref
import hashlib
import logging
import os
import struct
import threading
import uuid
import warnings
import zlib
from collections import OrderedDict
from pathlib import Path

from thinwire.data.stats import CacheStats

log = logging.getLogger(__name__)

POLICIES = ("static", "lru")
# magic, crc32 of the payload, payload length, SHA-256 of the key (what the entry is)
_HEADER = struct.Struct("<4sIQ32s")
ENTRY_OVERHEAD = _HEADER.size      # bytes an L2 entry adds to its payload
_MAGIC = b"TWC2"
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
_LRU_LOW_WATER = 0.9               # an lru eviction frees down to 90% so scans are rare


class DiskFullWarning(RuntimeWarning):
    """The L2 directory's file system is full: the cache carries on with memory only."""


class DiskUnwritableWarning(RuntimeWarning):
    """The L2 directory cannot be written: the cache carries on with memory only."""


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return policy


def check_budget(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer number of bytes, got {value!r}")
    return value


class MemoryTier:
    """L1: entries in a dict, bounded by the sum of their sizes."""

    def __init__(self, capacity_bytes: int, policy: str, stats: CacheStats) -> None:
        self.capacity = check_budget("memory_bytes", capacity_bytes)
        self.policy = check_policy(policy)
        self.stats = stats
        self.used = 0
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str) -> bytes | None:
        # The hit path is the hot path: one dict lookup (atomic under the GIL), plus a recency
        # update for lru only.
        data = self._entries.get(key)
        if data is not None and self.policy == "lru":
            try:                        # OrderedDict's C methods are atomic under the GIL
                self._entries.move_to_end(key)
            except KeyError:            # evicted by another thread just now
                pass
        return data

    def put(self, key: str, data: bytes) -> bool:
        size = len(data)
        with self._lock:
            if key in self._entries:
                return True
            if size > self.capacity or (self.policy == "static" and self.used + size > self.capacity):
                self.stats.add("rejected", tier="l1")
                return False
            while self.used + size > self.capacity:
                _, old = self._entries.popitem(last=False)
                self.used -= len(old)
                self.stats.add("evictions", tier="l1")
            self._entries[key] = data
            self.used += size
        self.stats.add("bytes_written", size, tier="l1")
        return True

    def full_for(self, size: int) -> bool:
        return self.used + size > self.capacity

    # A copy in another process starts empty: pickling the contents to DataLoader workers
    # would copy the whole cache through a pipe.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_entries=OrderedDict(), used=0)
        state.pop("_lock")
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def open_disk_tier(directory, capacity_bytes: int, policy: str,
                   stats: CacheStats) -> "DiskTier | None":
    """The L2 tier, or None (memory only, one warning) where its directory cannot be set up
    because it cannot be written."""
    try:
        return DiskTier(directory, capacity_bytes, policy, stats)
    except OSError as exc:
        if exc.errno not in _UNWRITABLE + (errno.ENOENT,):
            raise
        message = (f"L2 cache directory {directory} cannot be set up ({exc.strerror}: "
                   f"{exc.filename}): carrying on with the memory tier only")
        log.warning(message)
        warnings.warn(message, DiskUnwritableWarning, stacklevel=3)
        return None


def _key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def entry_name(key: str) -> str:
    return _key_digest(key).hex()


class DiskTier:
    """L2: one file per entry under `directory`, shared by the processes of a node."""

    def __init__(self, directory: str | os.PathLike, capacity_bytes: int, policy: str,
                 stats: CacheStats) -> None:
        self.capacity = check_budget("disk_bytes", capacity_bytes)
        self.policy = check_policy(policy)
        self.stats = stats
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"disk_dir must be a directory, got {str(directory)!r} (a file)")
        self.writable = True
        self._objects = self.directory / "objects"
        self._tmp = self.directory / "tmp"
        self._objects.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._pid = -1
        self._reopen()
        with self._locked() as fd:
            self._remove_orphans()
            self._write_usage(fd, self._scan_usage())

    # -- process-local handles: a fork shares the lock file's description, so reopen it --------
    def _reopen(self) -> None:
        old = getattr(self, "_closer", None)
        if old is not None:
            old()               # this process's inherited copy of the parent's descriptor
        try:
            self._fd = os.open(self.directory / "usage", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno not in _UNWRITABLE:
                raise
            self._fd = os.open(self.directory / "usage", os.O_RDONLY)
            self._unwritable(exc)
        # Closes the descriptor when the tier is collected without close() (no leak).
        self._closer = weakref.finalize(self, os.close, self._fd)
        self._thread_lock = threading.Lock()
        self._pid = os.getpid()

    def _locked(self):
        if self._pid != os.getpid():
            self._reopen()
        tier = self

        class _Guard:
            def __enter__(self):
                tier._thread_lock.acquire()
                fcntl.flock(tier._fd, fcntl.LOCK_EX)
                return tier._fd

            def __exit__(self, *exc):
                fcntl.flock(tier._fd, fcntl.LOCK_UN)
                tier._thread_lock.release()

        return _Guard()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_fd", "_thread_lock", "_closer"):
            state.pop(name, None)
        state["_pid"] = -1
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reopen()

    def close(self) -> None:
        if self._pid == os.getpid():
            self._closer()      # idempotent: closes the descriptor once
            self._pid = -1

    # -- usage accounting (call with the lock held) ---------------------------------------------
    def _read_usage(self, fd: int) -> int:
        raw = os.pread(fd, 32, 0).strip()
        try:
            return int(raw)
        except ValueError:              # empty or damaged: the directory is the truth
            return self._scan_usage()

    def _write_usage(self, fd: int, used: int) -> None:
        self.used = max(used, 0)
        if self.writable:
            text = f"{self.used}\n".encode()
            os.pwrite(fd, text.ljust(24), 0)

    def _entries(self):
        for sub in os.scandir(self._objects):
            if sub.is_dir():
                for entry in os.scandir(sub.path):
                    yield entry

    def _scan_usage(self) -> int:
        return sum(e.stat().st_size for e in self._entries())

    def _remove_orphans(self) -> None:
        """Delete temporary files whose writer process is gone (a crash mid-write)."""
        for entry in os.scandir(self._tmp):
            try:
                pid = int(entry.name.split(".")[1])
                os.kill(pid, 0)
            except (IndexError, ValueError, ProcessLookupError):
                try:
                    Path(entry.path).unlink(missing_ok=True)
                except OSError as exc:  # a read-only directory: nothing can be written there
                    if exc.errno not in _UNWRITABLE:
                        raise
            except PermissionError:     # alive, owned by another user
                pass

    # -- entries ---------------------------------------------------------------------------------
    def path_for(self, key: str) -> Path:
        name = entry_name(key)
        return self._objects / name[:2] / name

    def get(self, key: str) -> bytes | None:
        path = self.path_for(key)
        try:
            with open(path, "rb") as handle:
                header = handle.read(_HEADER.size)
                payload = handle.read()
        except FileNotFoundError:
            return None
        payload = self._verify(header, payload, key)
        if payload is None:
            log.warning("L2 entry %s for %s is corrupt or truncated: discarded, fetching again",
                        path, key)
            self.stats.add("corrupt")
            self._discard(path)
            return None
        if self.policy == "lru":
            try:
                os.utime(path)          # the file's mtime is its recency
            except FileNotFoundError:
                pass
        return payload

    @staticmethod
    def _verify(header: bytes, body: bytes, key: str) -> bytes | None:
        """The payload when header, key and CRC agree with it, else None (corrupt, truncated or
        another key's entry)."""
        if len(header) < _HEADER.size:
            return None
        magic, crc, length, key_digest = _HEADER.unpack(header)
        if (magic != _MAGIC or len(body) != length or key_digest != _key_digest(key)
                or zlib.crc32(body) != crc):
            return None
        return body

    def discard(self, key: str) -> None:
        """Remove ``key``'s entry (one that failed a check its header cannot make)."""
        self._discard(self.path_for(key))

    def _discard(self, path: Path) -> None:
        with self._locked() as fd:
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                return
            except OSError as exc:      # a read-only directory: it stays, and is never served
                if exc.errno not in _UNWRITABLE:
                    raise
                self._unwritable(exc)
                return
            self._write_usage(fd, self._read_usage(fd) - size)

    def put(self, key: str, data: bytes) -> bool:
        """Admit `data` under `key` if the policy and the budget allow; True when it is stored."""
        size = _HEADER.size + len(data)
        if not self.writable:
            return False
        try:
            return self._put(key, data, size)
        except OSError as exc:
            if exc.errno not in _UNWRITABLE:
                raise
            self._unwritable(exc)
            return False

    def _put(self, key: str, data: bytes, size: int) -> bool:
        if size > self.capacity or (self.policy == "static" and self.used + size > self.capacity):
            # `self.used` may be stale (other processes): only a cheap early-out for static,
            # which never shrinks; the decision below is made under the lock.
            self.stats.add("rejected", tier="l2")
            return False
        final = self.path_for(key)
        tmp = self._tmp / f"{final.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                header = _HEADER.pack(_MAGIC, zlib.crc32(data), len(data), _key_digest(key))
                _write_all(fd, header)
                _write_all(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self._disk_full(exc)
                return False
            raise
        try:
            return self._commit(tmp, final, size, len(data))
        finally:
            tmp.unlink(missing_ok=True)

    def _commit(self, tmp: Path, final: Path, size: int, payload: int) -> bool:
        with self._locked() as fd:
            if final.exists():          # another process filled the same entry first
                return True
            used = self._read_usage(fd)
            if used + size > self.capacity:
                if self.policy == "static":
                    self.used = used
                    self.stats.add("rejected", tier="l2")
                    return False
                used = self._evict(used, size)
            final.parent.mkdir(exist_ok=True)
            os.replace(tmp, final)      # atomic: readers see the old state or the whole entry
            self._write_usage(fd, used + size)
        self.stats.add("bytes_written", payload, tier="l2")
        return True

    def _evict(self, used: int, size: int) -> int:
        target = min(self.capacity * _LRU_LOW_WATER, self.capacity - size)
        by_age = sorted(((e.stat().st_mtime, e.path, e.stat().st_size) for e in self._entries()))
        for _, path, file_size in by_age:
            if used <= target:
                break
            Path(path).unlink(missing_ok=True)
            used -= file_size
            self.stats.add("evictions", tier="l2")
        return used

    def _disk_full(self, exc: OSError) -> None:
        self.writable = False
        self.stats.add("disk_full")
        message = (f"L2 cache directory {self.directory} is full ({exc.strerror}): "
                   "carrying on with the memory tier only; L2 entries already stored stay readable")
        log.warning(message)
        warnings.warn(message, DiskFullWarning, stacklevel=3)

    def _unwritable(self, exc: OSError) -> None:
        if not self.writable:
            return
        self.writable = False
        message = (f"L2 cache directory {self.directory} cannot be written ({exc.strerror}: "
                   f"{exc.filename}): carrying on with the memory tier only")
        log.warning(message)
        warnings.warn(message, DiskUnwritableWarning, stacklevel=4)

    def __contains__(self, key: str) -> bool:
        return self.path_for(key).exists()

    def full_for(self, size: int) -> bool:
        return not self.writable or self.used + _HEADER.size + size > self.capacity


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
