"""The DES id stream: what the owners decode is exactly what the requester meant to send."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from thinwire.recsys.routing import block_bytes, decode, encode, int_width
from thinwire.recsys.sharded import owner_of


def _route(ids: torch.Tensor, seg: torch.Tensor, count: int, world: int, dedup: bool,
           id_dtype=torch.int64):
    """Encode as a requester does (touched segments only), then decode each owner's block."""
    dest = owner_of(ids, world)
    key = dest * count + seg
    per_key = torch.bincount(key, minlength=world * count)
    target_keys = per_key.nonzero().squeeze(1)
    sent = torch.bincount(target_keys // count, minlength=world)
    order = torch.argsort(key, stable=True)
    stream, header = encode(ids[order], dest[order], per_key[target_keys], sent, world,
                            id_dtype, dedup)
    id_bytes = torch.empty((), dtype=id_dtype).element_size()
    sizes = block_bytes(header, id_bytes)
    assert int(sizes.sum()) == len(stream)
    got = {}
    for k, (block, row) in enumerate(zip(stream.split(sizes.tolist()), header)):
        got[k] = (decode(block, row[None], id_dtype), target_keys[target_keys // count == k] % count)
    return got, dest, header


def _check(ids, seg, count, world, dedup, id_dtype=torch.int64):
    got, dest, header = _route(ids, seg, count, world, dedup, id_dtype)
    for k, (rec, segs_sent) in got.items():
        mine = dest == k
        # entries as (id, segment) multisets agree
        expect = sorted(zip(ids[mine].tolist(), seg[mine].tolist()))
        seen = sorted(zip(rec.ids[rec.entry_row].tolist(), segs_sent[rec.entry_segment].tolist()))
        assert seen == expect
        assert len(torch.unique(rec.ids)) == len(rec.ids)  # each distinct id looked up once
        assert rec.num_segments == len(segs_sent)
    return header


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 9)), min_size=0, max_size=300),
       st.integers(1, 5), st.booleans())
def test_roundtrip_any_entries(pairs, world, dedup):
    ids = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
    seg = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
    _check(ids, seg, 10, world, dedup)


@pytest.mark.parametrize("distinct, width, id_dtype", [(200, 1, torch.int32),
                                                       (5000, 2, torch.int32),
                                                       (40000, 4, torch.int64)])
def test_index_width_follows_distinct_ids(distinct, width, id_dtype):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, distinct, (3 * distinct,), generator=gen)
    ids[:distinct] = torch.arange(distinct)  # every id present
    seg = torch.randint(0, 64, (len(ids),), generator=gen)
    header = _check(ids, seg, 64, 1, dedup=True, id_dtype=id_dtype)
    assert header[0, 3] == width and header[0, 2] == distinct
    # lengths: ~3 * distinct / 64 entries per segment
    assert header[0, 4] == int_width(int(torch.bincount(seg).max()))


def test_no_dedup_sends_every_id_and_4_byte_lengths():
    ids = torch.tensor([5, 5, 5, 7])
    seg = torch.tensor([0, 0, 1, 1])
    header = _check(ids, seg, 2, 1, dedup=False)
    assert header.tolist() == [[4, 2, 4, 0, 4]]
    header = _check(ids, seg, 2, 1, dedup=True)
    assert header.tolist() == [[4, 2, 2, 1, 1]]


def test_ids_that_hardly_repeat_travel_as_they_are():
    """4-byte ids with 2-byte indices only pay when fewer than half the entries are distinct."""
    ids = torch.arange(3000) % 2000  # 2000 distinct of 3000: 8000 + 6000 > 12000 bytes
    seg = torch.arange(3000) // 10
    header = _check(ids, seg, 300, 1, dedup=True, id_dtype=torch.int32)
    assert header.tolist() == [[3000, 300, 3000, 0, 1]]


def test_int_width_bounds():
    assert [int_width(v) for v in (0, 255, 256, 32767, 32768, 2**31 - 1)] == [1, 1, 2, 2, 4, 4]
    with pytest.raises(ValueError, match="max_value"):
        int_width(2**31)
    with pytest.raises(ValueError, match="max_value"):
        int_width(-1)
