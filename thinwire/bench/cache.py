"""`thinwire bench cache`: the multi-level data cache against a rate-limited HTTP store.

Synthetic records (random bytes, written to a temporary directory and removed afterwards) are
served by a local nginx on 127.0.0.1 paced to `--rate` (thinwire.data.nginx). Measured, in
samples/s through a DataLoader (random order per epoch, batch 64, no workers):

- direct: reading the remote store for every sample, no cache (`--direct-samples` of them: the
  rate is steady, so a slice of an epoch measures it);
- cold / warm: a CachedDataset (static, L1 = `--memory-fraction` of the data, L2 = all of it)
  in its first epoch (everything from the remote store, with prefetch) and second;
- in_memory / l1: a plain dataset over a list of bytes against a CachedDataset whose L1 holds
  everything - the cost of the cache's hit path;
- hit rates of static and lru with a cache of `--cache-fraction` of the data (L1 only), over the
  second epoch; these runs use an unthrottled server, since hit rates do not depend on speed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.utils.data

from thinwire.bench.report import format_table, median_time, save_if_asked

COLUMNS = ("run", "epoch", "samples", "samples_per_s", "hit_rate", "l1_hits", "l2_hits",
           "remote_hits")


class _DirectRemote(torch.utils.data.Dataset):
    """The baseline without a cache: every sample is one request to the store."""

    def __init__(self, urls):
        import fsspec
        self.urls, self.fs = urls, fsspec.filesystem("http")

    def __len__(self):
        return len(self.urls)

    def __getitem__(self, index):
        return self.fs.cat_file(self.urls[index])


class _InMemory(torch.utils.data.Dataset):
    """The plain in-memory dataset: a list of the same bytes."""

    def __init__(self, records):
        self.records = records

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        return self.records[index]


def _collate(batch):
    return batch


def _epoch(dataset, epoch: int, limit: int | None = None, prefetch=None) -> tuple[int, float]:
    """Samples read and seconds taken for one random-order epoch (optionally its first `limit`)."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(epoch)).tolist()
    if limit is not None:
        order = order[:limit]
    sampler = prefetch(order) if prefetch else order
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, sampler=sampler,
                                         num_workers=0, collate_fn=_collate)
    count = 0
    start = time.perf_counter()
    for batch in loader:
        count += len(batch)
    return count, time.perf_counter() - start


def _row(run: str, epoch: int, count: int, seconds: float, stats=None) -> dict:
    row = {"run": run, "epoch": epoch, "samples": count, "samples_per_s": count / seconds}
    if stats is not None:
        snap = stats.snapshot()
        row.update(hit_rate=snap["hit_rate"], l1_hits=snap["l1"]["hits"],
                   l2_hits=snap["l2"]["hits"], remote_hits=snap["remote"]["hits"])
    return row


