"""`thinwire data warm`: fill a node's disk cache before training, with a progress bar."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from thinwire.data import manifest

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """'500M', '2GiB', '1.5g', '4096' -> bytes (K/M/G/T are powers of 1024)."""
    match = _SIZE.match(str(text))
    if not match:
        raise argparse.ArgumentTypeError(f"a size looks like 4096, 500M or 2GiB, got {text!r}")
    number, unit = float(match.group(1)), (match.group(2) or "b").lower()
    power = "bkmgt".index(unit[0])
    return int(number * 1024 ** power)


def read_sources(source: str) -> str | list[str]:
    """A glob URL as it is, or '@FILE': the URLs listed in FILE, one a line."""
    if not source.startswith("@"):
        return source
    with open(source[1:]) as handle:
        urls = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
    if not urls:
        raise ValueError(f"{source[1:]} lists no URLs")
    return urls


def _folder(source: str | list[str]) -> str:
    """The URL folder a manifest's names are relative to: the glob's, or the one every
    listed URL is in."""
    urls = [source] if isinstance(source, str) else source
    common = os.path.commonprefix(urls)
    wildcard = min((i for i in (common.find(c) for c in "*?[") if i >= 0), default=len(common))
    common = common[:wildcard]  # a glob's folder ends before its first wildcard
    return common[:common.rfind("/") + 1]


def _warm(args: argparse.Namespace) -> int:
    from thinwire.data.cached import CachedDataset
    from thinwire.data.remote import RemoteReadError
    from thinwire.output import check_output_path

    check_output_path(args.json, "--json")  # before the work, not after it
    source = read_sources(args.source)
    checksums = None if args.checksums is None else \
        manifest.read_sha256sum(args.checksums, _folder(source))
    with CachedDataset(source, memory_bytes=0, disk_dir=args.disk_dir,
                       disk_bytes=args.disk_bytes, policy=args.policy,
                       prefetch_threads=args.threads, retries=args.retries,
                       timeout_s=args.timeout, checksums=checksums) as dataset:
        try:
            summary = dataset.warm(threads=args.threads, progress=not args.quiet)
        except RemoteReadError as exc:
            print(f"thinwire: error: {exc}", file=sys.stderr)
            return 1
        summary["stats"] = dataset.stats.snapshot()
        summary["disk_used_bytes"] = dataset.l2.used
    print(f"warmed {summary['loaded']} of {summary['objects']} objects into {args.disk_dir}: "
          f"{summary['disk_used_bytes'] / 1e6:.1f} MB of {args.disk_bytes / 1e6:.1f} MB used, "
          f"{summary['stats']['downloaded'] / 1e6:.1f} MB downloaded")
    if args.json:
        from thinwire.output import write_json_atomic
        write_json_atomic(args.json, summary)
    elif args.verbose_stats:
        print(json.dumps(summary["stats"], indent=2))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    from thinwire.cliargs import integer, number

    parser = subparsers.add_parser("data", help="the multi-level data cache")
    data_sub = parser.add_subparsers(dest="data_command", metavar="ACTION")
    data_sub.required = True
    warm = data_sub.add_parser(
        "warm", help="fill the local disk cache (L2) from the remote store, with progress")
    warm.add_argument("source", help="a glob URL (file:///data/*.bin, http://host/d/*.bin on an "
                                     "index page, s3://bucket/*.bin) or @FILE listing URLs")
    warm.add_argument("--disk-dir", required=True, help="the node's L2 cache directory")
    warm.add_argument("--disk-bytes", required=True, type=parse_bytes,
                      help="L2 budget, e.g. 200G")
    warm.add_argument("--policy", choices=("static", "lru"), default="static",
                      help="which records the cache keeps: static (the first that fit) or lru")
    warm.add_argument("--threads", type=integer(1, 1024), default=8,
                      help="concurrent remote reads")
    warm.add_argument("--retries", type=integer(0, 100), default=4,
                      help="retries of a failed remote read (with back-off)")
    warm.add_argument("--timeout", type=number(0, 86400, low_open=True), default=30.0,
                      help="seconds per remote request")
    warm.add_argument("--checksums", metavar="FILE",
                      help="a sha256sum file of the objects (names relative to the source's "
                           "folder): every object is checked against it")
    warm.add_argument("--quiet", action="store_true", help="no progress bar")
    warm.add_argument("--json", metavar="PATH", help="write the summary and statistics as JSON")
    warm.add_argument("--verbose-stats", action="store_true", help="print per-tier statistics")
    warm.set_defaults(func=_warm)
