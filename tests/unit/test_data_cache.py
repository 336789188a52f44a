"""The cache's tiers and policies, over a file:// store (no server needed)."""

from __future__ import annotations

import errno
import multiprocessing
import os
import subprocess
import time
import warnings

import pytest
import torch

from data_helpers import write_records
from thinwire.data import (CacheStats, CachedDataset, DiskFullWarning, NodePartitionSampler,
                           Shards)
from thinwire.data import tiers
from thinwire.data.tiers import DiskTier, MemoryTier

SIZE = 1000


@pytest.fixture
def records(tmp_path):
    payloads = write_records(tmp_path / "store", 40, SIZE)
    urls = [f"file://{tmp_path}/store/rec-{i:05d}.bin" for i in range(len(payloads))]
    return urls, payloads


def _epoch(ds, seed):
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed)).tolist()
    return [ds[i] for i in order], order


def test_memory_tier_static_never_evicts():
    tier = MemoryTier(3 * SIZE, "static", CacheStats())
    for i in range(5):
        tier.put(str(i), bytes(SIZE))
    assert [str(i) in tier for i in range(5)] == [True, True, True, False, False]
    assert tier.used == 3 * SIZE and tier.stats.l1.rejected == 2 and tier.stats.l1.evictions == 0


def test_memory_tier_lru_evicts_least_recent():
    tier = MemoryTier(3 * SIZE, "lru", CacheStats())
    for key in "abc":
        tier.put(key, bytes(SIZE))
    assert tier.get("a") is not None          # a is now the most recent
    tier.put("d", bytes(SIZE))
    assert "b" not in tier and all(k in tier for k in "acd") and tier.used <= tier.capacity


@pytest.mark.parametrize("policy", ["static", "lru"])
def test_disk_stays_within_its_budget(records, tmp_path, policy):
    urls, payloads = records
    budget = 10 * (SIZE + tiers.ENTRY_OVERHEAD)
    with CachedDataset(urls, memory_bytes=0, disk_dir=tmp_path / "l2", disk_bytes=budget,
                       policy=policy) as ds:
        for _ in range(2):
            got, order = _epoch(ds, 0)
            assert got == [payloads[i] for i in order]
        on_disk = sum(f.stat().st_size for f in (tmp_path / "l2" / "objects").rglob("*")
                      if f.is_file())
        assert on_disk <= budget and ds.l2.used == on_disk
        if policy == "lru":
            assert ds.stats.l2.evictions > 0
        else:
            assert ds.stats.l2.evictions == 0 and on_disk == budget


