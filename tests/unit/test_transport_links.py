"""Several links per node (issue 20, item 2): datagrams sprayed over a rank's links arrive in
any order and give exactly the single-link result; every link carries its share; datagrams as
large as a jumbo frame allows cut the same payload into fewer of them."""

from __future__ import annotations

import pytest
import torch

from thinwire.transport import wire
from thinwire.transport.endpoint import Transport
from thinwire.transport.setup import bind_socket, link_addresses
from transport_helpers import Shuffler, close_all, make_transports, run_all

W = 3


def _sparse(rank: int, numel: int = 50_000, k: int = 4000):
    g = torch.randn(numel, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    indices = torch.randperm(numel, generator=torch.Generator().manual_seed(10 + rank))[:k]
    return g[indices], indices


def _dense(parts, numel: int = 50_000):
    return [torch.zeros(numel, dtype=torch.float64).index_add_(0, i, v) for v, i in parts]


def _exchange(ts, steps: int = 2):
    return run_all(ts, lambda rank, t: [t.exchange(s, 0, *_sparse(rank)).parts
                                        for s in range(steps)])


@pytest.fixture(scope="module")
def reference():
    """What every rank must hold: each rank's payload, exactly (one link, in order)."""
    ts = make_transports(W)
    try:
        return _exchange(ts)
    finally:
        close_all(ts)


def _equal(got, want) -> bool:
    return all(torch.equal(a, b) for g_rank, w_rank in zip(got, want)
               for g_step, w_step in zip(g_rank, w_rank)
               for a, b in zip(_dense(g_step), _dense(w_step)))


@pytest.mark.parametrize("links", [2, 4])
def test_spraying_over_k_links_uses_every_link_and_changes_nothing(reference, links):
    ts = make_transports(W, links=links)
    try:
        got = _exchange(ts)
        assert _equal(got, reference)
        for t in ts:
            data = t.counters.sent  # DATA datagrams; control ones all take link 0
            # round-robin per peer: every link gets its share of the DATA datagrams
            assert min(t.link_sent) >= data // links - 2 * (W - 1)
            assert all(n > 0 for n in t.link_received)
    finally:
        close_all(ts)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_payload_received_in_a_shuffled_order_gives_the_same_result(reference, seed):
    ts = make_transports(W, timeout_s=30)
    try:
        for t in ts:
            t._sock = Shuffler(t._sock, seed * 10 + t.rank)
        assert _equal(_exchange(ts), reference)
        assert all(t.counters.lost == 0 and t.counters.bad == 0 for t in ts)
    finally:
        close_all(ts)


def test_jumbo_datagrams_carry_the_same_payload_in_fewer_datagrams(reference):
    ts = make_transports(W, datagram_bytes=wire.JUMBO_DATAGRAM_BYTES)
    try:
        assert _equal(_exchange(ts), reference)
        # 4000 entries of 12 bytes: 3 datagrams of <= 8972 bytes (ceil(4000 / 744) = 6) per
        # peer and step, against ceil(4000 / 119) = 34 at 1472 bytes
        assert ts[0].counters.sent == 2 * (W - 1) * 6
    finally:
        close_all(ts)


def test_bad_link_settings_are_refused_with_the_parameter_and_range():
    sock = bind_socket("127.0.0.1")
    try:
        for bad in (100, 9000, 1472.0, True):
            with pytest.raises(ValueError, match=r"datagram_bytes must be an integer in "
                                                 r"\[512, 8972\]"):
                Transport(sock, 0, {}, 1, datagram_bytes=bad)
        with pytest.raises(ValueError, match=r"peers\[1\] has 2 link address\(es\), this rank 1"):
            Transport(sock, 0, {1: [("127.0.0.1", 1), ("127.0.0.1", 2)]}, 1)
    finally:
        sock.close()
    assert link_addresses("10.77.0.3", 3) == ["10.77.0.3", "10.77.1.3", "10.77.2.3"]
    with pytest.raises(ValueError, match="THINWIRE_LINKS_PER_NODE=2 needs the emulated"):
        link_addresses("127.0.0.1", 2)


def test_socket_pacing_gives_the_same_result(reference):
    """pacing='socket' (the shaped cluster's default): no sleeps, full send buffers are waited
    for, the POLL waits for the socket's output queue to drain."""
    ts = make_transports(W, links=2, pacing="socket", rate_bps=50e6)
    try:
        assert all(t.pacing == "socket" for t in ts)
        assert _equal(_exchange(ts), reference)
    finally:
        close_all(ts)
    with pytest.raises(ValueError, match=r"'pacing' must be one of sleep, socket or none, "
                                         r"got 'fast'"):
        make_transports(1, pacing="fast")
