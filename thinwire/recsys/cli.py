"""`thinwire recsys train`: train LR / FM / Wide&Deep / DeepFM with DES or a baseline.

On the emulated cluster (default 2 nodes x 2 ranks; loopback when not root or with
--no-shaping), or with --single-process the unsharded reference model in this process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile

log = logging.getLogger(__name__)


def _main(args: argparse.Namespace) -> int:
    from thinwire.output import format_table, write_json_atomic
    from thinwire.output import check_output_path
    from thinwire.recsys import train as recsys_train

    check_output_path(args.json, "--json")  # before the work, not after it

    columns = ("model", "method", "steps", "bytes_per_iter", "payload_bytes_per_iter",
               "samples_per_s", "auc")
    passthrough = []
    for name in ("dataset", "epochs", "max_steps", "batch", "k", "optimizer", "lr", "seed",
                 *recsys_train.SYNTHETIC_OPTIONS):
        passthrough += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    passthrough += ["--hidden", *map(str, args.hidden)]
    if args.single_process:
        data = recsys_train.load(args.dataset, args.samples, args.fields, args.vocab,
                                 args.multi_hot, args.seed, args.zipf)
        rows = [recsys_train.train_single(m, *data, args) for m in args.models]
    else:
        from thinwire.cluster import ClusterSpec, missing_requirements, run as run_on_cluster
        shaping = not args.no_shaping
        if shaping and missing_requirements():
            log.warning("shaping unavailable (%s): running on loopback",
                        "; ".join(missing_requirements()))
            shaping = False
        spec = ClusterSpec(nodes=args.nodes, ranks_per_node=args.ranks_per_node,
                           inter_node_bandwidth=args.inter_node_bandwidth, shaping=shaping)
        with tempfile.TemporaryDirectory(prefix="thinwire-recsys-") as tmp:
            out = os.path.join(tmp, "rows.json")
            status = run_on_cluster(spec, ["-m", "thinwire.recsys.train", "--out", out,
                                           "--models", *args.models, "--methods",
                                           *args.methods, *passthrough], output=sys.stderr)
            if status != 0:
                print(f"thinwire: error: the training ranks failed (exit status {status})",
                      file=sys.stderr)
                return status
            with open(out) as handle:
                rows = json.load(handle)["rows"]
    print(format_table(rows, columns))
    if args.json:
        write_json_atomic(args.json, {"rows": rows, "args": {k: v for k, v in vars(args).items()
                                                             if k != "func"}})
    return 0


def register(subparsers) -> None:
    from thinwire.cliargs import integer
    from thinwire.recsys.train import add_arguments

    parser = subparsers.add_parser("recsys", help="recommender models with DES sharding")
    sub = parser.add_subparsers(dest="recsys_command", metavar="COMMAND")
    sub.required = True
    train = sub.add_parser("train", help="train on the emulated cluster (or one process)")
    add_arguments(train)
    train.add_argument("--nodes", type=integer(1, 64), default=2, help="emulated nodes")
    train.add_argument("--ranks-per-node", type=integer(1, 64), default=2,
                       help="ranks (processes) per node")
    train.add_argument("--inter-node-bandwidth", default="1gbit",
                       help="rate of each node's link: 100mbit, 1gbit")
    train.add_argument("--no-shaping", action="store_true",
                       help="loopback only (no root needed): the logical topology, no slow links")
    train.add_argument("--single-process", action="store_true",
                       help="the unsharded reference model in this process")
    train.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    train.set_defaults(func=_main)