def run(records: int = 10_000, record_kb: float = 100, rate: str = "100mbit",
        memory_fraction: float = 0.5, cache_fraction: float = 0.5, threads: int = 8,
        depth: int = 64, direct_samples: int = 1000, seed: int = 0) -> dict:
    from thinwire.data import CachedDataset
    from thinwire.data.nginx import NginxServer, parse_byte_rate

    if records < 2:
        raise ValueError(f"records must be >= 2, got {records}")
    for name, value in (("memory_fraction", memory_fraction), ("cache_fraction", cache_fraction)):
        if not 0 < value <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {value}")
    record_bytes = int(record_kb * 1000)
    if record_bytes < 1:
        raise ValueError(f"record_kb must give at least one byte, got {record_kb}")
    total = records * record_bytes
    rows: list[dict] = []
    work = Path(tempfile.mkdtemp(prefix="thinwire-bench-cache-"))
    try:
        store = work / "store" / "records"
        store.mkdir(parents=True)
        rng = np.random.default_rng(seed)
        payloads = []
        for i in range(records):
            data = rng.bytes(record_bytes)
            (store / f"{i:06d}.bin").write_bytes(data)
            payloads.append(data)
        paths = [f"records/{i:06d}.bin" for i in range(records)]

        with NginxServer(work / "store", rate=rate, request_bytes=record_bytes) as slow:
            urls = [slow.url(p) for p in paths]
            direct = _DirectRemote(urls)
            count, seconds = _epoch(direct, 0, limit=min(direct_samples, records))
            rows.append(_row("direct", 1, count, seconds))

            cached = CachedDataset(urls, memory_bytes=int(total * memory_fraction),
                                   disk_dir=work / "cache", disk_bytes=total + records * 64,
                                   policy="static", prefetch_threads=threads,
                                   prefetch_depth=depth)
            with cached:
                for epoch in (1, 2):
                    cached.stats.reset()
                    count, seconds = _epoch(cached, epoch, prefetch=cached.prefetching)
                    rows.append(_row("cached", epoch, count, seconds, cached.stats))
                    if cached.stats.hit_rate < 1.0 and epoch == 2:
                        rows[-1]["note"] = "the L2 budget did not hold every record"

            # L1 hit path against a plain in-memory dataset, both fed from local copies.
            full = CachedDataset(urls, memory_bytes=total, disk_dir=work / "cache",
                                 disk_bytes=total + records * 64, prefetch_threads=threads)
            with full:
                full.warm(threads=threads, progress=False)      # from L2: no network
                plain = _InMemory(payloads)
                # Short loops on a shared machine: the median of 7 alternating runs each.
                t_plain, t_l1 = [], []
                for repeat in range(8):                         # the first pair warms up
                    count, seconds = _epoch(plain, 10 + repeat)
                    t_plain.append(seconds)
                    full.stats.reset()
                    count, seconds = _epoch(full, 10 + repeat)
                    t_l1.append(seconds)
                rows.append(_row("in_memory", 1, count, statistics.median(t_plain[1:])))
                rows.append(_row("l1_only", 1, count, statistics.median(t_l1[1:]), full.stats))
                # The bare __getitem__ paths, without the DataLoader around them.
                order = torch.randperm(records).tolist()
                t_plain_get = median_time(lambda: [plain[i] for i in order], repeats=7)
                t_l1_get = median_time(lambda: [full[i] for i in order], repeats=7)

        hit_rates = {}
        with NginxServer(work / "store") as fast:
            urls = [fast.url(p) for p in paths]
            for policy in ("static", "lru"):
                ds = CachedDataset(urls, memory_bytes=int(total * cache_fraction), policy=policy,
                                   prefetch_threads=threads, prefetch_depth=depth)
                with ds:
                    for epoch in (1, 2):
                        ds.stats.reset()
                        count, seconds = _epoch(ds, 20 + epoch, prefetch=ds.prefetching)
                        rows.append(_row(f"{policy}_{cache_fraction:g}", epoch, count, seconds,
                                         ds.stats))
                    hit_rates[policy] = ds.stats.hit_rate
                    cached_fraction = len(ds.l1) / records
    finally:
        shutil.rmtree(work, ignore_errors=True)

    by = {(r["run"], r["epoch"]): r for r in rows}
    direct_rate = by[("direct", 1)]["samples_per_s"]
    warm_rate = by[("cached", 2)]["samples_per_s"]
    l1_ratio = by[("l1_only", 1)]["samples_per_s"] / by[("in_memory", 1)]["samples_per_s"]
    return {
        "setting": {"records": records, "record_bytes": record_bytes, "rate": rate,
                    "rate_bytes_per_s": parse_byte_rate(rate), "memory_fraction": memory_fraction,
                    "threads": threads, "depth": depth, "direct_samples": direct_samples,
                    "batch_size": 64, "cpu_count": os.cpu_count()},
        "rows": rows,
        "direct_remote_samples_per_s": direct_rate,
        "cold_samples_per_s": by[("cached", 1)]["samples_per_s"],
        "warm_samples_per_s": warm_rate,
        "warm_speedup_vs_remote": warm_rate / direct_rate,
        "in_memory_samples_per_s": by[("in_memory", 1)]["samples_per_s"],
        "l1_samples_per_s": by[("l1_only", 1)]["samples_per_s"],
        "l1_vs_in_memory_ratio": l1_ratio,
        "l1_vs_in_memory_ratio_getitem": t_plain_get / t_l1_get,
        "cache_fraction": cache_fraction,
        "static_cached_fraction": cached_fraction,
        "static_hit_rate": hit_rates["static"],
        "lru_hit_rate": hit_rates["lru"],
        "targets": {"warm_speedup_vs_remote>=10": warm_rate / direct_rate >= 10,
                    "l1_vs_in_memory_ratio>=0.5": l1_ratio >= 0.5,
                    "static_hit_rate_within_0.02": abs(hit_rates["static"] - cache_fraction)
                    <= 0.02},
    }


def _main(args: argparse.Namespace) -> int:
    result = run(args.records, args.record_kb, args.rate, args.memory_fraction,
                 args.cache_fraction, args.threads, args.depth, args.direct_samples, args.seed)
    print(format_table(result["rows"], COLUMNS))
    for key in ("warm_speedup_vs_remote", "l1_vs_in_memory_ratio",
                "l1_vs_in_memory_ratio_getitem", "static_hit_rate", "lru_hit_rate",
                "cache_fraction"):
        print(f"{key}: {result[key]:.4g}")
    print("targets:", ", ".join(f"{k} {'met' if v else 'MISSED'}"
                                for k, v in result["targets"].items()))
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "cache", help="the data cache: cold/warm epochs against a rate-limited nginx store")
    parser.add_argument("--records", type=int, default=10_000, help="records in the store")
    parser.add_argument("--record-kb", type=float, default=100.0, help="record size in kB")
    parser.add_argument("--rate", default="100mbit", help="the store's link, e.g. 100mbit")
    parser.add_argument("--memory-fraction", type=float, default=0.5,
                        help="L1 budget of the cold/warm run, as a fraction of the data")
    parser.add_argument("--cache-fraction", type=float, default=0.5,
                        help="cache budget of the hit-rate runs, as a fraction of the data")
    parser.add_argument("--threads", type=int, default=8, help="prefetch threads")
    parser.add_argument("--depth", type=int, default=64, help="prefetch depth (objects)")
    parser.add_argument("--direct-samples", type=int, default=1000,
                        help="samples timed for the direct-remote baseline")
    parser.add_argument("--seed", type=int, default=0, help="seed of the access order")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.set_defaults(func=_main)
