"""Files that must record what they are (issue 15, item 8) and a data cache that neither leaks
nor fails when its disk tier cannot be written (item 6, data part)."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import warnings

import numpy as np
import pytest
import torch

from thinwire.data import CachedDataset, DiskUnwritableWarning
from thinwire.data import tiers
from thinwire.recsys.cpr.store import CheckpointStore, CorruptCheckpoint

SIZE = 500


@pytest.fixture
def records(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "store").mkdir()
    payloads = []
    for i in range(12):
        payloads.append(rng.bytes(SIZE))
        (tmp_path / "store" / f"rec-{i:03d}.bin").write_bytes(payloads[-1])
    return [f"file://{tmp_path}/store/rec-{i:03d}.bin" for i in range(12)], payloads


# ---------------------------------------------------------------- CPR files record their key

def test_cpr_file_copied_under_another_key_is_refused(tmp_path, caplog):
    store = CheckpointStore(tmp_path)
    store.save("shard0", {"rows": torch.zeros(3)})
    store.save("shard1", {"rows": torch.ones(3)})
    # shard0's newest file replaced by a copy of shard1's: same version and kind, valid checksum
    (a,), (b,) = ([p for _, _, p in store.versions(k)] for k in ("shard0", "shard1"))
    shutil.copy(b, a)
    with pytest.raises(CorruptCheckpoint, match="belongs to '/shard1/v00000001/full', "
                                                "expected '/shard0/v00000001/full'"):
        store.read(a)
    with pytest.raises(FileNotFoundError, match="no readable full checkpoint of 'shard0'"):
        store.load_chain("shard0")


def test_cpr_file_of_another_rank_or_version_is_refused(tmp_path):
    mine, theirs = CheckpointStore(tmp_path / "r0", namespace="rank0"), \
        CheckpointStore(tmp_path / "r1", namespace="rank1")
    mine.save("shard", {"x": torch.zeros(1)})
    theirs.save("shard", {"x": torch.ones(1)})
    shutil.copy(theirs.versions("shard")[0][2], mine.versions("shard")[0][2])
    with pytest.raises(CorruptCheckpoint, match="belongs to 'rank1/shard"):
        mine.read(mine.versions("shard")[0][2])
    mine.save("shard", {"x": torch.full((1,), 2.0)})  # v2, copied as v3: a stale "newest"
    shutil.copy(tmp_path / "r0" / "shard.v00000002.full.ckpt",
                tmp_path / "r0" / "shard.v00000003.full.ckpt")
    with pytest.raises(CorruptCheckpoint, match="belongs to 'rank0/shard/v00000002/full'"):
        mine.read(tmp_path / "r0" / "shard.v00000003.full.ckpt")


def test_cpr_orphaned_temp_files_removed_on_next_save(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save("shard0", {"x": torch.zeros(1)})
    orphan = tmp_path / ".shard0.v00000002.full.ckpt.abc123.tmp"
    other = tmp_path / ".shard1.v00000002.full.ckpt.abc123.tmp"
    orphan.write_bytes(bytes(100))
    other.write_bytes(bytes(100))
    store.load_chain("shard0")
    assert not orphan.exists() and other.exists()  # only the key's own temporaries
    orphan.write_bytes(bytes(100))
    store.save("shard0", {"x": torch.zeros(1)})
    assert not orphan.exists()


# ---------------------------------------------------------------- disk-cache entries

def test_cache_entry_copied_under_another_key_is_a_miss(records, tmp_path):
    urls, payloads = records
    with CachedDataset(urls, memory_bytes=0, disk_dir=tmp_path / "l2",
                       disk_bytes=10 ** 6) as ds:
        assert ds[0] == payloads[0] and ds[1] == payloads[1]
        shutil.copy(ds.l2.path_for(urls[1]), ds.l2.path_for(urls[0]))
        assert ds.l2.get(urls[0]) is None  # not payloads[1]
        assert ds[0] == payloads[0] and ds.stats.corrupt == 1


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_disk_tier_descriptor_closed_without_close(records, tmp_path):
    urls, _ = records
    before = _fds()
    for _ in range(20):
        ds = CachedDataset(urls, memory_bytes=0, disk_dir=tmp_path / "l2", disk_bytes=10 ** 6,
                           prefetch_threads=0)
        ds[0]
        del ds
        gc.collect()
    assert _fds() <= before + 1
    with CachedDataset(urls, disk_dir=tmp_path / "l2", disk_bytes=10 ** 6) as ds:
        ds[0]
    ds.close()  # closing twice is harmless
    assert _fds() <= before + 1


def test_unwritable_disk_tier_reads_from_memory_with_one_warning(records, tmp_path,
                                                                 monkeypatch):
    urls, payloads = records
    real_open = os.open

    def refuse_tmp(path, flags, *args):
        if "/l2/tmp/" in str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(tiers.os, "open", refuse_tmp)
    with CachedDataset(urls, memory_bytes=10 ** 6, disk_dir=tmp_path / "l2",
                       disk_bytes=10 ** 6) as ds:
        with pytest.warns(DiskUnwritableWarning) as caught:
            got = [ds[i] for i in range(len(urls))]
        assert got == payloads
        assert len([w for w in caught if issubclass(w.category, DiskUnwritableWarning)]) == 1


def test_disk_dir_that_is_a_file_is_a_clear_error(records, tmp_path):
    urls, _ = records
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="disk_dir must be a directory, got .*file"):
        CachedDataset(urls, disk_dir=tmp_path / "file", disk_bytes=10 ** 6)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
@pytest.mark.parametrize("prepared", [True, False], ids=["existing-cache", "empty-mount"])
def test_read_only_mount(records, tmp_path, prepared):
    urls, payloads = records
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        if prepared:  # a cache that was filled, then its file system became read-only
            with CachedDataset(urls[:3], memory_bytes=0, disk_dir=mount, disk_bytes=10 ** 6) as ds:
                [ds[i] for i in range(3)]
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with CachedDataset(urls, memory_bytes=10 ** 6, disk_dir=mount,
                               disk_bytes=10 ** 6) as ds:
                got = [ds[i] for i in range(len(urls))]
                if prepared:
                    assert ds.stats.l2.hits == 3  # what is there is still read
        assert got == payloads
        assert len([w for w in caught if issubclass(w.category, DiskUnwritableWarning)]) == 1
    finally:
        subprocess.run(["umount", str(mount)], check=True)


# ---------------------------------------------------------------- a replaced entry, a manifest

def _forge(ds, url: str, forged: bytes) -> None:
    """Replace ``url``'s disk entry with ``forged`` under a header that matches it (valid magic,
    length, CRC and key digest): what anyone who can write the cache folder can do."""
    import zlib
    header = tiers._HEADER.pack(tiers._MAGIC, zlib.crc32(forged), len(forged),
                                tiers._key_digest(url))
    ds.l2.path_for(url).write_bytes(header + forged)


def _sha256(data: bytes) -> str:
    import hashlib
    return hashlib.sha256(data).hexdigest()


def test_a_replaced_entry_with_a_valid_header_is_refused_by_the_manifest(records, tmp_path,
                                                                         caplog):
    urls, payloads = records
    checksums = {url: _sha256(data) for url, data in zip(urls, payloads)}
    with CachedDataset(urls, memory_bytes=0, disk_dir=tmp_path / "l2", disk_bytes=10 ** 6,
                       checksums=checksums) as ds:
        assert ds[0] == payloads[0]
        _forge(ds, urls[0], b"x" * SIZE)
        assert ds.l2.get(urls[0]) == b"x" * SIZE  # the header alone cannot tell
        assert ds[0] == payloads[0] and ds.stats.corrupt == 1
        assert "does not match the manifest" in caplog.text
        assert ds[0] == payloads[0] and ds.stats.corrupt == 1  # the entry was replaced


def test_an_object_the_remote_store_serves_wrong_is_refused_naming_it(records, tmp_path):
    from thinwire.data.manifest import ChecksumMismatch

    urls, payloads = records
    checksums = {url: _sha256(data) for url, data in zip(urls, payloads)}
    checksums[urls[3]] = _sha256(b"what the publisher hashed")
    with CachedDataset(urls, memory_bytes=0, checksums=checksums) as ds:
        assert ds[2] == payloads[2]
        with pytest.raises(ChecksumMismatch, match=f"{urls[3]}: SHA-256 "):
            ds[3]


@pytest.mark.parametrize("bad, message", [
    ({}, "has no digest for 12 object"),
    ({"x": "abc"}, r"checksums\['x'\] must be a SHA-256 hex digest"),
    ([("a", "b")], "must be a mapping"),
])
def test_a_manifest_must_cover_every_object_in_the_right_form(records, bad, message):
    urls, _ = records
    with pytest.raises((ValueError, TypeError), match=message):
        CachedDataset(urls, memory_bytes=0, checksums=bad)


def test_data_warm_checks_a_sha256sum_file(records, tmp_path, capsys):
    from thinwire.cli import main

    urls, payloads = records
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("".join(f"{_sha256(d)}  rec-{i:03d}.bin\n" for i, d in enumerate(payloads)))
    pattern = f"file://{tmp_path}/store/*.bin"
    args = ["data", "warm", pattern, "--disk-dir", str(tmp_path / "l2"), "--disk-bytes", "20K",
            "--quiet", "--checksums", str(sums)]
    assert main(args) == 0 and "warmed 12 of 12" in capsys.readouterr().out
    (tmp_path / "store" / "rec-005.bin").write_bytes(b"tampered")
    shutil.rmtree(tmp_path / "l2")
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rec-005.bin: SHA-256" in err[0] and err[0].startswith("thinwire: ")
    sums.write_text("not a manifest\n")
    assert main(args) == 2 and "line 1: expected '<sha256 hex>  <name>'" in \
        capsys.readouterr().err


def test_manifest_names_are_relative_to_the_folder_before_any_wildcard(tmp_path):
    from thinwire.data import cli, manifest

    assert cli._folder("file:///d/*/x.bin") == "file:///d/"
    assert cli._folder("http://h/data/shard-*.bin") == "http://h/data/"
    assert cli._folder(["file:///d/a/1.bin", "file:///d/b/2.bin"]) == "file:///d/"
    sums = tmp_path / "SHA256SUMS"
    sums.write_bytes(b"a" * 64 + b"  a/1.bin\r\n")  # written on Windows
    assert manifest.read_sha256sum(sums, "file:///d") == {"file:///d/a/1.bin": "a" * 64}
    with pytest.raises(ValueError, match="must be a SHA-256 hex digest"):
        manifest.check({"u": "a" * 64 + "\n"}, ["u"])