def test_static_hit_rate_is_cache_over_dataset(records):
    urls, _ = records
    rates = {}
    for policy in ("static", "lru"):
        ds = CachedDataset(urls, memory_bytes=len(urls) * SIZE // 2, policy=policy)
        _epoch(ds, 1)
        assert ds.stats.hit_rate == 0            # a permutation reads every item once
        for epoch in (2, 3, 4):
            ds.stats.reset()
            _epoch(ds, epoch)
            rates.setdefault(policy, []).append(ds.stats.hit_rate)
    assert rates["static"] == [0.5, 0.5, 0.5]
    assert max(rates["lru"]) < 0.4               # lru thrashes under per-epoch permutations


def test_restart_reads_from_disk_and_fills_memory(records, tmp_path):
    urls, payloads = records
    kwargs = dict(memory_bytes=10**6, disk_dir=tmp_path / "l2", disk_bytes=10**6)
    with CachedDataset(urls, **kwargs) as ds:
        _epoch(ds, 0)
    for path in (tmp_path / "store").iterdir():  # the remote store is gone
        path.unlink()
    with CachedDataset(urls, **kwargs) as ds:
        got, order = _epoch(ds, 1)
        assert got == [payloads[i] for i in order]
        assert ds.stats.l2.hits == len(urls) and ds.stats.remote.hits == 0
        ds.stats.reset()
        _epoch(ds, 2)
        assert ds.stats.l1.hits == len(urls)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_corrupt_l2_entry_is_detected_and_fetched_again(records, tmp_path, damage):
    urls, payloads = records
    kwargs = dict(memory_bytes=0, disk_dir=tmp_path / "l2", disk_bytes=10**6)
    with CachedDataset(urls, **kwargs) as ds:
        ds[3]
        path = ds.l2.path_for(urls[3])
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x01
    elif damage == "truncate":
        raw = raw[: len(raw) - 7]
    elif damage == "empty":
        raw = bytearray()
    else:
        raw = bytearray(b"not a cache entry" * 10)
    path.write_bytes(bytes(raw))
    with CachedDataset(urls, **kwargs) as ds:
        assert ds[3] == payloads[3]
        assert ds.stats.corrupt == 1 and ds.stats.remote.hits == 1
        assert ds[3] == payloads[3] and ds.stats.l2.hits == 1   # the entry was written again
        assert ds.l2.used == len(payloads[3]) + tiers.ENTRY_OVERHEAD


def test_full_disk_carries_on_from_memory_with_one_warning(records, tmp_path, monkeypatch):
    urls, payloads = records

    def no_space(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tiers, "_write_all", no_space)
    with CachedDataset(urls, memory_bytes=10**6, disk_dir=tmp_path / "l2",
                       disk_bytes=10**6) as ds:
        with pytest.warns(DiskFullWarning) as caught:
            got, order = _epoch(ds, 0)
        assert len([w for w in caught if issubclass(w.category, DiskFullWarning)]) == 1
        assert got == [payloads[i] for i in order]
        assert ds.stats.disk_full == 1 and not list((tmp_path / "l2" / "tmp").iterdir())
        ds.stats.reset()
        _epoch(ds, 1)
        assert ds.stats.l1.hits == len(urls)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_really_full_disk(records, tmp_path):
    urls, payloads = records
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with CachedDataset(urls, memory_bytes=10**6, disk_dir=mount, disk_bytes=10**6) as ds:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got, order = _epoch(ds, 0)
            assert len([w for w in caught if issubclass(w.category, DiskFullWarning)]) == 1
            assert got == [payloads[i] for i in order] and ds.stats.disk_full == 1
            for i in range(len(urls)):           # every entry that made it is whole
                assert ds.l2.get(urls[i]) in (None, payloads[i])
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _same_entry_writer(directory, key, payload, rounds):
    tier = DiskTier(directory, 10**7, "lru", CacheStats())
    for round_ in range(rounds):
        tier.put(key, payload)
        if round_ % 2:
            tier._discard(tier.path_for(key))  # so that a later round fills it again
    tier.put(key, payload)  # the entry ends filled, so a late reader still finds it


def _reader(directory, key, payload, rounds, out, deadline_s=30.0):
    """At least ``rounds`` reads, and on until one found the entry: how the processes are
    scheduled must not decide whether the reader ever saw it (it once read 400 times before
    either writer had put anything)."""
    tier = DiskTier(directory, 10**7, "lru", CacheStats())
    seen = torn = reads = 0
    end = time.monotonic() + deadline_s
    while (reads < rounds or not seen) and time.monotonic() < end:
        got = tier.get(key)
        reads += 1
        if got is not None:
            seen += 1
            torn += got != payload
    out.put((seen, torn, tier.stats.corrupt))


def test_processes_filling_the_same_entry_never_tear_it(tmp_path):
    payload = os.urandom(256 * 1024)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    writers = [ctx.Process(target=_same_entry_writer, args=(tmp_path, "k", payload, 60))
               for _ in range(2)]
    reader = ctx.Process(target=_reader, args=(tmp_path, "k", payload, 400, out))
    for p in writers + [reader]:
        p.start()
    seen, torn, corrupt = out.get(timeout=60)
    for p in writers + [reader]:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert seen > 0 and torn == 0 and corrupt == 0
    assert not list((tmp_path / "tmp").iterdir())


def _rank(urls, directory, seed, out):
    with CachedDataset(urls, memory_bytes=0, disk_dir=directory, disk_bytes=10**6) as ds:
        got, order = _epoch(ds, seed)
        out.put((seed, got, order, ds.stats.remote.hits, ds.stats.l2.hits))


def test_ranks_of_a_node_share_one_disk_cache(records, tmp_path):
    urls, payloads = records
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(urls, tmp_path / "l2", seed, out))
             for seed in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for _, got, order, remote, l2 in results:
        assert got == [payloads[i] for i in order] and remote + l2 == len(urls)
    with CachedDataset(urls, memory_bytes=0, disk_dir=tmp_path / "l2", disk_bytes=10**6) as ds:
        assert [ds[i] for i in range(len(urls))] == payloads
        assert ds.stats.l2.hits == len(urls) and ds.stats.corrupt == 0
        on_disk = sum(f.stat().st_size for f in (tmp_path / "l2" / "objects").rglob("*")
                      if f.is_file())
        assert ds.l2.used == on_disk == len(urls) * (SIZE + tiers.ENTRY_OVERHEAD)


