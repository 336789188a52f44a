"""The receiving half of :class:`thinwire.transport.endpoint.Transport`: the thread that files
incoming datagrams into rounds and answers POLLs and COMMITs (the sending half and the round's
own sequence are in endpoint.py, which explains the protocol).

Everything here runs under the transport's condition lock, taken once per batch of datagrams:
at 100 Mbit/s a rank receives ~9,000 datagrams a second, and a lock, a wake-up and a time
stamp per datagram were a measurable part of the CPU a rank gets on a busy host.
"""

from __future__ import annotations

import logging
import time

from thinwire.transport import wire
from thinwire.transport.rounds import Round, check_data, complete

log = logging.getLogger(__name__)
POLL_S = 0.01  # endpoint.POLL_S: a commit not acknowledged is repeated this often


def poll_timeout_ms(pending: dict) -> int:
    """How long the receiver thread may block in poll(): short while a commit is pending."""
    return int(POLL_S * 1000) if pending else IDLE_POLL_MS

RECEIVE_BATCH = 256       # datagrams the receiver thread files under one lock
# while a payload streams in, the thread sleeps this long before draining again, so that one
# wake-up files many datagrams (at 100 Mbit/s a 1472-byte datagram arrives every 0.12 ms)
COALESCE_S = 0.002
IDLE_POLL_MS = 200        # the thread checks for close this often


