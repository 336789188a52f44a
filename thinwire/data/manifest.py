"""What each object of a data set must hash to: the check of meaning behind the cache.

The disk tier's header (magic, length, CRC, digest of the key) finds damage and an entry
filed under another key, but not an entry whose bytes were replaced and the header rewritten
to match: any process that can write the cache directory can serve the training run any
bytes it likes. A manifest of the objects' SHA-256 digests, published beside the data set
(the `sha256sum` format every data set host already uses), closes that: an entry from disk
that does not hash to its digest is discarded and fetched again, and an object from the
remote store that does not is refused, naming the URL.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Iterable, Mapping

_HEX = re.compile(r"[0-9a-f]{64}")  # fullmatch: no trailing newline slips through
MAX_MANIFEST_BYTES = 64 << 20


class ChecksumMismatch(ValueError):
    """An object's bytes do not hash to the manifest's digest for it."""


def check(checksums: Mapping[str, str], urls: Iterable[str]) -> dict[str, str]:
    """``checksums`` checked for form and coverage: every URL of the source has a lower-case
    hex SHA-256 (a URL left out would go unchecked without a word)."""
    if not isinstance(checksums, Mapping):
        raise TypeError(f"checksums must be a mapping of URL to SHA-256 hex digest, got "
                        f"{type(checksums).__name__}")
    table = {}
    for url, digest in checksums.items():
        if not isinstance(url, str) or not isinstance(digest, str) \
                or not _HEX.fullmatch(digest.lower()):
            raise ValueError(f"checksums[{url!r}] must be a SHA-256 hex digest (64 hex "
                             f"characters), got {digest!r}")
        table[url] = digest.lower()
    missing = [url for url in urls if url not in table]
    if missing:
        raise ValueError(f"checksums has no digest for {len(missing)} object(s) of the source, "
                         f"e.g. {missing[0]!r}: every object must be listed")
    return table


def verify(data: bytes, url: str, table: Mapping[str, str]) -> None:
    """Raises ChecksumMismatch unless ``data`` hashes to ``table[url]``."""
    got = hashlib.sha256(data).hexdigest()
    if got != table[url]:
        raise ChecksumMismatch(f"{url}: SHA-256 {got} does not match the manifest's "
                               f"{table[url]} ({len(data)} bytes)")


def read_sha256sum(path: str | os.PathLike, base_url: str) -> dict[str, str]:
    """A ``sha256sum`` output file (``<hex>  <name>`` per line, ``*`` before a binary name)
    as {``base_url`` + name: digest}. ``base_url`` is the folder the names are relative to
    (``file:///data/`` or ``http://host/d/``)."""
    if os.path.getsize(path) > MAX_MANIFEST_BYTES:
        raise ValueError(f"--checksums {path}: larger than {MAX_MANIFEST_BYTES >> 20} MiB, not "
                         "a manifest")
    base = base_url if base_url.endswith("/") else base_url + "/"
    table = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")  # a manifest written on Windows too
            if not line.strip():
                continue
            digest, sep, name = line.partition("  ")
            if not sep:
                digest, sep, name = line.partition(" *")
            if not sep or not _HEX.fullmatch(digest.lower()) or not name:
                raise ValueError(f"--checksums {path}, line {number}: expected '<sha256 hex>  "
                                 f"<name>' (sha256sum's format), got {line[:80]!r}")
            table[base + name] = digest.lower()
    return table
