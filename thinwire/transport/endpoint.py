"""One rank's end of the loss-tolerant transport: an all-gather of gradient payloads over UDP.

An exchange ("round") on every rank of the job, all in the same order:

1. DATA: this rank sends its payload's datagrams to every peer, paced at the link rate, the
   high ones first; a receiver thread files what arrives from the peers.
2. Having sent everything, a sender POLLs each receiver (and again every POLL_S until the
   receiver is final). A receiver stops waiting for a sender ("final") once it holds every
   datagram, or every high one and at least (1 - epsilon) of the others after the sender's
   POLL, or at a deadline: the POLL's arrival + the wire time of the payload times a slack
   (datagrams still queued behind the POLL, which overtakes them in the highest class). The
   deadline counts from the POLL, not from the first datagram, so that a sender slowed down
   by its CPU does not lose its payload's tail. The receiver tells the sender its bitmap (ACK,
   answered to POLLs too); the sender retransmits only missing high datagrams, each time an
   ACK shows some.
3. COMMIT: once every peer's final bitmap is in, the sender decides what all ranks apply: the
   datagrams every peer holds. Replicas stay identical: an entry is applied everywhere or
   nowhere. The sender returns the others to its error feedback (conservation).
4. The round ends on a rank once it holds every peer's commit. Its own commit need not be
   acknowledged first (that wait was one more peer thread to be scheduled per step): a commit
   not yet acknowledged stays pending and the receiver thread repeats it until the peer
   acknowledges it or is heard in a later round (it cannot have finished this one without it).

Control datagrams (POLL, ACK, COMMIT, COMMIT_ACK) travel in the highest class and are repeated
until answered, so only a dead peer stops a round; that ends in TimeoutError naming the ranks.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import select
import socket
import struct
import termios
import threading
import time
from dataclasses import dataclass

import torch

from thinwire.options import Option
from thinwire.options import check_options as declared_check
from thinwire.transport import payload as payloads
from thinwire.transport import wire
from thinwire.transport.receiver import Receiver
from thinwire.transport.rounds import Counters, Round

log = logging.getLogger(__name__)

MAX_EPSILON = 0.1
POLL_S = 0.01            # a missing answer is asked for again after this long
DEFAULT_DEADLINE_S = 0.05  # after a sender's POLL, where no link rate is known (loopback)
MIN_DEADLINE_S = 0.02
SEND_WAIT_S = 0.05        # a full send buffer is waited for this long, then the datagram is lost
PACINGS = ("sleep", "socket")
CLOSE_FLUSH_S = 5.0       # close() waits this long at most for peers to confirm our last commit


def _output_queue(sock) -> int:
    """Bytes (skb truesize) of this socket still waiting to leave; 0 where unknown."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    except (OSError, AttributeError):
        return 0


@dataclass
class Exchanged:
    """The result of one exchange: every rank's applied entries, and this rank's own fate."""
    parts: list                      # by rank: (values, int64 indices) every rank applies
    own_lost: torch.Tensor           # positions in this rank's payload that nobody applies
    wire_bytes: int                  # this rank's DATA bytes on the wire (headers included)


# The transport's settings, declared once: dlcp's algorithm options are these plus its own,
# and the Transport constructor checks its arguments against the same declarations.
OPTIONS = (
    Option("epsilon", float, 0.02, low=0.0, high=MAX_EPSILON,
           help="share of a payload's low-class datagrams a receiver may give up on; what "
                "misses its step goes back to error feedback"),
    Option("high_share", float, 0.1, low=0.0, high=1.0,
           help="share of each payload's datagrams (its largest entries) in the high class, "
                "the only ones retransmitted"),
    Option("rate_bps", float, None, low=0.0, low_open=True, optional=True,
           help="the sender's pacing and the deadline's link rate in bit/s; none: the emulated "
                "cluster's inter-node rate, unpaced where none is known"),
    Option("deadline_slack", float, 2.0, low=1.0,
           help="after a sender's POLL a receiver waits at most this times the wire time of "
                "the sender's payload for missing datagrams"),
    Option("deadline_s", float, None, low=0.0, low_open=True, optional=True,
           help="that wait in seconds instead (none: from deadline_slack; 0.05 s without a "
                "rate)"),
    Option("pacing", str, None, choices=PACINGS, optional=True,
           help="who holds the sender to the link rate: the shaped link's qdisc (socket) or "
                "the sender's own sleeps (sleep); none: socket on the emulated cluster"),
)
_TIMEOUT = Option("timeout_s", float, 300.0, low=0.0, low_open=True,
                  help="a round not finished after this long fails, naming the silent ranks")


