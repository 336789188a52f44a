"""Versioned, checksummed, atomic checkpoint files, and per-shard save/restore of embedding rows.

A file is a `thinwire.safefile` record: ``MAGIC`` + the SHA-256 of the payload + the payload, a
``torch.save`` of plain tensors and containers read back with ``torch.load(weights_only=True)``,
holding the name it was saved under (store namespace, key, version, kind), so a file copied or
renamed to another key or version is refused, not restored. It is written to a temporary file in
the same folder, fsync'ed, then renamed, so a reader sees either the whole new file or none;
temporaries left by a killed save are removed on the key's next save or load. A truncated or
corrupted file fails its checksum (`CorruptCheckpoint`) and `load_chain` falls back to the
previous version.

Files are ``<key>.v<version>.<kind>.ckpt``; versions count up per key over both kinds:

* ``full``: a whole `EmbeddingShard.state_dict()` (or any state, e.g. the dense model);
* ``delta``: some rows of a shard (ids, rows, their optimizer state), applied in version order
  on top of the newest valid ``full`` (CPR-MFU and CPR-SSU write these).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

from thinwire import safefile
from thinwire.recsys.sharded import EmbeddingShard, check_rows_state

log = logging.getLogger(__name__)

MAGIC = b"TWCPR2\n"
KINDS = ("full", "delta")
_NAME = re.compile(r"^(?P<key>[A-Za-z0-9_\-]+)\.v(?P<version>\d{8})\.(?P<kind>full|delta)\.ckpt$")
_TEMP = re.compile(r"^\.(?P<key>[A-Za-z0-9_\-]+)\.v\d{8}\.(full|delta)\.ckpt\..*\.tmp$")

# A checkpoint file whose header, length, checksum or recorded name does not match.
CorruptCheckpoint = safefile.CorruptFile


def encode(obj, key: str | None = None) -> bytes:
    return safefile.encode(obj, MAGIC, key)


def decode(data: bytes, where: str = "checkpoint", key: str | None = None):
    return safefile.decode(data, MAGIC, where, key)


class CheckpointStore:
    """Checkpoints of many keys (one per shard, one for the dense model) in one folder."""

    def __init__(self, root: str | os.PathLike, keep: int = 2, namespace: str = ""):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be >= 1 (full checkpoints kept per key), got {keep!r}")
        self.root, self.keep, self.namespace = Path(root), keep, namespace
        self.root.mkdir(parents=True, exist_ok=True)
        self.bytes_written = 0

    def versions(self, key: str) -> list[tuple[int, str, Path]]:
        """(version, kind, path) of every file of `key`, oldest first."""
        out = []
        for path in self.root.iterdir():
            m = _NAME.match(path.name)
            if m and m["key"] == key:
                out.append((int(m["version"]), m["kind"], path))
        return sorted(out)

    def save(self, key: str, obj, kind: str = "full") -> int:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", key):
            raise ValueError(f"key must be letters, digits, '_' or '-', got {key!r}")
        existing = self.versions(key)
        version = existing[-1][0] + 1 if existing else 1
        self.remove_orphans(key)
        path = self.root / f"{key}.v{version:08d}.{kind}.ckpt"
        data = encode(obj, self.file_key(path))
        safefile.atomic_write(path, data)
        self.bytes_written += len(data)
        if kind == "full":
            self._prune(key)
        return version

    def _prune(self, key: str) -> None:
        """Keep the newest `keep` full files and the deltas after the oldest kept one."""
        files = self.versions(key)
        fulls = [v for v, kind, _ in files if kind == "full"]
        if len(fulls) <= self.keep:
            return
        oldest_kept = fulls[-self.keep]
        for version, _, path in files:
            if version < oldest_kept:
                path.unlink(missing_ok=True)

    def file_key(self, path: Path) -> str:
        """What a file records it is: namespace/key/version/kind, from its name."""
        m = _NAME.match(path.name)
        if m is None:
            raise CorruptCheckpoint(f"{path}: not a checkpoint file name (<key>.v<8 digits>."
                                    "<full|delta>.ckpt)")
        return f"{self.namespace}/{m['key']}/v{m['version']}/{m['kind']}"

    def read(self, path: Path):
        return decode(path.read_bytes(), str(path), self.file_key(path))

    def remove_orphans(self, key: str) -> int:
        """Delete `key`'s temporary files left by a save that was killed (one writer per key)."""
        removed = 0
        for path in self.root.iterdir():
            m = _TEMP.match(path.name)
            if m and m["key"] == key:
                path.unlink(missing_ok=True)
                removed += 1
                log.warning("removed %s, left by a checkpoint save that did not finish", path)
        return removed

    def load_chain(self, key: str) -> tuple[int, object, list]:
        """(version, state) of the newest readable full file and the deltas after it, up to the
        first unreadable one.

        A corrupted or truncated full file is skipped with a warning (the previous version is
        used). A corrupted delta ends the chain there, with a warning: the deltas after it
        changed rows on top of it, so applying them without it would build a state that never
        existed. FileNotFoundError when no full file of `key` can be read."""
        self.remove_orphans(key)
        files = self.versions(key)
        for index in range(len(files) - 1, -1, -1):
            version, kind, path = files[index]
            if kind != "full":
                continue
            try:
                base = self.read(path)
            except (CorruptCheckpoint, OSError, RuntimeError) as err:
                log.warning("skipping unreadable checkpoint: %s", err)
                continue
            deltas = []
            later_files = files[index + 1:]
            for position, (_, later_kind, later) in enumerate(later_files):
                try:
                    deltas.append(self.read(later))
                except (CorruptCheckpoint, OSError, RuntimeError) as err:
                    log.warning("unreadable delta, the state stops before it (%d later delta(s) "
                                "not applied): %s", len(later_files) - position - 1, err)
                    break
            return version, base, deltas
        raise FileNotFoundError(f"no readable full checkpoint of {key!r} in {self.root}")