def test_prefetch_keeps_the_order_and_the_statistics(records):
    urls, payloads = records
    with CachedDataset(urls, memory_bytes=len(urls) * SIZE // 2, prefetch_threads=4,
                       prefetch_depth=8) as ds:
        order = torch.randperm(len(urls)).tolist()
        assert list(ds.prefetching(order)) == order
        got = [ds[i] for i in ds.prefetching(order)]
        assert got == [payloads[i] for i in order]
        assert len(ds._ready) <= 2 * ds.prefetch_depth
        stats = ds.stats.snapshot()
        assert stats["requests"] == len(urls) and stats["downloaded"] >= len(urls) * SIZE // 2


def test_dataloader_workers_and_shards(tmp_path):
    payloads = write_records(tmp_path / "store", 3, 4 * 100)   # 3 shards of 4 records
    urls = [f"file://{tmp_path}/store/rec-{i:05d}.bin" for i in range(3)]
    source = Shards(urls, record_bytes=100, records_per_shard=4, num_records=11)
    with CachedDataset(source, memory_bytes=10**6, disk_dir=tmp_path / "l2",
                       disk_bytes=10**6) as ds:
        assert len(ds) == 11 and ds[5] == payloads[1][100:200]
        loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2,
                                             collate_fn=lambda b: b)
        got = [record for batch in loader for record in batch]
        assert got == [payloads[i // 4][(i % 4) * 100:(i % 4 + 1) * 100] for i in range(11)]
        assert ds.stats.downloaded == 400    # the workers counted their own reads, not ours
    with pytest.raises(ValueError, match="num_records"):
        Shards(urls, record_bytes=100, records_per_shard=4, num_records=13)


def test_node_partition_sampler_is_fixed_per_node_and_disjoint():
    per_node = []
    for node in range(2):
        ranks = [NodePartitionSampler(23, node, 2, rank, 2, seed=3) for rank in range(2)]
        sets = []
        for epoch in (0, 1):
            for s in ranks:
                s.set_epoch(epoch)
            seen = [list(s) for s in ranks]
            assert len(seen[0]) == len(seen[1]) == len(ranks[0])
            sets.append(set(seen[0]) | set(seen[1]))
        assert sets[0] == sets[1]                # the node's partition does not move
        per_node.append(sets[0])
    assert not per_node[0] & per_node[1] and per_node[0] | per_node[1] == set(range(23))


def test_warm_command_fills_the_disk_cache(records, tmp_path, capsys):
    from thinwire.cli import main

    urls, payloads = records
    pattern = f"file://{tmp_path}/store/*.bin"
    code = main(["data", "warm", pattern, "--disk-dir", str(tmp_path / "l2"),
                 "--disk-bytes", "20K", "--quiet"])
    assert code == 0 and "warmed" in capsys.readouterr().out
    with CachedDataset(urls, memory_bytes=0, disk_dir=tmp_path / "l2",
                       disk_bytes=20 * 1024) as ds:
        got, _ = _epoch(ds, 0)
        # static: as many as fit
        assert ds.stats.l2.hits == 20 * 1024 // (SIZE + tiers.ENTRY_OVERHEAD)


def test_inputs_are_checked(records, tmp_path):
    urls, _ = records
    with pytest.raises(ValueError, match="policy must be one of"):
        CachedDataset(urls, policy="fifo")
    with pytest.raises(ValueError, match="disk_bytes must be > 0"):
        CachedDataset(urls, disk_dir=tmp_path)
    with pytest.raises(ValueError, match="memory_bytes must be"):
        CachedDataset(urls, memory_bytes=-1)
    with pytest.raises(TypeError, match="source must be"):
        CachedDataset(42)
    with pytest.raises(IndexError):
        CachedDataset(urls)[len(urls)]
