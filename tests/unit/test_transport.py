"""thinwire.transport on loopback, W transports in one process: lossless round trips, a seeded
loss pattern (conservation, identical replicas), bad input, marks and bounds."""

from __future__ import annotations

import socket
import struct

import pytest
import torch

from thinwire.transport import payload, wire
from thinwire.transport.endpoint import Transport
from thinwire.transport.setup import bind_socket
from transport_helpers import SeededLoss, close_all, make_transports, run_all

W = 3


def _sparse(rank: int, step: int, numel: int = 20_000, k: int = 1500):
    g = torch.randn(numel, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(100 * step + rank))
    indices = torch.randperm(numel, generator=torch.Generator().manual_seed(rank))[:k]
    return g[indices], indices


def _dense_sum(values, indices, numel=20_000):
    return torch.zeros(numel, dtype=values.dtype).index_add_(0, indices, values)


@pytest.fixture
def transports(request):
    made = []

    def make(**options):
        made.extend(make_transports(W, **options))
        return made
    yield make
    close_all(made)


def test_datagram_round_trip_and_corruption_is_detected():
    header = wire.Header(wire.DATA, 7, 3, 11, 2, 1, 5, 9, 2, 100, 20, wire.HIGH)
    datagram = wire.encode(header, b"\x01" * 80)
    assert wire.decode(datagram) == (header, b"\x01" * 80)
    for position in (0, 10, len(datagram) - 1):
        broken = bytearray(datagram)
        broken[position] ^= 0x40
        with pytest.raises(wire.BadDatagram):
            wire.decode(bytes(broken))
    with pytest.raises(wire.BadDatagram):
        wire.decode(datagram[:10])
    assert wire.seqs_of(wire.bitmap({0, 5, 12}, 13), 13) == {0, 5, 12}


