"""`thinwire cluster run | check | cleanup`: the emulated cluster from the command line."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from thinwire.options import checked_as_flags
from thinwire.cluster.accounting import NodeOutOfMemory
from thinwire.cluster.cgroups import CgroupsUnavailable
from thinwire.cluster.launch import EXIT_OOM
from thinwire.output import format_table, write_json_atomic
from thinwire.cluster.netns import ShapingUnavailable, cleanup_dead_runs
from thinwire.cliargs import integer
from thinwire.cluster.spec import MAX_RESTARTS, ClusterSpec

log = logging.getLogger(__name__)


def add_spec_options(parser: argparse.ArgumentParser, default_ranks: int) -> None:
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
    add_resource_options(parser)


def add_resource_options(parser: argparse.ArgumentParser) -> None:
    """--node-cpus, --node-memory, --best-effort-limits, --link-classes, --class-queue,
    --links-per-node, --link-mtu, --bandwidth-schedule, --fail: shared
    with `thinwire compare` and `bench sync` (read back with `resource_kwargs`)."""
    group = parser.add_argument_group("node budgets and priority classes")
    group.add_argument("--node-cpus", type=float, default=None, metavar="CORES",
                       help="CPU cores each node may use (CFS quota): 0.25, 0.5, 1 (needs the "
                            "cgroup cpu controller)")
    group.add_argument("--node-memory", default=None, metavar="SIZE",
                       help="hard memory limit per node, swap off: 512m, 2g (binary units); "
                            "a node past it is killed and the run fails naming it")
    group.add_argument("--best-effort-limits", action="store_true",
                       help="without cgroup controllers: warn and run without the limits "
                            "instead of failing")
    group.add_argument("--link-classes", type=int, default=None, metavar="K",
                       help="strict-priority classes on every node link (2..8); a sender picks "
                            "its class with IP_TOS (thinwire.cluster.qos.tos_for_class)")
    group.add_argument("--links-per-node", type=int, default=1, metavar="K",
                       help="links from every node to the switch (1..8), each shaped at the "
                            "node's rate / K; dlcp sprays its datagrams over all of them, "
                            "other traffic (gloo) uses the first (default 1)")
    group.add_argument("--link-mtu", type=int, default=1500, metavar="BYTES",
                       help="MTU of the node links, 1280..9000: 9000 is a jumbo frame, as "
                            "cloud VPCs offer (default 1500)")
    group.add_argument("--bandwidth-schedule", default=None, metavar="TIME:RATE,...",
                       help="the inter-node rate over time, e.g. 0s:200mbit,40s:25mbit,80s:200mbit"
                            ": from each time on (after the job starts) every node's links run "
                            "at that rate; each change is logged with its time")
    group.add_argument("--schedule-clock", choices=("job", "training"), default="job",
                       help="what --bandwidth-schedule and --fail times count from: the job's "
                            "start, or the start of training (rank 0's first step: runs whose "
                            "start-up differs meet each change at the same point of training)")
    group.add_argument("--fail", dest="failure_schedule", default=None,
                       metavar="nodeN@TIME[,restart@TIME];...",
                       help="nodes that vanish while the job runs, e.g. "
                            "node1@30s,restart@45s;node2@90s: every process of the node is "
                            "killed (SIGKILL) at the time, its launcher started again at the "
                            "restart; each is logged with its time")
    group.add_argument("--fault-tolerant", action="store_true",
                       help="every node its own torchrun world, joined by a coordinator "
                            "(torchft's Lighthouse and a job store) beside the nodes, so that "
                            "nodes may vanish and come back while the others train on "
                            "(python -m thinwire.train.ft_job)")
    group.add_argument("--max-restarts", type=integer(0, MAX_RESTARTS), default=0, metavar="N",
                       help="torchrun restarts every node's ranks up to N times after a failure, "
                            "the job formed again by an elastic rendezvous beside the nodes "
                            "(checkpoint-restart: give the job --checkpoint DIR "
                            "--checkpoint-every K --resume-if-present; default 0: a failure "
                            "ends the job)")
    group.add_argument("--class-queue", type=int, nargs="+", default=None, metavar="PACKETS",
                       help="queue length of each class in packets: one value for all or one "
                            "per class, highest class first (default 1000)")


def resource_kwargs(args: argparse.Namespace) -> dict:
    """The ClusterSpec keyword arguments of `add_resource_options`."""
    queue = args.class_queue
    return {"node_cpus": args.node_cpus, "node_memory": args.node_memory,
            "best_effort_limits": args.best_effort_limits, "link_classes": args.link_classes,
            "class_queue": (queue[0] if len(queue) == 1 else tuple(queue)) if queue else None,
            # only where set: compare counts any given resource as asking for the shaped cluster
            **({"links_per_node": args.links_per_node} if args.links_per_node != 1 else {}),
            **({"link_mtu": args.link_mtu} if args.link_mtu != 1500 else {}),
            # given empty ("$SCHED" unset): refused by the spec, not run without a schedule
            **({"bandwidth_schedule": args.bandwidth_schedule}
               if getattr(args, "bandwidth_schedule", None) is not None else {}),
            **({"failure_schedule": args.failure_schedule}
               if getattr(args, "failure_schedule", None) is not None else {}),
            **({"schedule_clock": args.schedule_clock}
               if getattr(args, "schedule_clock", "job") != "job" else {}),
            **({"fault_tolerant": True} if getattr(args, "fault_tolerant", False) else {}),
            **({"max_restarts": args.max_restarts} if getattr(args, "max_restarts", 0) else {})}


def spec_from_args(args: argparse.Namespace) -> ClusterSpec:
    """The cluster the options describe; a bad value is refused naming its option."""
    return checked_as_flags(
        lambda: ClusterSpec(nodes=args.nodes, ranks_per_node=args.ranks_per_node,
                            inter_node_bandwidth=None if args.inter_node_bandwidth == "none"
                            else args.inter_node_bandwidth,
                            inter_node_latency=args.inter_node_latency,
                            intra_node_bandwidth=args.intra_node_bandwidth, loss=args.loss,
                            shaping=not args.no_shaping, **resource_kwargs(args)),
        [f.name for f in dataclasses.fields(ClusterSpec)],
        {"failure_schedule": "--fail", "shaping": "--no-shaping"})


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
        return run(spec, command, timeout_s=args.timeout or None, stats_path=args.stats_json)
    except (ShapingUnavailable, CgroupsUnavailable) as exc:
        print(f"thinwire: error: {exc}", file=sys.stderr)
        return 2
    except NodeOutOfMemory as exc:
        print(f"thinwire: error: {exc}", file=sys.stderr)
        return EXIT_OOM
    except KeyboardInterrupt:
        return 130


def _cmd_check(args: argparse.Namespace) -> int:
    from thinwire.cluster.check import check

    if args.seconds <= 0:
        raise ValueError(f"--seconds must be > 0, got {args.seconds}")
    spec = spec_from_args(args)
    try:
        report = check(spec, seconds=args.seconds, allreduce=not args.no_allreduce)
    except (ShapingUnavailable, CgroupsUnavailable) as exc:
        print(f"thinwire: error: {exc}", file=sys.stderr)
        return 2
    except NodeOutOfMemory as exc:  # the all-reduce ranks did not fit in --node-memory
        print(f"thinwire: error: all-reduce probe: {exc}", file=sys.stderr)
        return EXIT_OOM
    print(report["spec"])
    print(format_table(report["rows"], ["path", "metric", "requested", "measured", "ratio"]))
    if report.get("resources"):
        print(format_table(report["resources"], ["node", "metric", "requested", "measured",
                                                 "ratio"]))
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
    print(f"{len(removed)} leftover(s) of dead runs removed (namespaces, cgroups, launcher "
          f"log folders)")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from thinwire.cluster.plot import plot_file

    print(f"wrote {plot_file(args.stats, args.out)}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("cluster", help="the emulated cluster (namespaces + tc)")
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("run", help="run a torchrun job on an emulated cluster",
                       usage="thinwire cluster run [OPTIONS] -- SCRIPT [ARGS...] | -m MODULE [ARGS]")
    add_spec_options(p, default_ranks=1)
    p.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                   help="stop every rank and fail (status 124) after this long; a crashed rank "
                        "stops the run at once (default 3600, 0 = no limit)")
    p.add_argument("--stats-json", default=None, metavar="PATH",
                   help="write per-node accounting as JSON: CPU seconds, peak memory, bytes "
                        "per link, a 100 ms time series, priority-class drops")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after --: SCRIPT [ARGS] or -m MODULE [ARGS], as torchrun takes them")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("check", help="measure bandwidth and latency: requested vs measured")
    add_spec_options(p, default_ranks=2)
    p.add_argument("--seconds", type=float, default=1.0, help="length of each transfer")
    p.add_argument("--no-allreduce", action="store_true", help="skip the gloo all-reduce")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("plot", help="plot a run's --stats-json: CPU, memory, link rates per node")
    p.add_argument("stats", metavar="STATS_JSON")
    p.add_argument("--out", default="nodes.png", metavar="PNG", help="where to write the plot")
    p.set_defaults(func=_cmd_plot)

    p = sub.add_parser("cleanup", help="remove what dead runs left behind (live runs untouched)")
    p.set_defaults(func=_cmd_cleanup)
