"""`thinwire pipeline train`: launch one rank per stage (loopback by default, or one stage per
node of the emulated cluster) and print per-stage utilisation, samples/s and accuracy.

Under torchrun (``RANK`` set) the same command is one rank of the run, so any launcher works:
``thinwire cluster run --nodes 4 [cluster options] -- -m thinwire.train.pipeline train ...`` passes
every option of the emulated cluster (e.g. per-node CPU limits where the cluster has them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from thinwire.pipeline import config


def _cmd_train(args: argparse.Namespace) -> int:
    cfg = config.from_args(args)
    if "RANK" in os.environ:  # one rank of a launched run
        from thinwire.train.pipeline.run import main

        main(cfg)
        return 0
    return launch(cfg, args)


def launch(cfg: config.PipelineConfig, args: argparse.Namespace) -> int:
    from thinwire.output import format_table
    from thinwire.cluster.cli import spec_from_args
    from thinwire.cluster.launch import run

    if args.nodes is None:
        args.nodes = cfg.stages // args.ranks_per_node
    if args.nodes * args.ranks_per_node != cfg.stages:
        raise ValueError(f"--nodes {args.nodes} x --ranks-per-node {args.ranks_per_node} must "
                         f"equal --stages {cfg.stages} (one rank per stage)")
    if not args.cluster:
        args.no_shaping = True  # loopback: S torchruns on 127.0.0.1
    spec = spec_from_args(args)
    with tempfile.TemporaryDirectory(prefix="thinwire-pipeline-") as scratch:
        cfg.out = str(Path(cfg.out).resolve()) if cfg.out else scratch
        argv = ["-m", "thinwire.train.pipeline", "train"] + config.to_argv(cfg)
        status = run(spec, argv, timeout_s=cfg.timeout_s)
        if status != 0:
            print(f"thinwire: pipeline run failed with status {status}", file=sys.stderr)
            return status
        result = json.loads((Path(cfg.out) / "results.json").read_text())
    print(format_table(result["per_stage"], ["stage", "delay", "busy_s", "wall_s", "utilisation",
                                             "steady_utilisation"]))
    print(f"{result['schedule']}: {result['samples']} samples in {result['wall_s']:.2f} s = "
          f"{result['samples_per_s']:.1f} samples/s, test accuracy {result['test_accuracy']:.4f}")
    if args.out:
        print(f"wrote {args.out}/results.json and timeline.png")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    from thinwire.cluster.cli import add_spec_options  # the cluster's own options, kept in step

    parser = subparsers.add_parser("pipeline", help="pipeline-parallel training (pb, gpipe, 1f1b)")
    sub = parser.add_subparsers(dest="pipeline_command", metavar="ACTION")
    sub.required = True
    p = sub.add_parser(
        "train", help="train an MLP cut into stages, one rank per stage",
        description="Pipelined training with one rank per stage: pb (pipelined backpropagation, "
                    "with spike compensation and weight prediction), gpipe or 1f1b. Runs on "
                    "loopback unless --cluster is given (one stage per emulated node).")
    config.add_arguments(p)
    p.add_argument("--cluster", action="store_true",
                   help="run on the emulated cluster (network namespaces + tc; needs root)")
    add_spec_options(p, default_ranks=1)
    p.set_defaults(func=_cmd_train, nodes=None)