def test_the_largest_entries_travel_in_the_high_class():
    values, indices = _sparse(0, 0)
    cut = payload.cut(values, indices, high_share=0.2)
    layout = cut.layout
    assert layout.total == -(-1500 // layout.per_datagram) and layout.n_high == -(-layout.total
                                                                                  // 5)
    high_values, _ = payload.assemble(layout, {s: cut.bodies[s] for s in range(layout.n_high)})
    low_values, _ = payload.assemble(layout, {s: cut.bodies[s]
                                              for s in range(layout.n_high, layout.total)})
    assert high_values.abs().min() >= low_values.abs().max()
    assert cut.send_order[:layout.n_high] == list(range(layout.n_high))
    assert all(len(d) <= wire.MAX_DATAGRAM_BYTES for d in cut.bodies)
    # dense: the datagram with the largest entries is high, entries keep their places
    dense = torch.zeros(5000)
    dense[3000] = 10.0
    cut = payload.cut(dense, None, high_share=0.01)
    assert cut.layout.n_high == 1 and cut.high[3000 // cut.layout.per_datagram]
    got, where = payload.assemble(cut.layout, dict(enumerate(cut.bodies)))
    assert torch.equal(got, dense) and torch.equal(where, torch.arange(5000))
    # original positions of datagram entries map back through the magnitude order
    cut = payload.cut(values, indices, 0.2)
    positions = payload.entries_of(cut, {1})
    got, _ = payload.assemble(cut.layout, {1: cut.bodies[1]})
    assert torch.equal(values[positions], got)


@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_lossless_round_trip_delivers_every_payload_exactly(transports, kind):
    ts = transports(high_share=0.1)

    def one(rank, t):
        values, indices = _sparse(rank, 0)
        if kind == "dense":
            values, indices = _dense_sum(values, indices).float(), None
        return values, indices, t.exchange(0, 4, values, indices)

    results = run_all(ts, one)
    for values, indices, got in results:
        assert got.own_lost.numel() == 0
    for rank, (values, indices, _) in enumerate(results):
        for _, _, got in results:
            part_values, part_indices = got.parts[rank]
            if kind == "dense":
                assert torch.equal(part_values, values)
            else:
                assert torch.equal(_dense_sum(part_values, part_indices),
                                   _dense_sum(values, indices))
    assert all(t.counters.lost == 0 and t.counters.bad == 0 for t in ts)


def test_seeded_loss_conserves_every_entry_and_replicas_agree(transports):
    """applied + returned to error feedback == sent, on every rank; all ranks apply the same."""
    drops = [SeededLoss(seed=3, sender=r, data_rate=0.08, control_rate=0.1) for r in range(W)]
    ts = transports(drops=drops, epsilon=0.02, high_share=0.2, deadline_s=0.1)

    def one(rank, t):
        out = []
        for step in range(3):
            values, indices = _sparse(rank, step)
            out.append((values, indices, t.exchange(step, 0, values, indices)))
        return out

    results = run_all(ts, one)
    lost_total = 0
    for step in range(3):
        for rank in range(W):
            values, indices, got = results[rank][step]
            applied_values, applied_indices = got.parts[rank]
            returned = _dense_sum(values[got.own_lost], indices[got.own_lost])
            applied = _dense_sum(applied_values, applied_indices)
            assert torch.equal(applied + returned, _dense_sum(values, indices))
            lost_total += got.own_lost.numel()
            for other in range(W):  # every rank applies exactly the same entries of `rank`
                theirs = results[other][step][2].parts[rank]
                assert torch.equal(_dense_sum(*theirs), applied)
    assert lost_total > 0  # the pattern did lose low-class entries
    assert sum(t.counters.retransmitted for t in ts) > 0


def test_only_high_datagrams_are_retransmitted_and_all_of_them_arrive(transports):
    drops = [SeededLoss(seed=5, sender=r, data_rate=0.3) for r in range(W)]
    ts = transports(drops=drops, epsilon=0.0, high_share=0.5, deadline_s=0.1)
    results = run_all(ts, lambda rank, t: (t.exchange(0, 0, *_sparse(rank, 0)), t))
    for got, t in results:
        layout = payload.make_layout(1500, torch.float64, True, 0.5)
        high_entries = set(range(layout.n_high * layout.per_datagram))
        lost_sorted = set()  # positions of lost entries in magnitude order are all low
        values, indices = _sparse(t.rank, 0)
        order = torch.argsort(values.abs(), descending=True, stable=True).tolist()
        rank_in_order = {position: i for i, position in enumerate(order)}
        lost_sorted = {rank_in_order[p] for p in got.own_lost.tolist()}
        assert not lost_sorted & high_entries
        assert t.counters.retransmitted > 0


def test_epsilon_outside_its_range_and_oversized_payloads_are_refused(transports):
    sock = bind_socket("127.0.0.1")
    try:
        for bad in (0.2, -0.01, float("nan"), "0.05"):
            with pytest.raises(ValueError, match=r"'epsilon' must be a number in \[0, 0.1\]"):
                Transport(sock, 0, {}, 1, epsilon=bad)
    finally:
        sock.close()
    ts = transports(max_step_bytes=1000)
    with pytest.raises(ValueError, match=r"payload of 1600 bytes .* max_step_bytes"):
        ts[0].exchange(0, 0, torch.zeros(200), torch.arange(200))


def test_datagrams_carry_the_class_of_their_priority():
    receiver = bind_socket("127.0.0.1")
    receiver.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    receiver.settimeout(5)
    sender = Transport(bind_socket("127.0.0.1"), 0, {1: receiver.getsockname()[:2]}, 1,
                       classes=3)
    try:
        seen = []
        for cls in (0, 1, 2):
            sender._send(1, b"x", cls)
            _, ancillary, _, _ = receiver.recvmsg(16, 64)
            seen.append(next(d[0] for level, kind, d in ancillary if kind == socket.IP_TOS))
        assert seen == [(3 - 1 - c) << 5 for c in (0, 1, 2)]
        assert [wire.priority_class(h, p, 4) for h, p in ((True, 0), (False, 0), (False, 1))] \
            == [0, 1, 2]
    finally:
        sender.close()
        receiver.close()


def test_a_flood_of_future_rounds_and_seqs_stays_bounded(transports):
    """A peer flooding the next round (before this rank knows its layout) with distinct
    datagrams fills at most MAX_DATAGRAMS places; rounds further ahead are not kept at all."""
    import time

    ts = transports()
    target, peer = ts[0], ts[1]
    address = target._sock.getsockname()[:2]
    sent = 0
    seqs = range(0, wire.MAX_DATAGRAMS, 2)  # a claimed total beyond one bitmap is bad at once
    for number, steps in ((1, 3), (5, 1), (9, 1)):
        for step in range(steps):
            for seq in seqs:
                header = wire.Header(wire.DATA, target.job, number, step, 0, 1, seq,
                                     wire.MAX_DATAGRAMS, 0, 0, 1)
                peer._sock.sendto(wire.encode(header, b"\x00" * 8), address)
                sent += 1
                if sent % 500 == 0:
                    time.sleep(0.01)  # a loopback socket buffer overflowing would lose some
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        held = sum(len(i.raw) for r in target._rounds.values() for i in r.incoming.values())
        c = target.counters
        if held + c.bad + c.stale + c.duplicates >= sent:
            break
        time.sleep(0.05)
    assert len(target._rounds) <= 2 and held == wire.MAX_DATAGRAMS
    assert target.counters.stale == 2 * len(seqs) and target.counters.bad == 3 * len(seqs) - held
    header = wire.Header(wire.DATA, target.job, 1, 7, 0, 1, 3, wire.MAX_DATAGRAMS + 1, 0, 0, 1)
    peer._sock.sendto(wire.encode(header, b"\x00" * 8), address)
    deadline = time.monotonic() + 10
    while target.counters.bad == 3 * len(seqs) - held and time.monotonic() < deadline:
        time.sleep(0.05)
    assert target.counters.bad == 3 * len(seqs) - held + 1


def test_corrupted_duplicated_reordered_and_foreign_datagrams_never_change_the_result():
    from transport_helpers import Meddler

    clean = make_transports(W)
    try:
        want = run_all(clean, lambda rank, t: t.exchange(0, 0, *_sparse(rank, 0)).parts)
    finally:
        close_all(clean)
    ts = make_transports(W, timeout_s=20)
    stranger = bind_socket("127.0.0.1")
    try:
        for t in ts:
            t._sock = Meddler(t._sock)
        for t in ts:  # a well-formed datagram of this very job, from outside the job
            header = wire.Header(wire.DATA, t.job, 0, 0, 0, (t.rank + 1) % W, 0, 9, 1, 0, 1,
                                 wire.HIGH | wire.SPARSE)
            stranger.sendto(wire.encode(header, b"\x00" * 12), t._sock.getsockname()[:2])
        got = run_all(ts, lambda rank, t: t.exchange(0, 0, *_sparse(rank, 0)).parts)
        for mine, theirs in zip(got, want):
            for (v1, i1), (v2, i2) in zip(mine, theirs):
                assert torch.equal(_dense_sum(v1, i1), _dense_sum(v2, i2))
        assert all(t.counters.bad > 0 and t.counters.duplicates > 0 and
                   t.counters.foreign > 0 and t.counters.lost == 0 for t in ts)
    finally:
        stranger.close()
        close_all(ts)
