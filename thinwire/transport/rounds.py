"""What one rank knows about one exchange ("round"): datagrams received from each sender, and
what each receiver acknowledged of this rank's own datagrams.

Bounds (a flood cannot exhaust memory): a rank holds at most two rounds (the current one and
the next, which a faster peer may already be sending), and per round and sender at most
``total`` datagrams (``wire.MAX_DATAGRAMS`` before the round's layout is known), one per seq.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from thinwire.transport import wire
from thinwire.transport.payload import Layout, body_bytes, check_content


@dataclass
class Incoming:
    """One sender's datagrams in one round (this rank receiving)."""
    data: dict = field(default_factory=dict)       # seq -> body
    raw: dict = field(default_factory=dict)        # before the layout: (step, bucket, seq) -> (h, b)
    high: int = 0                                  # distinct high datagrams held
    first: float | None = None                     # when the sender was first heard this round
    polled: float | None = None                    # when the sender's first POLL came: it has
    #                                                sent all its datagrams by then
    final: frozenset | None = None                 # seqs held when this rank stopped waiting
    commit: frozenset | None = None                # seqs every rank applies (sender's decision)


@dataclass
class Outgoing:
    """One receiver's view of this rank's datagrams (this rank sending)."""
    ack: frozenset = frozenset()
    ack_version: int = 0
    acted_version: int = 0
    final: frozenset | None = None
    last_poll: float = -math.inf
    commit_acked: bool = False
    last_commit: float = -math.inf


@dataclass
class Round:
    number: int
    peers: tuple
    step: int | None = None
    bucket: int | None = None
    layout: Layout | None = None
    incoming: dict = field(default_factory=dict)
    outgoing: dict = field(default_factory=dict)
    commit: frozenset | None = None                # this rank's decision on its own datagrams

    def __post_init__(self):
        self.incoming = {p: Incoming() for p in self.peers}
        self.outgoing = {p: Outgoing() for p in self.peers}

    @property
    def registered(self) -> bool:
        return self.layout is not None


class Counters:
    """Cumulative per transport; the algorithm reports per-step differences."""
    FIELDS = ("sent", "retransmitted", "lost", "control_sent", "bad", "foreign", "duplicates",
              "late", "stale", "entries", "missed_entries")

    def __init__(self):
        for name in self.FIELDS:
            setattr(self, name, 0)

    def snapshot(self) -> dict:
        return {name: getattr(self, name) for name in self.FIELDS}


def check_data(layout: Layout, header: wire.Header, body: bytes) -> str | None:
    """Why a DATA datagram does not fit the round's layout (None: it fits)."""
    if header.total != layout.total or header.n_high != layout.n_high:
        return f"total/n_high {header.total}/{header.n_high}, expected " \
               f"{layout.total}/{layout.n_high}"
    if header.seq >= layout.total:
        return f"seq {header.seq} >= total {layout.total}"
    if (header.offset, header.count) != layout.span(header.seq):
        return f"span {(header.offset, header.count)} for seq {header.seq}"
    if bool(header.flags & wire.SPARSE) != layout.sparse:
        return "sparse flag"
    if layout.sparse and header.high != (header.seq < layout.n_high):
        return "high flag"
    if len(body) != body_bytes(layout, header.seq):
        return f"body of {len(body)} bytes"
    return check_content(layout, header.count, body)


def complete(layout: Layout, incoming: Incoming, epsilon: float) -> bool:
    """Every datagram is here; or every high one and at least (1 - epsilon) of the others, and
    the sender has sent them all (its POLL came after its last datagram: without that, a
    receiver would cut off the tail of every payload even on a lossless link)."""
    if len(incoming.data) == layout.total:
        return True
    low_total = layout.total - layout.n_high
    low_needed = math.ceil((1.0 - epsilon) * low_total - 1e-9)
    return (incoming.polled is not None and incoming.high >= layout.n_high
            and len(incoming.data) - incoming.high >= low_needed)
