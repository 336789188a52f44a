"""Files the package writes and loads again: data only, checksummed, keyed, written atomically.

Used by the training checkpoints (`thinwire.train.checkpoint`) and the CPR store
(`thinwire.recsys.cpr.store`). A file is::

    MAGIC  +  SHA-256 of the payload (64 hex chars)  +  "\\n"  +  payload

where the payload is a ``torch.save`` of ``{"key": key, "data": obj}`` holding only tensors and
plain containers, read back with ``torch.load(weights_only=True)``: loading never runs code, a
flipped or missing byte fails the checksum, and a file copied under another name fails the key
check. Writes go to a temporary file next to the target, are fsync'ed, then renamed (and the
folder fsync'ed), so a reader sees the whole old file or the whole new one. A temporary file
left by a writer killed mid-save is removed by `remove_orphans` on the next save or open.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_DIGEST_CHARS = 64


class CorruptFile(ValueError):
    """A file whose header, checksum, key or contents are not what was written."""


def encode(obj, magic: bytes, key: str | None = None) -> bytes:
    buffer = io.BytesIO()
    torch.save({"key": key, "data": obj}, buffer)
    payload = buffer.getvalue()
    return magic + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def decode(data: bytes, magic: bytes, where: str, key: str | None = None):
    """The object stored in ``data``; CorruptFile (naming ``where``) on any mismatch."""
    head = len(magic) + _DIGEST_CHARS + 1
    if not data:
        raise CorruptFile(f"{where}: empty file")
    if len(data) < head or not data.startswith(magic) or data[head - 1:head] != b"\n":
        raise CorruptFile(f"{where}: bad header (truncated, or not a thinwire "
                          f"{magic.decode(errors='replace').strip()} file)")
    digest, payload = data[len(magic):head - 1].decode(errors="replace"), data[head:]
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CorruptFile(f"{where}: checksum mismatch ({len(payload)} payload bytes): "
                          "the file was truncated or changed after it was written")
    try:
        stored = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch.load raises KeyError, IndexError, ...
        # A valid checksum over a payload that is not plain data: written by something else
        # (the checksum has no key: an edited file's can be recomputed). Whatever torch.load
        # raises on it, the file is corrupt: the caller falls back to the previous one and
        # every rank reaches the agreement on a step, rather than this rank dying alone.
        first = (str(exc).splitlines() or [""])[0][:200]
        raise CorruptFile(f"{where}: payload is not plain tensors and containers "
                          f"({type(exc).__name__}: {first})") from None
    if not isinstance(stored, dict) or set(stored) != {"key", "data"}:
        raise CorruptFile(f"{where}: payload has no key/data record (not written by thinwire)")
    if key is not None and stored["key"] != key:
        raise CorruptFile(f"{where}: the file belongs to {stored['key']!r}, expected {key!r} "
                          "(copied or renamed from another key?)")
    return stored["data"]


def temp_prefix(path: Path) -> str:
    return f".{path.name}."


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename durable (the folder entry); not every file system allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_orphans(path: str | os.PathLike) -> int:
    """Delete temporary files of ``path`` left by a save that was killed; returns how many.

    Only the temporaries of this one file name are touched: its writer is the caller (one
    writer per file), so any that exist now belong to a save that never finished."""
    path = Path(path)
    removed = 0
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return 0
    for entry in entries:
        if entry.name.startswith(temp_prefix(path)) and entry.name.endswith(".tmp"):
            try:
                size = entry.stat().st_size
                entry.unlink()
            except OSError:
                continue
            removed += 1
            log.warning("removed %s (%d bytes), left by a save that did not finish", entry, size)
    return removed
