"""In-process transports on loopback: W Transport objects in one process, one thread per rank."""

from __future__ import annotations

import random
import secrets
import threading

from thinwire.transport.endpoint import Transport
from thinwire.transport.setup import bind_socket


def make_transports(world: int, drops=None, links: int = 1, **options) -> list[Transport]:
    """``links`` > 1: every rank gets that many sockets (loopback ports standing in for a
    node's links), and its peers' addresses on each."""
    socks = [[bind_socket("127.0.0.1") for _ in range(links)] for _ in range(world)]
    addresses = [[s.getsockname()[:2] for s in mine] for mine in socks]
    job = secrets.randbits(32)
    drops = drops or [None] * world
    if links == 1:
        return [Transport(s[0], r, {p: addresses[p][0] for p in range(world) if p != r}, job,
                          drop=drops[r], **options) for r, s in enumerate(socks)]
    return [Transport(s, r, {p: addresses[p] for p in range(world) if p != r}, job,
                      drop=drops[r], **options) for r, s in enumerate(socks)]


def run_all(transports, fn):
    """``fn(rank, transport)`` on every rank at once; the results by rank (errors re-raised)."""
    results, errors = [None] * len(transports), []

    def one(rank):
        try:
            results[rank] = fn(rank, transports[rank])
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(transports))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


def close_all(transports) -> None:
    for t in transports:
        t.close()


class SeededLoss:
    """Loses a DATA datagram iff a hash of (seed, sender, receiver, round, seq, attempt) says
    so (the same pattern on every run), and control datagrams at random from a seeded
    generator (they are repeated until answered, so any pattern ends)."""

    def __init__(self, seed: int, sender: int, data_rate: float, control_rate: float = 0.0):
        self.seed, self.sender = seed, sender
        self.data_rate, self.control_rate = data_rate, control_rate
        self.random = random.Random(seed * 1000 + sender)
        self.lock = threading.Lock()

    def __call__(self, kind, dst, round_, seq, attempt) -> bool:
        if kind == 1:  # wire.DATA
            key = f"{self.seed}/{self.sender}/{dst}/{round_}/{seq}/{attempt}"
            return random.Random(key).random() < self.data_rate
        with self.lock:
            return self.random.random() < self.control_rate


class Meddler:
    """Stands in for a transport's socket: before each DATA datagram it sends a corrupted copy
    (one body bit flipped, checksum kept), a copy claiming another step and another claiming
    another bucket (re-checksummed: well-formed but not this exchange's), and it sends every
    datagram twice and holds every third back until after the next two (reordering)."""

    def __init__(self, sock):
        from thinwire.transport import wire
        self.wire, self.sock, self.held, self.count = wire, sock, [], 0
        self.lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.sock, name)

    def _variants(self, datagram: bytes) -> list[bytes]:
        wire = self.wire
        header, body = wire.decode(datagram)
        if header.kind != wire.DATA:
            return [datagram]
        flipped = bytearray(datagram)
        flipped[-1] ^= 0x01
        other_step = wire.encode(header._replace(step=header.step + 1), body)
        other_bucket = wire.encode(header._replace(bucket=header.bucket + 1), body)
        return [bytes(flipped), other_step, other_bucket, datagram, datagram]

    def _out(self, datagrams, send) -> None:
        with self.lock:  # the transport sends from its main and its receiver thread
            self.count += 1
            if self.count % 3 == 0:
                self.held.extend((d, send) for d in datagrams)  # each to its own address
                return
            for d in datagrams:
                send(d)
            if self.count % 3 == 2:
                for d, its_send in self.held:
                    its_send(d)
                self.held = []

    def sendto(self, datagram, address):
        self._out(self._variants(datagram), lambda d: self.sock.sendto(d, address))

    def sendmsg(self, buffers, ancillary, flags, address):
        self._out(self._variants(b"".join(buffers)),
                  lambda d: self.sock.sendmsg([d], ancillary, flags, address))


class Shuffler:
    """Stands in for a transport's socket: holds back every DATA datagram and sends them all
    in a seeded random order when the sender sends its next control datagram (its POLL), so a
    receiver gets a payload in an order unrelated to the one it was sent in."""

    def __init__(self, sock, seed: int):
        from thinwire.transport import wire
        self.wire, self.sock, self.held = wire, sock, []
        self.random = random.Random(seed)
        self.lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.sock, name)

    def _out(self, datagram: bytes, send) -> None:
        with self.lock:
            if self.wire.decode(datagram)[0].kind == self.wire.DATA:
                self.held.append((datagram, send))
                return
            self.random.shuffle(self.held)
            for d, its_send in self.held:
                its_send(d)
            self.held = []
            send(datagram)

    def sendto(self, datagram, address):
        self._out(datagram, lambda d: self.sock.sendto(d, address))

    def sendmsg(self, buffers, ancillary, flags, address):
        self._out(b"".join(buffers), lambda d: self.sock.sendmsg([d], ancillary, flags, address))