def check_options(epsilon: float, high_share: float, rate_bps, timeout_s: float,
                  deadline_slack: float, deadline_s, pacing=None) -> None:
    given = dict(epsilon=epsilon, high_share=high_share, rate_bps=rate_bps,
                 deadline_slack=deadline_slack, deadline_s=deadline_s, pacing=pacing)
    declared_check("transport", OPTIONS, given)
    _TIMEOUT.check(timeout_s, "transport")


class Transport(Receiver):
    """``peers``: rank -> (ip, port) of every other rank; ``sock``: this rank's bound UDP socket
    (the transport owns it). With several links per node, ``sock`` is a list of sockets, one
    bound on each link, and ``peers`` maps a rank to a list of its addresses, one per link:
    DATA datagrams to a peer are sprayed over the links round-robin (link k to the peer's
    address k), control datagrams take link 0. ``datagram_bytes``: the largest datagram (UDP
    payload; the links' MTU - 28), the same on every rank.
    ``drop(kind, dst, round, seq, attempt) -> bool`` is a test hook that loses chosen datagrams
    at the sender (a seeded loss pattern)."""

    def __init__(self, sock, rank: int, peers: dict, job: int, *,
                 epsilon: float = 0.02, high_share: float = 0.1, rate_bps: float | None = None,
                 classes: int | None = None, timeout_s: float = 300.0,
                 deadline_slack: float = 2.0, deadline_s: float | None = None,
                 max_step_bytes: int | None = None, datagram_bytes: int | None = None,
                 pacing: str | None = None, drop=None):
        check_options(epsilon, high_share, rate_bps, timeout_s, deadline_slack, deadline_s,
                      pacing)
        # "socket": the shaped link's qdisc paces and the socket's send buffer holds the sender
        # back (no wake-up per millisecond); "sleep": the sender paces itself at rate_bps (where
        # nothing shapes, e.g. loopback). Default: socket on the emulated cluster's links.
        shaped = os.environ.get("THINWIRE_CLUSTER_SHAPED") == "1"
        self.pacing = pacing or ("socket" if shaped else "sleep")
        self._socks = list(sock) if isinstance(sock, (list, tuple)) else [sock]
        self._links = {r: [tuple(a) for a in (addrs if isinstance(addrs, list) else [addrs])]
                       for r, addrs in peers.items()}
        for r, addrs in self._links.items():
            if len(addrs) != len(self._socks):
                raise ValueError(f"peers[{r}] has {len(addrs)} link address(es), this rank "
                                 f"{len(self._socks)} socket(s): every rank needs the same links")
        self.datagram_bytes = wire.check_datagram_bytes(
            wire.MAX_DATAGRAM_BYTES if datagram_bytes is None else datagram_bytes)
        self.rank, self.job = rank, job
        self.peers = {r: addrs[0] for r, addrs in self._links.items()}
        self.epsilon, self.high_share, self.rate_bps = epsilon, high_share, rate_bps
        self.classes, self.timeout_s = classes, timeout_s
        self.deadline_slack, self.deadline_s = deadline_slack, deadline_s
        self.max_step_bytes, self._drop = max_step_bytes, drop
        self.counters = Counters()
        # the ancillary data marking a datagram's class: qos.tos_for_class, prepared once
        self._tos = [[(socket.IPPROTO_IP, socket.IP_TOS,
                       struct.pack("i", (classes - 1 - c) << 5))] for c in range(classes or 0)]
        # non-blocking: the receiver thread drains what is queued after one poll() wait (a
        # socket with a timeout would wait that timeout at the end of every batch)
        self._poller = select.poll()
        self._main_poller = select.poll()  # a poll object may not be polled by two threads
        self._link_of_fd = {}
        for link, s_ in enumerate(self._socks):
            s_.setblocking(False)
            self._poller.register(s_.fileno(), select.POLLIN)
            self._main_poller.register(s_.fileno(), select.POLLIN)
            self._link_of_fd[s_.fileno()] = link
        self._rank_of = {a: r for r, addrs in self._links.items() for a in addrs}
        self._spray = {r: 0 for r in self._links}  # the link of the next DATA datagram to r
        self.link_sent = [0] * len(self._socks)      # datagrams sent / received per link
        self.link_received = [0] * len(self._socks)
        self._cond = threading.Condition()
        self._rounds: dict[int, Round] = {}
        self._current = 0  # the round being exchanged; the receiver accepts it and the next
        self._next = 0
        self._budget_s = DEFAULT_DEADLINE_S
        self._pending: dict = {}  # peer -> (round, commit bitmap) not yet acknowledged
        self._main_reads = False  # the exchanging thread reads the sockets (in _finish)
        self._receiver_wake = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._receive_loop, daemon=True,
                                        name=f"thinwire-transport-{rank}")
        self._thread.start()

    @property
    def _sock(self):
        """Link 0's socket (control datagrams; the only one with one link per node)."""
        return self._socks[0]

    @_sock.setter
    def _sock(self, value) -> None:  # tests put a meddling stand-in in front of it
        self._socks[0] = value

    # ------------------------------------------------------------------ sending

    def _send(self, dst: int, datagram: bytes, cls: int = 0, kind: int = wire.DATA,
              round_: int = 0, seq: int = 0, attempt: int = 0) -> None:
        if self._drop is not None and self._drop(kind, dst, round_, seq, attempt):
            return
        link = 0
        if kind == wire.DATA and len(self._socks) > 1:  # spraying: order does not matter
            link = self._spray[dst]
            self._spray[dst] = (link + 1) % len(self._socks)
        sock, address = self._socks[link], self._links[dst][link]
        # with socket pacing a full send buffer is the norm (the link drains it): wait for room
        waits = 1 if self.pacing == "sleep" else max(1, int(self.timeout_s / SEND_WAIT_S))
        for attempt in range(waits + 1):
            try:
                if self.classes:
                    sock.sendmsg([datagram], self._tos[cls], 0, address)
                else:
                    sock.sendto(datagram, address)
                self.link_sent[link] += 1
                return
            except BlockingIOError:  # the socket's send buffer is full: wait for room
                select.select([], [sock], [], SEND_WAIT_S)
            except OSError as exc:  # e.g. a peer's port closed (ICMP): it times out later
                log.debug("send to rank %d failed: %s", dst, exc)
                return

    def _control(self, rnd: Round, kind: int, dst: int, body: bytes = b"", flags: int = 0,
                 total: int = 0) -> None:
        header = wire.Header(kind, self.job, rnd.number, rnd.step or 0, rnd.bucket or 0,
                             self.rank, total=total, flags=flags)
        self.counters.control_sent += 1
        self._send(dst, wire.encode(header, body), 0, kind, rnd.number)

    def _paced_send_all(self, rnd: Round, datagrams: list, classes: list, order: list) -> None:
        """Every datagram to every peer, peers interleaved, at ``rate_bps`` on this rank's link."""
        start = time.perf_counter()
        sent_bits = 0.0
        for seq in order:
            for peer in self.peers:
                if rnd.outgoing[peer].final is not None:
                    continue  # that receiver stopped waiting: the rest would be late
                self._send(peer, datagrams[seq], classes[seq], wire.DATA, rnd.number, seq)
                self.counters.sent += 1
                if self.rate_bps and self.pacing == "sleep":
                    sent_bits += 8 * (len(datagrams[seq]) + wire.WIRE_OVERHEAD_BYTES)
                    ahead = sent_bits / self.rate_bps - (time.perf_counter() - start)
                    if ahead > 0.001:
                        time.sleep(ahead)

    def _wait_sent(self) -> None:
        """With socket pacing, datagrams may still wait in this node's qdisc when the last send
        returns; the POLL (class 0) would overtake them and start the receivers' deadlines too
        early. So wait until the links have taken them: a socket's output queue (SIOCOUTQ:
        the send-buffer bytes not yet handed to the device) drains at the link's rate."""
        if self.pacing != "socket" or not self.rate_bps:
            return
        link_bps = self.rate_bps / len(self._socks)
        for _ in range(1000):  # a few rounds: each sleeps about half of what is left
            queued = max(_output_queue(s) for s in self._socks)
            if queued <= 0:
                return
            time.sleep(min(0.05, queued * 8 / link_bps / 2) + 0.0005)

    # ------------------------------------------------------------------ the exchange

    def exchange(self, step: int, bucket: int, values: torch.Tensor,
                 indices: torch.Tensor | None = None, layer_position: float = 0.5,
                 index_limit: int | None = None) -> Exchanged:
        """All-gather ``values`` (dense) or ``(values, indices)`` (sparse) with every peer.
        ``index_limit``: a sparse payload's indices lie in [0, index_limit) on every rank; a
        received datagram with one outside, or with a non-finite value, is dropped and counted
        (``counters.bad``), never applied."""
        if indices is not None and indices.numel() != values.numel():
            raise ValueError(f"indices ({indices.numel()}) and values ({values.numel()}) of a "
                             f"sparse payload must have the same length")
        self._check_size(values, indices is not None)
        cut = payloads.cut(values, indices, self.high_share, self.datagram_bytes)
        if index_limit:
            cut.layout = dataclasses.replace(cut.layout, index_limit=int(index_limit))
        layout = cut.layout
        flags = wire.SPARSE if layout.sparse else 0
        with self._cond:
            rnd = self._register(step, bucket, layout)
        datagrams = [wire.encode(wire.Header(
            wire.DATA, self.job, rnd.number, step, bucket, self.rank, seq, layout.total,
            layout.n_high, *layout.span(seq), flags | (wire.HIGH if cut.high[seq] else 0)),
            cut.bodies[seq]) for seq in range(layout.total)]
        classes = [wire.priority_class(h, layer_position, self.classes) for h in cut.high]
        per_peer_bytes = sum(len(d) + wire.WIRE_OVERHEAD_BYTES for d in datagrams)
        if self.deadline_s is not None:
            self._budget_s = self.deadline_s
        elif self.rate_bps:
            wire_s = 8 * per_peer_bytes / self.rate_bps  # one sender's payload to this rank
            self._budget_s = max(MIN_DEADLINE_S, self.deadline_slack * wire_s)
        self._paced_send_all(rnd, datagrams, classes, cut.send_order)
        self._wait_sent()
        self._finish(rnd, cut, datagrams, classes)
        return self._result(rnd, cut, per_peer_bytes * len(self.peers))

    def _check_size(self, values: torch.Tensor, sparse: bool) -> None:
        entry = values.element_size() + (payloads.INDEX_BYTES if sparse else 0)
        limit = payloads.max_entries(values.dtype, sparse, self.datagram_bytes) * entry
        allowed = limit if self.max_step_bytes is None else min(limit, self.max_step_bytes)
        size = values.numel() * entry
        if size > allowed:
            raise ValueError(f"payload of {size} bytes ({values.numel()} entries) is larger than "
                             f"the allowed step size: max_step_bytes must be >= the payload and "
                             f"at most {limit} (allowed: 1..{allowed} bytes here); split the "
                             f"bucket or lower the density")

    def _register(self, step: int, bucket: int, layout) -> Round:
        """Make round ``current`` this exchange; file what a faster peer already sent."""
        number = self._next
        self._next += 1
        for old in [r for r in self._rounds if r < number]:
            del self._rounds[old]
        self._current = number
        rnd = self._rounds.setdefault(number, Round(number, tuple(self.peers)))
        rnd.step, rnd.bucket, rnd.layout = step, bucket, layout
        now = time.perf_counter()
        for sender, incoming in rnd.incoming.items():
            raw, incoming.raw = incoming.raw, {}
            for header, body in raw.values():  # all filed before any completion is decided
                self._on_data(rnd, sender, header, body, now, decide=False)
            self._maybe_final(rnd, sender, incoming, now)
        return rnd

    def _finish(self, rnd: Round, cut, datagrams: list, classes: list) -> None:
        start = time.perf_counter()
        high = [seq for seq in range(len(datagrams)) if cut.high[seq]]
        self._receiver_wake.clear()
        with self._cond:  # set under the lock: the receiver thread drains only under it
            self._main_reads = True
            try:
                self._finish_locked(rnd, datagrams, classes, high, start)
            finally:
                self._main_reads = False
                self._receiver_wake.set()

    def _finish_locked(self, rnd: Round, datagrams: list, classes: list, high: list,
                       start: float) -> None:
        while True:
            now = time.perf_counter()
            for sender, incoming in rnd.incoming.items():
                self._maybe_final(rnd, sender, incoming, now)
            for peer, out in rnd.outgoing.items():
                if out.final is None and now - out.last_poll >= POLL_S:
                    out.last_poll = now
                    self._control(rnd, wire.POLL, peer)
                if out.final is None and out.ack_version > out.acted_version:
                    out.acted_version = out.ack_version
                    for seq in high:
                        if seq not in out.ack:
                            self._send(peer, datagrams[seq], classes[seq], wire.DATA,
                                       rnd.number, seq, out.ack_version)
                            self.counters.retransmitted += 1
            if rnd.commit is None and all(o.final is not None
                                          for o in rnd.outgoing.values()):
                rnd.commit = frozenset(range(rnd.layout.total)).intersection(
                    *[o.final for o in rnd.outgoing.values()])
            if rnd.commit is not None:
                bits = wire.bitmap(rnd.commit, rnd.layout.total)
                for peer, out in rnd.outgoing.items():
                    if not out.commit_acked and now - out.last_commit >= POLL_S:
                        out.last_commit = now
                        self._control(rnd, wire.COMMIT, peer, bits, total=rnd.layout.total)
            if rnd.commit is not None and \
                    all(i.commit is not None for i in rnd.incoming.values()):
                self._pending = {peer: (rnd, bits) for peer, out in rnd.outgoing.items()
                                 if not out.commit_acked}
                return
            if now - start > self.timeout_s:
                raise TimeoutError(self._stuck(rnd))
            self._receive_here(POLL_S / 2)

    def _stuck(self, rnd: Round) -> str:
        silent = [s for s, i in rnd.incoming.items() if i.first is None]
        no_final = [p for p, o in rnd.outgoing.items() if o.final is None]
        no_commit = [s for s, i in rnd.incoming.items() if i.commit is None]
        return (f"thinwire transport: rank {self.rank}, exchange of step {rnd.step} bucket "
                f"{rnd.bucket} not done after timeout_s={self.timeout_s:g}: never heard from "
                f"rank(s) {silent}, no final acknowledgement from {no_final}, no commit from "
                f"{no_commit} (a peer stopped or its datagrams cannot reach this rank)")

    def _result(self, rnd: Round, cut, wire_bytes: int) -> Exchanged:
        layout = rnd.layout
        parts = []
        for rank in range(len(self.peers) + 1):
            if rank == self.rank:
                mine = {seq: cut.bodies[seq] for seq in rnd.commit}
                parts.append(payloads.assemble(layout, mine))
            else:
                incoming = rnd.incoming[rank]
                parts.append(payloads.assemble(layout, {s: incoming.data[s]
                                                        for s in incoming.commit}))
        lost_seqs = set(range(layout.total)) - rnd.commit
        own_lost = payloads.entries_of(cut, lost_seqs)
        self.counters.lost += len(lost_seqs)
        self.counters.entries += layout.entries
        self.counters.missed_entries += own_lost.numel()
        for incoming in rnd.incoming.values():  # free the payload; the round stays for re-acks
            incoming.data = {}
        return Exchanged(parts, own_lost, wire_bytes)

    def close(self) -> None:
        with self._cond:  # the peers may still need our last commit (the receiver repeats it)
            self._cond.wait_for(lambda: not self._pending, timeout=CLOSE_FLUSH_S)
        self._closing = True
        self._thread.join(timeout=2.0)
        for sock in self._socks:
            sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
