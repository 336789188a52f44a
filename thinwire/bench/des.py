"""`thinwire bench des`: DES against a parameter server and TorchRec-style sharding.

Every (model, method) trains on the same batches of the same data on the emulated cluster (one
launch per data set); rows report bytes sent per step and rank (from the byte counters),
samples/s (slowest rank), test AUC, the reduction of bytes against the parameter server, and
the AUC of the unsharded single-process model trained on the same global batches.

Two reductions against the PS: ``comm_reduction_vs_ps`` counts every byte (ids included);
``payload_reduction_vs_ps`` counts only model values (rows or partials, their gradients, dense
gradients), leaving out the ids and input values both sides send to say what to look up. The
latter is how the DES paper counts its 72-99.77% "in theory".
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics

from thinwire.bench.report import format_table, run_cluster_worker, save_if_asked
from thinwire.cliargs import integer

log = logging.getLogger(__name__)

COLUMNS = ("dataset", "model", "method", "bytes_per_iter", "comm_reduction_vs_ps",
           "payload_reduction_vs_ps", "samples_per_s", "speedup_vs_ps", "auc", "auc_single_process")


def _launch(spec, dataset, models, methods, extra, timeout_s, synthetic_steps) -> dict:
    """One cluster run of `thinwire.recsys.train` over every (model, method): its rows."""
    args = ["--dataset", dataset, "--models", *models, "--methods", *methods, *(extra or [])]
    if dataset == "synthetic":  # the real data sets run whole epochs
        args += ["--max-steps", str(synthetic_steps)]
    return run_cluster_worker(spec, "thinwire.recsys.train", args, timeout_s)


def run(spec, datasets=("movielens", "synthetic"), models=("lr", "fm", "wide_deep", "deepfm"),
        methods=("des", "ps", "torchrec_tw", "torchrec_rw"), extra: list[str] | None = None,
        single_process: bool = True, timeout_s: float = 3000, synthetic_steps: int = 30,
        repeats: int = 1) -> dict:
    """`repeats` launches per data set: bytes and AUC are the same every time (same batches,
    same model), samples/s is the median over the launches (`samples_per_s_runs` has all)."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    rows = []
    for dataset in datasets:
        runs = [_launch(spec, dataset, models, methods, extra, timeout_s, synthetic_steps)
                for _ in range(repeats)]
        result = runs[0]
        for i, row in enumerate(result["rows"]):
            same = [(r["rows"][i]["model"], r["rows"][i]["method"], r["rows"][i]["bytes_per_iter"])
                    for r in runs]
            if len(set(same)) != 1:
                raise RuntimeError(f"launches disagree on {dataset} row {i} (model, method, "
                                   f"bytes/step): {same}")
            aucs = {r["rows"][i]["auc"] for r in runs}
            if len(aucs) > 1:
                log.warning("%s %s %s: AUC differs between launches: %s", dataset, row["model"],
                            row["method"], sorted(aucs))
            speeds = [r["rows"][i]["samples_per_s"] for r in runs]
            row["samples_per_s_runs"] = speeds
            row["samples_per_s"] = statistics.median(speeds)
        single = {}
        if single_process and dataset != "synthetic":
            from thinwire.recsys import train as recsys_train
            parser = argparse.ArgumentParser()
            recsys_train.add_arguments(parser)
            args = parser.parse_args(["--dataset", dataset, *(extra or [])])
            data = recsys_train.load(dataset, seed=args.seed)
            for model in models:
                single[model] = recsys_train.train_single(model, *data, args)
        by_key = {(r["model"], r["method"]): r for r in result["rows"]}
        for row in result["rows"]:
            ps = by_key.get((row["model"], "ps"))
            if ps:
                row["comm_reduction_vs_ps"] = 1 - row["bytes_per_iter"] / ps["bytes_per_iter"]
                row["payload_reduction_vs_ps"] = \
                    1 - row["payload_bytes_per_iter"] / ps["payload_bytes_per_iter"]
                row["speedup_vs_ps"] = row["samples_per_s"] / ps["samples_per_s"]
            if row["model"] in single:
                row["auc_single_process"] = single[row["model"]]["auc"]
                row["auc_diff_vs_single"] = row["auc"] - row["auc_single_process"]
            rows.append(row)
    return {"rows": rows,
            "setting": {"nodes": spec.nodes, "ranks_per_node": spec.ranks_per_node,
                        "inter_node_bandwidth": spec.inter_node_bandwidth,
                        "shaping": spec.shaping, "datasets": list(datasets),
                        "synthetic_steps": synthetic_steps, "repeats": repeats,
                        "extra": extra or []}}


def _main(args: argparse.Namespace) -> int:
    from thinwire.cluster import ClusterSpec, missing_requirements
    from thinwire.recsys import train as recsys_train

    shaping = not args.no_shaping
    if shaping and os.geteuid() != 0:
        log.warning("not root: running without traffic shaping (loopback, no slow links)")
        shaping = False
    if shaping and missing_requirements():
        log.warning("shaping unavailable (%s): running on loopback", missing_requirements())
        shaping = False
    spec = ClusterSpec(nodes=args.nodes, ranks_per_node=args.ranks_per_node,
                       inter_node_bandwidth=args.inter_node_bandwidth, shaping=shaping)
    extra = ["--epochs", str(args.epochs), "--batch", str(args.batch), "--k", str(args.k)]
    for name in recsys_train.SYNTHETIC_OPTIONS:
        extra += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    result = run(spec, args.datasets, args.models, args.methods, extra,
                 synthetic_steps=args.max_steps, repeats=args.repeats)
    print(format_table(result["rows"], COLUMNS))
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    from thinwire.recsys import train as recsys_train

    parser = bench_subparsers.add_parser(
        "des", help="DES vs parameter server vs TorchRec-style sharding (recommender models)")
    parser.add_argument("--nodes", type=integer(1, 64), default=2, help="emulated nodes")
    parser.add_argument("--ranks-per-node", type=integer(1, 64), default=2,
                        help="ranks (processes) per node")
    parser.add_argument("--inter-node-bandwidth", default="1gbit",
                        help="rate of each node's link: 100mbit, 1gbit")
    parser.add_argument("--no-shaping", action="store_true",
                        help="loopback only (no root needed): the logical topology, no slow links")
    parser.add_argument("--datasets", nargs="+", default=["movielens", "synthetic"],
                        choices=["movielens", "adult", "synthetic"], help="data sets to train on")
    parser.add_argument("--models", nargs="+", default=["lr", "fm", "wide_deep", "deepfm"],
                        help="recommender models: lr, fm, wide_deep, deepfm")
    parser.add_argument("--methods", nargs="+",
                        default=["des", "ps", "torchrec_tw", "torchrec_rw"],
                        help="embedding placements: des, ps, torchrec_tw, torchrec_rw")
    parser.add_argument("--epochs", type=integer(1), default=1,
                        help="training epochs per (model, method)")
    parser.add_argument("--batch", type=integer(1), default=1024, help="global batch size")
    parser.add_argument("--k", type=integer(1), default=8, help="embedding size")
    recsys_train.add_synthetic_arguments(parser, samples=40_000)
    parser.add_argument("--max-steps", type=integer(0), default=30,
                        help="steps per (model, method) on the synthetic set (0: whole epochs)")
    parser.add_argument("--repeats", type=integer(1), default=1,
                        help="launches per data set; samples/s is their median")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.set_defaults(func=_main)