class Receiver:
    """Mixin: needs ``_socks``, ``link_received``, ``_poller``, ``_main_poller``,
    ``_main_reads``, ``_receiver_wake``, ``_pending``, ``_cond``, ``_rounds``, ``_current``,
    ``_closing``, ``_rank_of``, ``_budget_s``, ``peers``, ``job``, ``rank``, ``epsilon``,
    ``counters`` and ``_control`` of the Transport."""

    def _maybe_final(self, rnd: Round, sender: int, incoming, now: float) -> None:
        if incoming.final is not None or not rnd.registered:
            return
        late = incoming.polled is not None and now - incoming.polled >= self._budget_s
        if complete(rnd.layout, incoming, self.epsilon) or late:
            incoming.final = frozenset(incoming.data)
            self._ack(rnd, sender, incoming)

    def _ack(self, rnd: Round, sender: int, incoming) -> None:
        if rnd.registered:
            seqs, total = (incoming.final if incoming.final is not None else incoming.data), \
                rnd.layout.total
        else:
            total = max((h.total for h, _ in incoming.raw.values()), default=0)
            seqs = {seq for _, _, seq in incoming.raw}
        flags = wire.FINAL if incoming.final is not None else 0
        self._control(rnd, wire.ACK, sender, wire.bitmap(seqs, total), flags, total)

    def _on_data(self, rnd: Round, sender: int, header: wire.Header, body: bytes,
                 now: float, decide: bool = True) -> None:
        incoming = rnd.incoming[sender]
        if incoming.first is None:
            incoming.first = now
        if not rnd.registered:
            # keyed by the claimed exchange too: a datagram claiming another step must not
            # take the place of the real one before the layout can tell them apart
            key = (header.step, header.bucket, header.seq)
            # no payload has more datagrams than one bitmap holds: a larger claimed total would
            # make this rank's ACK too large to send (a forged total=100000 crashed a rank)
            if header.seq >= header.total or header.total > wire.MAX_DATAGRAMS \
                    or len(incoming.raw) >= wire.MAX_DATAGRAMS:
                self.counters.bad += 1
            elif key in incoming.raw:
                self.counters.duplicates += 1
            else:
                incoming.raw[key] = (header, body)
            return
        if header.step != rnd.step or header.bucket != rnd.bucket:
            self.counters.bad += 1
            return
        why = check_data(rnd.layout, header, body)
        if why is not None:
            log.debug("rank %d: datagram from rank %d dropped: %s", self.rank, sender, why)
            self.counters.bad += 1
        elif incoming.final is not None:
            self.counters.late += 1
        elif header.seq in incoming.data:
            self.counters.duplicates += 1
        else:
            incoming.data[header.seq] = body
            incoming.high += header.high
            if decide:
                self._maybe_final(rnd, sender, incoming, now)

    def _handle(self, sender: int, header: wire.Header, body: bytes, now: float) -> None:
        number = header.round
        pending = self._pending.get(sender)
        # acknowledged, or the peer has started a later round of its own (DATA, POLL, COMMIT:
        # it cannot have finished this one without our commit; an ACK it may send before)
        if pending is not None and ((number > pending[0].number and header.kind != wire.ACK)
                                    or (number == pending[0].number
                                        and header.kind == wire.COMMIT_ACK)):
            del self._pending[sender]
            if not self._pending:
                self._cond.notify_all()  # close() may wait for this
            if number == pending[0].number:
                return
        if header.kind == wire.COMMIT and number < self._current:
            rnd = Round(number, ())  # a commit this rank already holds: its ack was lost
            rnd.step, rnd.bucket = header.step, header.bucket
            self._control(rnd, wire.COMMIT_ACK, sender)
            return
        if number not in (self._current, self._current + 1):
            self.counters.stale += 1
            return
        rnd = self._rounds.get(number)
        if rnd is None:
            if len(self._rounds) >= 2:
                self.counters.stale += 1
                return
            rnd = self._rounds[number] = Round(number, tuple(self.peers))
        if rnd.registered and (header.step != rnd.step or header.bucket != rnd.bucket):
            if header.kind == wire.ACK:  # an answer sent before that rank knew the exchange
                self.counters.stale += 1
            else:
                self.counters.bad += 1
            return
        if header.kind == wire.DATA:
            self._on_data(rnd, sender, header, body, now)
        elif header.kind == wire.POLL:
            incoming = rnd.incoming[sender]
            if incoming.first is None:
                incoming.first = now
            if incoming.polled is None:
                incoming.polled = now
            self._maybe_final(rnd, sender, incoming, now)
            self._ack(rnd, sender, incoming)
        elif not rnd.registered:
            self.counters.stale += 1
        elif header.kind == wire.ACK:
            if header.total != rnd.layout.total:
                self.counters.stale += 1  # answered a poll before that rank had the layout
                return
            out = rnd.outgoing[sender]
            seqs = frozenset(wire.seqs_of(body, rnd.layout.total))
            out.ack, out.ack_version = seqs, out.ack_version + 1
            if header.final and out.final is None:
                out.final = seqs
        elif header.kind == wire.COMMIT:
            incoming = rnd.incoming[sender]
            seqs = frozenset(wire.seqs_of(body, rnd.layout.total))
            if incoming.final is None or not seqs <= incoming.final:
                self.counters.bad += 1  # a commit of datagrams this rank never reported
                return
            incoming.commit = seqs
            self._control(rnd, wire.COMMIT_ACK, sender)
        elif header.kind == wire.COMMIT_ACK:
            rnd.outgoing[sender].commit_acked = True

    def _receive_loop(self) -> None:
        streaming = False  # the last batch was all DATA: more of the payload is on its way
        while not self._closing:
            if self._main_reads:  # the exchanging thread reads the sockets itself meanwhile
                self._receiver_wake.wait(IDLE_POLL_MS / 1000)
                continue
            ready = self._poller.poll(poll_timeout_ms(self._pending))
            if not ready:
                self._repeat_pending()
                continue
            if streaming:
                time.sleep(COALESCE_S)
            # drained under the lock, and only while the exchanging thread is not reading: a
            # batch drained here but left waiting for the lock would hold datagrams back from
            # the exchanging thread's deadline (a lossless exchange then lost one, 1 run in 3)
            with self._cond:
                if self._main_reads:
                    continue
                try:
                    batch = self._drain()
                except OSError:
                    if self._closing:
                        return
                    raise
                if batch:
                    streaming = self._receive_batch(batch)
            self._repeat_pending()

    def _drain(self) -> list:
        """Whatever is queued on each link, up to a batch per link. Called by the receiver
        thread under the lock, by the exchanging thread (``_receive_here``) without it."""
        batch = []
        for link, sock in enumerate(self._socks):
            before = len(batch)
            try:
                while len(batch) - before < RECEIVE_BATCH:
                    batch.append(sock.recvfrom(65536))
            except BlockingIOError:
                pass
            self.link_received[link] += len(batch) - before
        return batch

    def _receive_here(self, timeout_s: float) -> None:
        """The exchanging thread, holding the lock once, waits up to ``timeout_s`` for
        datagrams and files them itself: an answer it waits for then needs no hand-off from
        the receiver thread (one scheduling delay less per answer on a busy host)."""
        self._cond.release()
        try:
            batch = self._drain() if self._main_poller.poll(int(timeout_s * 1000)) else []
        finally:
            self._cond.acquire()
        if batch:
            self._receive_batch(batch)
        self._repeat_pending()

    def _repeat_pending(self) -> None:
        """Repeat the last round's commit to the peers that have not acknowledged it."""
        if not self._pending:
            return
        with self._cond:
            now = time.perf_counter()
            for peer, (rnd, bits) in list(self._pending.items()):
                out = rnd.outgoing[peer]
                if now - out.last_commit >= POLL_S:
                    out.last_commit = now
                    self._control(rnd, wire.COMMIT, peer, bits, total=rnd.layout.total)

    def _receive_batch(self, batch: list) -> bool:
        """File a batch; True if it held DATA only (a payload is streaming in)."""
        parsed, notify = [], False
        for datagram, address in batch:
            sender = self._rank_of.get(address[:2])
            if sender is None:
                self.counters.foreign += 1  # not from this job's ranks: never parsed
                continue
            try:
                header, body = wire.decode(datagram)
            except wire.BadDatagram:
                self.counters.bad += 1
                continue
            if header.job != self.job:
                self.counters.foreign += 1
            elif header.sender != sender:
                self.counters.bad += 1
            else:
                parsed.append((sender, header, body))
                notify |= header.kind != wire.DATA  # main waits on answers; data it polls for
        if not parsed:
            return False
        with self._cond:
            now = time.perf_counter()
            for sender, header, body in parsed:
                try:
                    self._handle(sender, header, body, now)
                except wire.BadDatagram:
                    self.counters.bad += 1
                except Exception as exc:  # noqa: BLE001 - a datagram must not end this thread
                    # (the exchange would wait out its timeout): counted, the first one logged
                    self.counters.bad += 1
                    if not getattr(self, "_handle_failed", False):
                        self._handle_failed = True
                        log.warning("rank %d: a datagram from rank %d could not be handled "
                                    "(%s: %s); dropped, and such datagrams are counted as bad",
                                    self.rank, sender, type(exc).__name__, exc)
            if notify:
                self._cond.notify_all()
        return not notify

