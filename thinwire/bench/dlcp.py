"""`thinwire bench dlcp`: step synchronisation time of dlcp against the same payload over gloo.

On the emulated cluster (default 4 nodes x 1 rank at 100 Mbit/s, 1% random loss, 3 priority
classes, a TCP bulk flow node 1 -> node 0 in the lowest class all the while), one bucket of
``--size`` elements at ``--density`` per step: dlcp (top-k all-gathered over the UDP
transport) against topk_allgather (the same selection and error feedback, the same all-gather
over gloo's TCP). Reported per algorithm: mean, median and 99th percentile of the step time
(slowest rank), bytes per rank on the wire, dlcp's mean against the wire time of its bytes at
the link rate, and dlcp's counters; the ratios come from the same run.
"""

from __future__ import annotations


from thinwire.bench.report import (add_collective_timeout, format_table,
                                   run_cluster_worker, save_if_asked)
from thinwire.bench import sync_settings
from thinwire.cliargs import add_declared, integer
from thinwire.cluster.cli import add_resource_options, resource_kwargs
from thinwire.collectives.dlcp import ALGORITHM as DLCP

COLUMNS = ("algorithm", "mean_s", "p50_s", "p99_s", "p99_vs_gloo", "mean_vs_wire", "wire_s",
           "select_s", "comm_s", "cpu_s",
           "dlcp_sent", "dlcp_lost", "dlcp_retransmitted", "missed_share")
BASELINE = "topk_allgather"


def run(spec, size: int, density: float, steps: int, epsilon: float, bulk: bool,
        bulk_port: int = 45000, timeout_s: float = 1800, collective_timeout_s: float = 300.0,
        variants: tuple = ()) -> dict:
    """``variants``: more dlcp rows in the same run, each 'KEY=VALUE,...' of dlcp's options."""
    from thinwire.bench.dlcp_worker import variant

    names = ["dlcp"] + [f"dlcp:{v}" for v in variants]
    for name in names:  # a bad option fails here, before the cluster is built
        DLCP.check_options(variant(name)[1])
    result = run_cluster_worker(
        spec, "thinwire.bench.dlcp_worker",
        ["--size", str(size), "--density", str(density), "--steps", str(steps),
         "--epsilon", str(epsilon), "--algorithms", *names, BASELINE,
         "--bulk-port", str(bulk_port if bulk else 0)], timeout_s,
        collective_timeout_s)
    by_name = {row["algorithm"]: row for row in result["rows"]}
    for row in result["rows"]:
        row["p99_vs_gloo"] = row["p99_s"] / by_name[BASELINE]["p99_s"]
    result["setting"] = {"nodes": spec.nodes, "ranks_per_node": spec.ranks_per_node,
                         "inter_node_bandwidth": spec.inter_node_bandwidth, "loss": spec.loss,
                         "link_classes": spec.link_classes, "shaping": spec.shaping,
                         "size": size, "density": density, "steps": steps,
                         "epsilon": epsilon, "bulk_flow": bulk,
                         "links_per_node": spec.links_per_node, "link_mtu": spec.link_mtu}
    return result


def _main(args) -> int:
    from thinwire.cluster import ClusterSpec

    shaped = not args.no_shaping
    resources = resource_kwargs(args)
    if not shaped:  # classes and loss live in the shaped links' qdiscs
        resources["link_classes"] = None
    spec = ClusterSpec(nodes=args.nodes, ranks_per_node=args.ranks_per_node,
                       inter_node_bandwidth=args.inter_node_bandwidth if shaped else None,
                       loss=args.loss if shaped else None, shaping=shaped, **resources)
    result = run(spec, args.size, args.density, args.steps, args.epsilon, not args.no_bulk,
                 variants=tuple(args.dlcp_variant or ()),
                 collective_timeout_s=args.collective_timeout)
    print(format_table(result["rows"], COLUMNS))
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "dlcp", help="dlcp's step time against the same payload over gloo, under loss and a "
                     "competing low-priority bulk flow")
    parser.add_argument("--nodes", type=integer(2, 250), default=4, help="emulated nodes (default 4)")
    parser.add_argument("--ranks-per-node", type=integer(1, 256), default=1, help="ranks per node (default 1)")
    parser.add_argument("--inter-node-bandwidth", default="100mbit",
                        help="each node's link rate (default 100mbit)")
    parser.add_argument("--loss", default="1", help="percent of packets lost (default 1)")
    parser.add_argument("--no-shaping", action="store_true",
                        help="loopback only: no shaping, loss or bulk flow")
    parser.add_argument("--size", type=integer(1), default=1_000_000,
                        help="gradient elements per step (default 1000000)")
    sync_settings.add(parser, ("density",), defaults={"density": 0.02})
    parser.add_argument("--steps", type=integer(1), default=100, help="timed steps (default 100)")
    add_declared(parser, DLCP.option("epsilon"), help_prefix="dlcp: ")
    parser.add_argument("--no-bulk", action="store_true",
                        help="no competing bulk flow (default: one, in the lowest class)")
    parser.add_argument("--dlcp-variant", action="append", default=None, metavar="KEY=VALUE,...",
                        help="one more dlcp row in the same run with these options (repeatable), "
                             "e.g. pacing=sleep,datagram_bytes=1472 (default: none)")
    parser.add_argument("--json", metavar="PATH", default=None, help="write the result here")
    add_resource_options(parser)
    add_collective_timeout(parser)
    parser.set_defaults(func=_main, link_classes=3)
