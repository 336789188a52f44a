"""`thinwire cluster run | check | cleanup`: the emulated cluster from the command line."""

from __future__ import annotations

import argparse
import logging
import sys

from thinwire.output import format_table, write_json_atomic
from thinwire.cluster.netns import ShapingUnavailable, cleanup_dead_runs
from thinwire.cluster.spec import ClusterSpec

log = logging.getLogger(__name__)


def _add_spec_options(parser: argparse.ArgumentParser, default_ranks: int) -> None:
    parser.add_argument("--nodes", type=int, default=2, help="number of nodes (default 2)")
    parser.add_argument("--ranks-per-node", type=int, default=default_ranks,
                        help=f"torchrun processes per node (default {default_ranks})")
    parser.add_argument("--inter-node-bandwidth", default="1gbit", metavar="RATE",
                        help="each node's link rate, both directions: 100mbit, 1gbit, ... "
                             "(units bit, kbit, mbit, gbit, tbit; 'none' = unshaped; default 1gbit)")
    parser.add_argument("--inter-node-latency", default=None, metavar="TIME",
                        help="one-way node-to-node latency: 500us, 0.5ms, 20ms (needs netem)")
    parser.add_argument("--intra-node-bandwidth", default=None, metavar="RATE",
                        help="rate between ranks of one node (each node's loopback)")
    parser.add_argument("--loss", default=None, metavar="PERCENT",
                        help="packet loss between two nodes, in percent: 0.1, 1%%")
    parser.add_argument("--no-shaping", action="store_true",
                        help="no namespaces or tc (no root needed): N torchruns on 127.0.0.1")


def spec_from_args(args: argparse.Namespace) -> ClusterSpec:
    return ClusterSpec(nodes=args.nodes, ranks_per_node=args.ranks_per_node,
                       inter_node_bandwidth=None if args.inter_node_bandwidth == "none"
                       else args.inter_node_bandwidth,
                       inter_node_latency=args.inter_node_latency,
                       intra_node_bandwidth=args.intra_node_bandwidth, loss=args.loss,
                       shaping=not args.no_shaping)


def _cmd_run(args: argparse.Namespace) -> int:
    from thinwire.cluster.launch import run

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("cluster run: missing SCRIPT: give `-- SCRIPT [ARGS]` or "
                         "`-- -m MODULE [ARGS]` after the options")
    if args.timeout < 0:
        raise ValueError(f"--timeout must be >= 0 seconds (0 = no limit), got {args.timeout:g}")
    spec = spec_from_args(args)
    try:
        return run(spec, command, timeout_s=args.timeout or None)
    except ShapingUnavailable as exc:
        print(f"thinwire: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _cmd_check(args: argparse.Namespace) -> int:
    from thinwire.cluster.check import check

    if args.seconds <= 0:
        raise ValueError(f"--seconds must be > 0, got {args.seconds}")
    spec = spec_from_args(args)
    try:
        report = check(spec, seconds=args.seconds, allreduce=not args.no_allreduce)
    except ShapingUnavailable as exc:
        print(f"thinwire: error: {exc}", file=sys.stderr)
        return 2
    print(report["spec"])
    print(format_table(report["rows"], ["path", "metric", "requested", "measured", "ratio"]))
    if args.json:
        write_json_atomic(args.json, report)
    return 0 if report.get("allreduce", {}).get("correct", True) else 1


def _cmd_cleanup(args: argparse.Namespace) -> int:
    try:
        removed = cleanup_dead_runs()
    except ShapingUnavailable as exc:
        print(f"thinwire: error: {exc}", file=sys.stderr)
        return 2
    for ns in removed:
        print(f"removed {ns}")
    print(f"{len(removed)} namespace(s) of dead runs removed")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("cluster", help="the emulated cluster (namespaces + tc)")
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("run", help="run a torchrun job on an emulated cluster",
                       usage="thinwire cluster run [OPTIONS] -- SCRIPT [ARGS...] | -m MODULE [ARGS]")
    _add_spec_options(p, default_ranks=1)
    p.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                   help="stop every rank and fail (status 124) after this long; a crashed rank "
                        "stops the run at once (default 3600, 0 = no limit)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after --: SCRIPT [ARGS] or -m MODULE [ARGS], as torchrun takes them")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("check", help="measure bandwidth and latency: requested vs measured")
    _add_spec_options(p, default_ranks=2)
    p.add_argument("--seconds", type=float, default=1.0, help="length of each transfer")
    p.add_argument("--no-allreduce", action="store_true", help="skip the gloo all-reduce")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("cleanup", help="remove what dead runs left behind (live runs untouched)")
    p.set_defaults(func=_cmd_cleanup)
