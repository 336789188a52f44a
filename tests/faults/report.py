"""The fault-injection table of issue 15: every case tried, how it ended.

    .venv/bin/python tests/faults/report.py [--json results/faults.json] [--skip-cli]

Groups: the commands of item 7 (each in a fresh process, as a user runs them), the API values,
damaged or crafted training checkpoints (newest only: a fallback with a warning is right; both:
a clear error is right), crafted pickles (must never run), damaged CPR files and disk-cache
entries (must never be returned). Columns count the outcomes; a run is good when tracebacks,
silently accepted, hangs and code executed are all 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases  # noqa: E402
import ckpt_helpers as H  # noqa: E402

COLUMNS = ("group", "cases", "clear", "fell_back", "traceback", "accepted", "hang",
           "code_executed")


def _row(group: str, outcomes: list[str]) -> dict:
    row = {"group": group, "cases": len(outcomes)}
    for name in COLUMNS[2:]:
        row[name] = outcomes.count(name)
    return row


def _checkpoint_outcome(run: Path, both: bool) -> str:
    """How checkpoint.load ends on a damaged run folder."""
    from thinwire.train import checkpoint
    module, opt = H.model_and_optimizer()
    try:
        payload = checkpoint.load(run, 0, H.config(), 1, steps_per_epoch=H.steps_per_epoch(),
                                  check=H.fits(module, opt))
    except checkpoint.NoUsableCheckpoint:
        return "clear"
    except Exception:  # noqa: BLE001 - counted
        return "traceback"
    if payload["step"] == 2 and not both:
        return "fell_back"
    return "accepted"  # the damaged file was used


def checkpoint_rows(scratch: Path, details: list) -> list[dict]:
    base = H.make(scratch / "base")
    rows = []
    for both in (False, True):
        outcomes = []
        for name, (damage, _) in H.damages().items():
            run = scratch / f"ck-{name}-{both}"
            shutil.copytree(base, run)
            damage(H.checkpoint.rank_file(run, 0))
            if both:
                damage(H.checkpoint.previous_file(run, 0))
            outcome = _checkpoint_outcome(run, both)
            outcomes.append(outcome)
            where = "both" if both else "newest"
            details.append({"group": "checkpoint", "case": f"{name} ({where})",
                            "outcome": outcome})
        rows.append(_row(f"train checkpoint, {'both files' if both else 'newest'} damaged",
                         outcomes))
    outcomes = []
    for framed in (False, True):
        run = scratch / f"evil-{framed}"
        shutil.copytree(base, run)
        marker = scratch / f"pwned-{framed}"
        for path in (H.checkpoint.rank_file(run, 0), H.checkpoint.previous_file(run, 0)):
            (H.evil_framed if framed else H.evil_raw)(path, marker)
        outcome = _checkpoint_outcome(run, True)
        outcome = "code_executed" if marker.exists() else outcome
        outcomes.append(outcome)
        kind = "valid checksum" if framed else "raw"
        details.append({"group": "checkpoint", "case": f"os.system pickle ({kind})",
                        "outcome": outcome})
    rows.append(_row("train checkpoint, crafted os.system pickle", outcomes))
    return rows


def store_rows(scratch: Path, details: list) -> list[dict]:
    """CPR files and cache entries: flipped, truncated, copied under another key."""
    import torch

    from thinwire.data import CachedDataset
    from thinwire.recsys.cpr.store import CheckpointStore

    outcomes = []
    for damage in ("flipped", "truncated", "other-key"):
        store = CheckpointStore(scratch / f"cpr-{damage}")
        store.save("shard0", {"rows": torch.zeros(100)})
        store.save("shard0", {"rows": torch.ones(100)})
        store.save("shard1", {"rows": torch.full((100,), 7.0)})
        newest = store.versions("shard0")[-1][2]
        if damage == "flipped":
            H.flip_bytes(newest, 8)
        elif damage == "truncated":
            newest.write_bytes(newest.read_bytes()[:300])
        else:
            shutil.copy(store.versions("shard1")[-1][2], newest)
        try:
            version, state, _ = store.load_chain("shard0")
            outcome = "fell_back" if version == 1 and float(state["rows"][0]) == 0.0 \
                else "accepted"
        except Exception:  # noqa: BLE001
            outcome = "traceback"
        outcomes.append(outcome)
        details.append({"group": "cpr", "case": damage, "outcome": outcome})
    rows = [_row("CPR shard file damaged", outcomes)]
    outcomes = []
    urls = [f"file://{scratch}/src/{name}.bin" for name in "abc"]
    for damage in ("flipped", "truncated", "other-key"):
        with CachedDataset(urls, memory_bytes=0, disk_dir=scratch / f"l2-{damage}",
                           disk_bytes=10 ** 6) as ds:
            ds[0], ds[1]
            entry = ds.l2.path_for(urls[0])
            if damage == "flipped":
                H.flip_bytes(entry, 8)
            elif damage == "truncated":
                entry.write_bytes(entry.read_bytes()[:40])
            else:
                (scratch / "src" / "b.bin").write_bytes(b"\x01" * 100)
                ds2 = CachedDataset(urls, memory_bytes=0, disk_dir=scratch / "l2-other",
                                    disk_bytes=10 ** 6)
                ds2[1]
                shutil.copy(ds2.l2.path_for(urls[1]), entry)
                ds2.close()
            outcome = "fell_back" if ds.l2.get(urls[0]) is None else "accepted"
        outcomes.append(outcome)
        details.append({"group": "cache", "case": damage, "outcome": outcome})
    outcome = _replaced_cache_entry(scratch, urls)
    outcomes.append(outcome)
    details.append({"group": "cache", "case": "replaced, valid header, manifest",
                    "outcome": outcome})
    rows.append(_row("disk-cache entry damaged", outcomes))
    return rows


def _replaced_cache_entry(scratch: Path, urls: list[str]) -> str:
    """An entry whose bytes were replaced under a header rewritten to match: only the data
    set's manifest (checksums=) can tell; the run must get the source's bytes back."""
    import hashlib
    import zlib

    from thinwire.data import CachedDataset, tiers

    sources = [(scratch / "src" / url.rsplit("/", 1)[1]).read_bytes() for url in urls]
    checksums = {u: hashlib.sha256(d).hexdigest() for u, d in zip(urls, sources)}
    with CachedDataset(urls, memory_bytes=0, disk_dir=scratch / "l2-replaced",
                       disk_bytes=10 ** 6, checksums=checksums) as ds:
        ds[0]
        forged = b"\x02" * len(sources[0])
        ds.l2.path_for(urls[0]).write_bytes(
            tiers._HEADER.pack(tiers._MAGIC, zlib.crc32(forged), len(forged),
                               tiers._key_digest(urls[0])) + forged)
        try:
            served = ds[0]
        except Exception:  # noqa: BLE001
            return "traceback"
        return "fell_back" if served == sources[0] and ds.stats.corrupt == 1 else "accepted"


def _other_rows(scratch: Path, details: list) -> list[dict]:
    outcomes = []
    for case in cases.api_cases():
        outcome, message = cases.classify_api(case, scratch)
        outcomes.append(outcome)
        details.append({"group": "api", "case": case.name, "outcome": outcome,
                        "message": message})
    return ([_row("API values (item 7)", outcomes)] + checkpoint_rows(scratch, details)
            + store_rows(scratch, details))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--skip-cli", action="store_true",
                        help="leave out the commands (each starts a Python process)")
    parser.add_argument("--cli-source", metavar="DIR",
                        help="run only the commands, with the thinwire of another checkout "
                             "(e.g. before these fixes)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the refusals' warnings are expected here
    from thinwire.bench.report import format_table, save_if_asked
    from thinwire.cliargs import check_output_path

    check_output_path(args.json, "--json")
    start = time.perf_counter()
    details: list = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="thinwire-faults-") as tmp:
        scratch = cases.prepare(Path(tmp))
        if not args.skip_cli:
            outcomes = []
            for case in cases.cli_cases():
                outcome, message = cases.classify_cli(case, scratch, args.cli_source)
                outcomes.append(outcome)
                details.append({"group": "command", "case": case.name, "outcome": outcome,
                                "message": message})
            rows.append(_row("commands (item 7)", outcomes))
        if not args.cli_source:
            rows += _other_rows(scratch, details)
    total = _row("total", [])
    for key in COLUMNS[1:]:
        total[key] = sum(r[key] for r in rows)
    rows.append(total)
    print(format_table(rows, COLUMNS))
    for item in details:
        if item["outcome"] in ("traceback", "accepted", "hang", "code_executed"):
            print(f"  {item['outcome']}: {item['group']}: {item['case']}: "
                  f"{item.get('message', '')}")
    save_if_asked(args.json, {"rows": rows, "cases": details,
                              "seconds": time.perf_counter() - start})
    bad = total["traceback"] + total["accepted"] + total["hang"] + total["code_executed"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
