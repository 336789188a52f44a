"""The remote tier against real HTTP servers on 127.0.0.1: nginx (rate-limited) and a faulty one."""

from __future__ import annotations

import pytest
import torch

from data_helpers import FaultServer, write_records
from thinwire.data import CachedDataset, RemoteReadError, RemoteStore
from thinwire.data.nginx import NginxServer, find_nginx, parse_byte_rate
from thinwire.ports import free_port

needs_nginx = pytest.mark.skipif(
    find_nginx() is None, reason="nginx is not installed (as root: make system-tools)")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    payloads = write_records(root / "recs", 24, 3000)
    return root, payloads


@pytest.fixture(scope="module")
def nginx(store):
    if find_nginx() is None:
        pytest.skip("nginx is not installed (as root: make system-tools)")
    root, _ = store
    with NginxServer(root, rate="200mbit", request_bytes=3000) as server:
        yield server


@pytest.fixture(scope="module")
def faults():
    with FaultServer(slow_s=1.5) as server:
        yield server


def _store(**kwargs) -> RemoteStore:
    kwargs.setdefault("backoff_s", 0.01)
    return RemoteStore(**kwargs)


@needs_nginx
def test_nginx_serves_records_and_stops(store, tmp_path):
    root, payloads = store
    server = NginxServer(root, rate="100mbit", request_bytes=3000).start()
    try:
        url = server.url("recs/rec-00003.bin")
        assert _store().read(url) == payloads[3]
    finally:
        server.stop()
    with pytest.raises(RemoteReadError, match="rec-00003.bin"):
        _store(retries=0, timeout_s=2).read(url)          # nothing listens any more


@needs_nginx
def test_dataset_over_nginx_through_every_tier(nginx, store, tmp_path):
    _, payloads = store
    urls = [nginx.url(f"recs/rec-{i:05d}.bin") for i in range(len(payloads))]
    with CachedDataset(urls, memory_bytes=10**6, disk_dir=tmp_path / "l2", disk_bytes=10**6,
                       decode=lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)) as ds:
        loader = torch.utils.data.DataLoader(ds, batch_size=5, sampler=ds.prefetching(
            torch.randperm(len(ds)).tolist()))
        assert sum(len(batch) for batch in loader) == len(ds)
        assert ds.stats.remote.hits == len(ds) and ds.stats.downloaded == 24 * 3000
        assert bytes(ds[7].numpy()) == payloads[7]
        assert ds.stats.l1.hits == 1
    # A restart: a new dataset on the same L2 directory reads nothing remotely.
    with CachedDataset(urls, memory_bytes=0, disk_dir=tmp_path / "l2", disk_bytes=10**6) as ds:
        assert [ds[i] for i in range(len(ds))] == payloads
        assert ds.stats.l2.hits == len(ds) and ds.stats.downloaded == 0


@needs_nginx
def test_glob_over_nginx_index_page(nginx, store):
    _, payloads = store
    ds = CachedDataset(nginx.url("recs/*.bin"), memory_bytes=0)
    assert len(ds) == len(payloads)
    assert ds[5] == payloads[5]


@needs_nginx
def test_5xx_is_retried_then_raised_naming_the_url(nginx):
    remote = _store(retries=2)
    url = nginx.url("fail503/rec-00001.bin")
    with pytest.raises(RemoteReadError) as info:
        remote.read(url)
    assert info.value.url == url and url in str(info.value)
    assert info.value.attempts == 3 and remote.stats.retries == 2
    assert "503" in str(info.value)


@needs_nginx
def test_404_is_not_retried(nginx):
    remote = _store(retries=3)
    with pytest.raises(RemoteReadError, match="after 1 attempt") as info:
        remote.read(nginx.url("recs/missing.bin"))
    assert isinstance(info.value.cause, FileNotFoundError) and remote.stats.retries == 0


def test_transient_5xx_recovers_after_retries(faults):
    remote = _store(retries=3)
    assert remote.read(faults.url("flaky/2/a.bin")) == FaultServer.body("a.bin")
    assert faults.requests["/flaky/2/a.bin"] == 3 and remote.stats.retries == 2


def test_timeout_is_retried_then_raised(faults):
    remote = _store(retries=1, timeout_s=0.3)
    url = faults.url("slow/b.bin")
    with pytest.raises(RemoteReadError, match="slow/b.bin") as info:
        remote.read(url)
    assert info.value.attempts == 2 and faults.requests["/slow/b.bin"] == 2
    assert "Timeout" in type(info.value.cause).__name__ or isinstance(info.value.cause,
                                                                      TimeoutError)


def test_truncated_response_is_retried(faults):
    remote = _store(retries=2)
    with pytest.raises(RemoteReadError, match="truncated/c.bin"):
        remote.read(faults.url("truncated/c.bin"))
    assert faults.requests["/truncated/c.bin"] == 3


def test_connection_refused_is_retried_then_raised():
    url = f"http://127.0.0.1:{free_port()}/x.bin"      # nothing listens there
    remote = _store(retries=2, timeout_s=2)
    with pytest.raises(RemoteReadError, match="x.bin") as info:
        remote.read(url)
    assert info.value.attempts == 3 and remote.stats.retries == 2


def test_dataset_raises_clear_error_and_caches_nothing(faults, tmp_path):
    url = faults.url("flaky/100/d.bin")
    with CachedDataset([url], disk_dir=tmp_path, disk_bytes=10**6, retries=1,
                       backoff_s=0.01) as ds:
        with pytest.raises(RemoteReadError, match="flaky/100/d.bin"):
            ds[0]
        assert len(ds.l1) == 0 and url not in ds.l2


def test_parse_rate():
    assert parse_byte_rate("100mbit") == 12_500_000
    assert parse_byte_rate("12.5MB") == 12_500_000
    assert parse_byte_rate(4096) == 4096
    with pytest.raises(ValueError, match="rate must"):
        parse_byte_rate("fast")
