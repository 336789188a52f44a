"""The datagrams of thinwire's loss-tolerant transport: layout, checksum, priority classes.

Every datagram describes itself, so a receiver never needs a previous one to place it:

    magic "TW" | version | kind | job | round | step | bucket | sender | seq | total | n_high |
    offset | count | flags | crc32 (over everything before it and the body) | body

* DATA: ``count`` entries of a payload starting at entry ``offset``; the body holds the values,
  then (sparse payloads) their int32 indices. ``seq`` numbers the payload's datagrams (0..total-1),
  ``n_high`` of them are in the high class (flag HIGH on those).
* POLL: the sender asks a receiver for its bitmap of ``seq``s received (an ACK answers).
* ACK: body = bitmap of received ``seq``s; flag FINAL once the receiver has stopped waiting.
* COMMIT: body = bitmap of the ``seq``s every receiver holds: the ones all ranks apply.
* COMMIT_ACK: the receiver holds the commit.

Datagrams stay below the links' MTU (1500 bytes by default, 9000 with jumbo frames; IPv4 + UDP
headers: 28 bytes), so the network never fragments them: one lost fragment would lose the whole
datagram.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

MAGIC = b"TW"
VERSION = 1
DATA, POLL, ACK, COMMIT, COMMIT_ACK = 1, 2, 3, 4, 5
KINDS = (DATA, POLL, ACK, COMMIT, COMMIT_ACK)
HIGH, FINAL, SPARSE = 1, 2, 4

_HEAD = struct.Struct("!2sBBIIIHHIIIIHH")  # everything before the checksum
_CRC = struct.Struct("!I")
HEADER_BYTES = _HEAD.size + _CRC.size
MAX_DATAGRAM_BYTES = 1500 - 28           # one Ethernet frame's IPv4 UDP payload (the default)
JUMBO_DATAGRAM_BYTES = 9000 - 28         # a jumbo frame's (links with MTU 9000)
MIN_DATAGRAM_BYTES = 512
WIRE_OVERHEAD_BYTES = 28 + 14            # IPv4 + UDP + Ethernet headers per datagram on the wire
MAX_DATAGRAMS = 8 * 1024                 # a payload's bitmap (1 KiB) fits in one datagram
VALUE_DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}


class BadDatagram(ValueError):
    """A datagram that is not a well-formed thinwire datagram (dropped and counted)."""


class Header(NamedTuple):
    """A NamedTuple, not a dataclass: one is made per datagram received (~9000 a second per
    100 Mbit/s link), and a tuple is several times cheaper to make."""
    kind: int
    job: int
    round: int
    step: int
    bucket: int
    sender: int
    seq: int = 0
    total: int = 0
    n_high: int = 0
    offset: int = 0
    count: int = 0
    flags: int = 0

    @property
    def high(self) -> bool:
        return bool(self.flags & HIGH)

    @property
    def final(self) -> bool:
        return bool(self.flags & FINAL)


def encode(header: Header, body: bytes = b"") -> bytes:
    head = _HEAD.pack(MAGIC, VERSION, header.kind, header.job, header.round,
                      header.step & 0xFFFFFFFF, header.bucket, header.sender, header.seq,
                      header.total, header.n_high, header.offset, header.count, header.flags)
    datagram = head + _CRC.pack(zlib.crc32(body, zlib.crc32(head))) + body
    if len(datagram) > JUMBO_DATAGRAM_BYTES:
        raise ValueError(f"datagram of {len(datagram)} bytes exceeds {JUMBO_DATAGRAM_BYTES}")
    return datagram


def check_datagram_bytes(value) -> int:
    """The largest datagram a transport sends: from a link MTU of 1280..9000 less 28 bytes."""
    if (isinstance(value, bool) or not isinstance(value, int)
            or not MIN_DATAGRAM_BYTES <= value <= JUMBO_DATAGRAM_BYTES):
        raise ValueError(f"datagram_bytes must be an integer in [{MIN_DATAGRAM_BYTES}, "
                         f"{JUMBO_DATAGRAM_BYTES}] (the links' MTU - 28), got {value!r}")
    return value


def decode(datagram: bytes) -> tuple[Header, bytes]:
    """Header and body of a datagram; BadDatagram where it is short, foreign or corrupted."""
    if len(datagram) < HEADER_BYTES:
        raise BadDatagram(f"{len(datagram)} bytes, shorter than a header")
    head = datagram[:_HEAD.size]
    (crc,) = _CRC.unpack_from(datagram, _HEAD.size)
    body = datagram[HEADER_BYTES:]
    if zlib.crc32(body, zlib.crc32(head)) != crc:
        raise BadDatagram("checksum mismatch")
    magic, version, kind, *fields = _HEAD.unpack(head)
    if magic != MAGIC or version != VERSION or kind not in KINDS:
        raise BadDatagram(f"magic {magic!r}, version {version}, kind {kind}")
    return Header(kind, *fields), body


def bitmap(seqs, total: int) -> bytes:
    bits = bytearray((total + 7) // 8)
    for seq in seqs:
        bits[seq >> 3] |= 1 << (seq & 7)
    return bytes(bits)


def seqs_of(bits: bytes, total: int) -> set[int]:
    if len(bits) != (total + 7) // 8:
        raise BadDatagram(f"bitmap of {len(bits)} bytes for {total} datagrams")
    return {i for i in range(total) if bits[i >> 3] >> (i & 7) & 1}


def priority_class(high: bool, layer_position: float, classes: int | None) -> int:
    """The link class (0 = highest) of a datagram, from its magnitude and its layer.

    ``high``: among the largest entries of its payload (DLCP's magnitude priority); these and
    the control datagrams take class 0. ``layer_position``: 0 for the layers next to the input,
    1 for the output's; the next forward pass needs the input's layers first, so with 4+ classes
    their low datagrams take class 1 and the others class 2. The lowest class (K-1, where
    unmarked traffic such as gloo's and bulk flows land) is left to others where K >= 3."""
    if not classes or classes < 2:
        return 0
    if high:
        return 0
    if classes >= 4:
        return 1 if layer_position < 0.5 else 2
    return 1
