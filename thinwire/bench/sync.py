"""`thinwire bench sync`: one synchronisation of a ResNet-50-sized gradient per algorithm.

Runs on the emulated cluster (or, with --no-shaping, on loopback) and reports per algorithm the
median time of one synchronisation (slowest rank), bytes sent intra- and inter-node per rank
(the ring model of thinwire.collectives.traffic), and the time split into selection and
communication. Ratios to allreduce and topk_allgather come from the same run.
"""

from __future__ import annotations

import argparse
import json

from thinwire import collectives
from thinwire.bench import sync_settings
from thinwire.bench.report import (add_collective_timeout, format_table,
                                   run_cluster_worker, save_if_asked)
from thinwire.cliargs import add_algorithm_option, integer, number, options_by_algorithm
from thinwire.cluster.cli import add_resource_options, resource_kwargs

COLUMNS = ("algorithm", "nonfinite", "median_s", "vs_allreduce", "vs_topk_allgather",
           "inter_mb", "intra_mb", "select_s", "intra_s", "inter_s")


def run(spec, size: int = 25_600_000, bucket_mb: float = 25.0, density: float = 0.01,
        selector: str = "auto", algorithms=None, repeats: int = 5,
        timeout_s: float = 1800, collective_timeout_s: float = 300.0,
        algorithm_options: dict | None = None,
        nonfinite: tuple = ("raise",), wire: str = "none", sparse_wire: str = "fp32") -> dict:
    """``algorithm_options``: {algorithm: {name: value}}, each algorithm's declared settings
    (checked here, before the cluster is built; an algorithm not timed is refused).
    ``nonfinite``: the NaN/Inf policies to time (SyncState's), in turns within one run: "raise"
    decides once per step, "skip" per bucket before sending it."""
    from thinwire.state import NONFINITE_POLICIES

    nonfinite = list(nonfinite)
    if not nonfinite or len(set(nonfinite)) != len(nonfinite) or \
            not set(nonfinite) <= set(NONFINITE_POLICIES):
        raise ValueError(f"nonfinite must list distinct policies of "
                         f"{', '.join(NONFINITE_POLICIES)}, got {nonfinite!r}")
    algorithms = list(algorithms or collectives.names())
    # as `thinwire train` checks them, before the launch
    sync = sync_settings.checked({"density": density, "selector": selector, "wire": wire,
                                  "sparse_wire": sparse_wire})
    algorithm_options = sync_settings.checked_algorithm_options(algorithm_options,
                                                                 algorithms)
    result = run_cluster_worker(
        spec, "thinwire.bench.sync_worker",
        ["--size", str(size), "--bucket-mb", str(bucket_mb), "--sync", json.dumps(sync),
         "--repeats", str(repeats), "--algorithms", *algorithms,
         "--algorithm-options", json.dumps(algorithm_options), "--nonfinite", *nonfinite],
        timeout_s,
        collective_timeout_s)
    by_name = {(row["algorithm"], row["nonfinite"]): row for row in result["rows"]}
    for row in result["rows"]:
        row["inter_mb"] = row["bytes_inter"] / 1e6
        row["intra_mb"] = row["bytes_intra"] / 1e6
        for base in ("allreduce", "topk_allgather"):  # the base with the same policy
            if (base, row["nonfinite"]) in by_name:
                row[f"vs_{base}"] = row["median_s"] / by_name[base, row["nonfinite"]]["median_s"]
        if "skip" in nonfinite:  # the per-step decision against the per-bucket one
            row["vs_skip"] = row["median_s"] / by_name[row["algorithm"], "skip"]["median_s"]
    result["setting"] = {"nodes": spec.nodes, "ranks_per_node": spec.ranks_per_node,
                         "inter_node_bandwidth": spec.inter_node_bandwidth,
                         "intra_node_bandwidth": spec.intra_node_bandwidth,
                         "shaping": spec.shaping, "node_cpus": spec.node_cpus,
                         "node_memory": spec.node_memory, "link_classes": spec.link_classes,
                         "size": size, "bucket_mb": bucket_mb,
                         **sync, "repeats": repeats,
                         "algorithm_options": algorithm_options, "nonfinite": nonfinite}
    return result


def _main(args: argparse.Namespace) -> int:
    from thinwire.cluster import ClusterSpec

    sync_settings.refuse_unused(args, args.algorithms)
    spec = ClusterSpec(nodes=args.nodes, ranks_per_node=args.ranks_per_node,
                       inter_node_bandwidth=args.inter_node_bandwidth,
                       intra_node_bandwidth=args.intra_node_bandwidth,
                       shaping=not args.no_shaping, **resource_kwargs(args))
    result = run(spec, args.size, args.bucket_mb, args.density, args.selector, args.algorithms,
                 args.repeats,
                 algorithm_options=options_by_algorithm(args.algorithm_option or [],
                                                        args.algorithms),
                 nonfinite=args.nonfinite, collective_timeout_s=args.collective_timeout,
                 wire=args.wire, sparse_wire=args.sparse_wire)
    columns = COLUMNS + (("vs_skip",) if len(args.nonfinite) > 1 else ())
    print(format_table(result["rows"], columns))
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "sync", help="one gradient synchronisation per algorithm on the emulated cluster")
    parser.add_argument("--nodes", type=integer(1, 250), default=2, help="emulated nodes")
    parser.add_argument("--ranks-per-node", type=integer(1, 256), default=2, help="ranks (processes) per node")
    parser.add_argument("--inter-node-bandwidth", default="1gbit",
                        help="rate of each node's link: 100mbit, 1gbit")
    parser.add_argument("--intra-node-bandwidth", default=None,
                        help="rate between ranks of one node (its loopback); not set: unshaped")
    parser.add_argument("--no-shaping", action="store_true",
                        help="loopback only (no root needed): the logical topology, no slow links")
    parser.add_argument("--size", type=integer(1), default=25_600_000, help="gradient elements")
    parser.add_argument("--bucket-mb", type=number(0, 10240, low_open=True), default=25.0, help="gradient bucket size in MiB")
    sync_settings.add(parser)
    parser.add_argument("--algorithms", nargs="+", choices=list(collectives.names()),
                        default=list(collectives.names()), help="algorithms to time")
    parser.add_argument("--repeats", type=integer(1), default=5,
                        help="timed synchronisations per algorithm (the median is reported)")
    add_algorithm_option(parser)
    parser.add_argument("--nonfinite", nargs="+", default=["raise"], metavar="POLICY",
                        help="NaN/Inf policies to time, in turns: raise (one decision per "
                             "step) and/or skip (one per bucket, before sending it)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    add_resource_options(parser)
    add_collective_timeout(parser)
    parser.set_defaults(func=_main)
