"""CPR checkpoint store: atomic, versioned, checksummed files; exact shard restores."""

import pytest
import torch

from thinwire.recsys.cpr.store import (CheckpointStore, CorruptCheckpoint, decode, encode,
                                       restore_shard, rows_state)
from thinwire.recsys.sharded import EmbeddingShard, SparseOptimizer


def _trained_shard(steps=3, seed=0):
    shard = EmbeddingShard(5, rank=1, world=3, num_rows=300, seed=seed)
    opt = SparseOptimizer("adagrad", 0.1)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.arange(300)[torch.tensor([i % 3 == 0 for i in range(300)])]
    ids = ids[torch.isin(ids, shard.keys)]
    for _ in range(steps):
        _step(shard, opt, gen)
    return shard, opt, gen


def _step(shard, opt, gen):
    pick = shard.keys[torch.randint(len(shard.keys), (40,), generator=gen)]
    opt.step_shard(shard, shard.lookup(pick), torch.randn(40, 5, generator=gen))


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert torch.equal(sa["ids"], sb["ids"]) and torch.equal(sa["rows"], sb["rows"])
    assert sa["optimizer_state"].keys() == sb["optimizer_state"].keys()
    for key in sa["optimizer_state"]:
        assert torch.equal(sa["optimizer_state"][key], sb["optimizer_state"][key])


def test_full_restore_is_exact(tmp_path):
    shard, opt, gen = _trained_shard()
    store = CheckpointStore(tmp_path)
    snapshot = EmbeddingShard(5, rank=1, world=3, num_rows=300)
    snapshot.load_state_dict(shard.state_dict())
    assert store.save("shard1", shard.state_dict()) == 1
    _step(shard, opt, gen)
    assert not torch.equal(shard.rows, snapshot.rows)
    assert restore_shard(store, "shard1", shard) == 1
    _same(shard, snapshot)


def test_deltas_apply_on_top_of_the_base(tmp_path):
    shard, opt, gen = _trained_shard()
    store = CheckpointStore(tmp_path)
    store.save("s", shard.state_dict())
    base = shard.state_dict()
    _step(shard, opt, gen)
    some = shard.keys[:7]
    assert store.save("s", rows_state(shard, some), "delta") == 2
    at_delta = shard.state_dict()
    _step(shard, opt, gen)
    restored = EmbeddingShard(5, rank=1, world=3, num_rows=300, seed=9)
    restore_shard(store, "s", restored)
    got = restored.state_dict()
    in_delta = torch.isin(got["ids"], some)
    assert torch.equal(got["rows"][in_delta], at_delta["rows"][in_delta])
    assert torch.equal(got["rows"][~in_delta], base["rows"][~in_delta])
    acc = got["optimizer_state"]["accumulator"]
    assert torch.equal(acc[in_delta], at_delta["optimizer_state"]["accumulator"][in_delta])


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_corrupt_checkpoint_falls_back_to_previous(tmp_path, damage, caplog):
    shard, opt, gen = _trained_shard()
    store = CheckpointStore(tmp_path, keep=3)
    store.save("s", shard.state_dict())
    first = shard.state_dict()
    _step(shard, opt, gen)
    store.save("s", shard.state_dict())
    newest = store.versions("s")[-1][2]
    data = bytearray(newest.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[:len(data) // 3]
    else:
        data = bytearray()
    newest.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint):
        store.read(newest)
    version, state, deltas = store.load_chain("s")
    assert version == 1 and deltas == []
    assert torch.equal(state["rows"], first["rows"])
    assert "skipping unreadable checkpoint" in caplog.text


def test_no_readable_checkpoint_is_an_error(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.raises(FileNotFoundError, match="no readable full checkpoint"):
        store.load_chain("nothing")


def test_versions_count_up_and_old_ones_are_pruned(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for i in range(4):
        store.save("k", {"x": torch.tensor([i])})
        store.save("k", {"x": torch.tensor([10 + i])}, "delta")
    kept = [(v, kind) for v, kind, _ in store.versions("k")]
    assert kept == [(5, "full"), (6, "delta"), (7, "full"), (8, "delta")]
    version, state, deltas = store.load_chain("k")
    assert version == 7 and int(state["x"]) == 3 and [int(d["x"]) for d in deltas] == [13]
    assert not list(tmp_path.glob("*.tmp"))


def test_payload_is_loaded_weights_only():
    class Evil:  # an arbitrary object: refused by weights_only loading
        pass
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        decode(encode({"obj": Evil()}))


def test_bad_arguments(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.raises(ValueError, match="kind must be one of"):
        store.save("k", {}, kind="partial")
    with pytest.raises(ValueError, match="keep must be >= 1"):
        CheckpointStore(tmp_path, keep=0)


def test_a_corrupt_middle_delta_ends_the_chain_there(tmp_path, caplog):
    """The deltas after a corrupt one changed rows on top of it: applying them without it
    would build a state that never existed (issue 33, item 4)."""
    store = CheckpointStore(tmp_path, keep=3)
    store.save("k", {"x": torch.tensor([1])}, "full")
    for value in (11, 12, 13):
        store.save("k", {"x": torch.tensor([value])}, "delta")
    middle = [path for version, kind, path in store.versions("k") if version == 3][0]
    middle.write_bytes(middle.read_bytes()[:-7])  # truncated
    with caplog.at_level("WARNING"):
        version, state, deltas = store.load_chain("k")
    assert version == 1 and [int(d["x"]) for d in deltas] == [11]
    assert "1 later delta(s) not applied" in caplog.text


@pytest.mark.parametrize("damage, message", [
    (lambda d: d["rows"].view(-1).__setitem__(0, float("nan")),
     "rows must be a 2-D tensor of finite"),
    # a (1, dim) accumulator would broadcast over every row it is written to
    (lambda d: d["optimizer_state"].__setitem__("accumulator", torch.ones(1, 5)),
     "optimizer_state['accumulator'] must be finite and of the rows' shape"),
    (lambda d: d.__setitem__("rows", torch.zeros(2, 5)), "rows of shape (ids, 5)"),
])
def test_a_delta_that_means_nothing_ends_the_chain_before_it(tmp_path, caplog, damage,
                                                            message):
    # checksummed and readable, but not rows of this shard: applied, it would build a state
    # that never existed; the restore stops before it, as at an unreadable delta
    shard, opt, gen = _trained_shard()
    store = CheckpointStore(tmp_path)
    store.save("s", shard.state_dict())
    base = shard.state_dict()
    _step(shard, opt, gen)
    delta = rows_state(shard, shard.keys[:7])
    damage(delta)
    store.save("s", delta, "delta")
    restored = EmbeddingShard(5, rank=1, world=3, num_rows=300, seed=9)
    assert restore_shard(store, "s", restored) == 1
    assert torch.equal(restored.state_dict()["rows"], base["rows"])  # the base, untouched
    assert message in caplog.text


def test_a_full_file_whose_rows_are_not_finite_is_refused(tmp_path):
    shard, _, _ = _trained_shard()
    state = shard.state_dict()
    state["rows"][3, 1] = float("inf")
    with pytest.raises(ValueError, match="shard state: rows must be a 2-D tensor of finite"):
        EmbeddingShard(5, rank=1, world=3, num_rows=300).load_state_dict(state)