def rows_state(shard: EmbeddingShard, ids: torch.Tensor) -> dict:
    """Rows (and their optimizer state) of the given ids of `shard`: a delta's contents."""
    index = shard.lookup(ids)
    return {"ids": ids.clone(), "rows": shard.rows[index].clone(),
            "optimizer_state": {k: v[index].clone() for k, v in shard.optimizer_state.items()}}


def apply_rows(shard: EmbeddingShard, delta: dict) -> None:
    """A delta's rows (and optimizer state) written over ``shard``'s, checked first: its ids
    a 1-D integer tensor, one finite row of the shard's width for each."""
    ids, rows = delta.get("ids"), delta.get("rows")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.is_floating_point() or \
            not isinstance(rows, torch.Tensor) or rows.shape != (len(ids), shard.dim):
        raise ValueError(f"delta: ids must be a 1-D integer tensor and rows of shape (ids, "
                         f"{shard.dim}), got ids {getattr(ids, 'shape', ids)!r}, rows "
                         f"{getattr(rows, 'shape', rows)!r}")
    check_rows_state(rows, delta.get("optimizer_state"), "delta")
    index = shard.lookup(delta["ids"])
    shard.rows[index] = delta["rows"].to(shard.dtype)
    for name, value in delta["optimizer_state"].items():
        if name not in shard.optimizer_state:
            shard.optimizer_state[name] = torch.zeros_like(shard.rows)
        shard.optimizer_state[name][index] = value


def restore_shard(store: CheckpointStore, key: str, shard: EmbeddingShard) -> int:
    """Load the newest valid full checkpoint of `key` into `shard`, then its deltas in order;
    returns the full file's version."""
    version, base, deltas = store.load_chain(key)
    shard.load_state_dict(base)
    for position, delta in enumerate(deltas):
        try:
            apply_rows(shard, delta)
        except ValueError as err:  # as an unreadable delta: the state stops before it
            log.warning("delta %d of %r not applied, nor the %d after it: %s", position + 1,
                        key, len(deltas) - position - 1, err)
            break
    return version
