"""DLCP's transport against forged datagrams from a peer's own address (issue 33, item 1): a
claimed total no payload can have, non-finite values and indices outside the bucket are dropped
and counted, never raised in the receiving thread nor applied, and the exchange still gives
what the peers really sent."""

from __future__ import annotations

import struct
import time

import pytest
import torch

from thinwire.transport import payload, wire
from transport_helpers import close_all, make_transports, run_all

NUMEL, K = 20_000, 1500


def _payload(rank: int):
    g = torch.randn(NUMEL, generator=torch.Generator().manual_seed(rank))
    indices = torch.randperm(NUMEL, generator=torch.Generator().manual_seed(10 + rank))[:K]
    return g[indices], indices


def _forge(transports, body_change=None, total=None):
    """Send rank 1's first DATA datagram of round 0, changed, from rank 1's socket to rank 0."""
    sender, receiver = transports[1], transports[0]
    values, indices = _payload(1)
    cut = payload.cut(values, indices, sender.high_share, sender.datagram_bytes)
    layout, seq = cut.layout, 0
    body = bytearray(cut.bodies[seq])
    if body_change is not None:
        body_change(body, layout.span(seq)[1])
    header = wire.Header(wire.DATA, sender.job, 0, 0, 0, 1, seq,
                         layout.total if total is None else total, layout.n_high,
                         *layout.span(seq), wire.SPARSE | wire.HIGH)
    sender._socks[0].sendto(wire.encode(header, bytes(body)),
                            receiver._socks[0].getsockname()[:2])
    time.sleep(0.2)  # filed by rank 0's receiver thread before the real exchange starts


def _nan_value(body: bytearray, count: int) -> None:
    struct.pack_into("f", body, 0, float("nan"))


def _bad_index(index: int):
    def change(body: bytearray, count: int) -> None:
        struct.pack_into("i", body, 4 * count, index)  # values (float32) first, then indices
    return change


@pytest.mark.parametrize("forgery", ["huge_total", "nan", "negative_index", "index_past_end"])
def test_a_forged_datagram_is_dropped_and_the_exchange_gives_the_real_payloads(forgery):
    transports = make_transports(2)
    try:
        change, total = {"huge_total": (None, 100_000), "nan": (_nan_value, None),
                         "negative_index": (_bad_index(-5), None),
                         "index_past_end": (_bad_index(NUMEL + 7), None)}[forgery]
        _forge(transports, change, total)
        results = run_all(transports, lambda rank, t: t.exchange(
            0, 0, *_payload(rank), index_limit=NUMEL))
        for rank, result in enumerate(results):
            assert result.own_lost.numel() == 0
            for peer in range(2):
                values, indices = result.parts[peer]
                want_values, want_indices = _payload(peer)
                order, want = torch.argsort(indices), torch.argsort(want_indices)
                assert torch.equal(indices[order], want_indices[want])
                assert torch.equal(values[order], want_values[want])
        assert transports[0].counters.bad >= 1
        # refused by the checks, not by the receiver's last-resort catch of an exception
        assert not getattr(transports[0], "_handle_failed", False)
    finally:
        close_all(transports)


def test_the_content_check_reads_every_wire_dtype():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        values = torch.tensor([1.0, -2.0, 3.0], dtype=dtype)
        layout = payload.make_layout(3, dtype, False, 0.1)
        raw = payload._raw(values)
        assert payload.check_content(layout, 3, raw) is None
        for bad in (float("nan"), float("inf"), -float("inf")):
            values[1] = bad
            assert payload.check_content(layout, 3, payload._raw(values)) == \
                "a non-finite value", (dtype, bad)
