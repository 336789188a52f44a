"""`thinwire train` and `thinwire compare`."""

from __future__ import annotations

import argparse

from thinwire.train import compare as compare_mod
from thinwire.cluster.cli import add_resource_options, resource_kwargs
from thinwire.train.config import add_arguments, from_args


def _cmd_train(args: argparse.Namespace) -> int:
    from thinwire.train.loop import train

    train(from_args(args))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from thinwire.train import report

    settings = compare_mod.CompareSettings(
        algorithms=[a.strip() for a in args.algorithms.split(",") if a.strip()],
        model=args.model, epochs=args.epochs, max_iters=args.max_iters,
        batch_size=args.batch_size, density=args.density, selector=args.selector,
        powersgd_rank=args.powersgd_rank, nodes=args.nodes, ranks_per_node=args.ranks_per_node,
        rates=compare_mod.parse_rates(args.inter_node_bandwidth), shaping=not args.no_shaping,
        seed=args.seed, target_accuracy=args.target_accuracy or None,
        evals_per_epoch=args.evals_per_epoch, timeout_s=args.timeout,
        resources={k: v for k, v in resource_kwargs(args).items() if v not in (None, False)})
    results = compare_mod.compare(settings, args.out, progress=not args.no_progress)
    report.print_tables(results)
    print(f"\nwrote {args.out}/results.json, report.md, accuracy_vs_time.png, throughput.png")
    return 0 if all(r.get("status") == "ok" for r in results["runs"]) else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="train one model with one algorithm (torchrun-compatible)",
        description="Train one model with one gradient-synchronisation algorithm. Run it under "
                    "torchrun or `thinwire cluster run -- -m thinwire.train ...` for several "
                    "ranks; alone it is a world of one.")
    add_arguments(p)
    p.set_defaults(func=_cmd_train)

    s = compare_mod.CompareSettings()
    p = subparsers.add_parser(
        "compare", help="every algorithm on the emulated cluster: table, results.json, plots",
        description="Train the same model, data, seed and epochs with each algorithm on the "
                    "emulated cluster and compare throughput, communication and accuracy.")
    p.add_argument("--out", required=True, metavar="DIR", help="results go here; re-running "
                   "with the same DIR skips the runs already finished")
    p.add_argument("--algorithms", default=",".join(s.algorithms), metavar="LIST",
                   help=f"comma-separated (default {','.join(s.algorithms)})")
    p.add_argument("--model", default=s.model, help=f"default {s.model}")
    p.add_argument("--epochs", type=int, default=s.epochs)
    p.add_argument("--max-iters", type=int, default=0, help="cap on steps per run (0 = none)")
    p.add_argument("--batch-size", type=int, default=s.batch_size, help="per rank")
    p.add_argument("--density", type=float, default=s.density)
    p.add_argument("--selector", default=s.selector)
    p.add_argument("--powersgd-rank", type=int, default=s.powersgd_rank)
    p.add_argument("--nodes", type=int, default=s.nodes)
    p.add_argument("--ranks-per-node", type=int, default=s.ranks_per_node)
    p.add_argument("--inter-node-bandwidth", nargs="+", default=list(s.rates), metavar="RATE",
                   help=f"one rate or a list to sweep (space- or comma-separated; 'none' = "
                        f"unshaped; default {','.join(s.rates)})")
    p.add_argument("--no-shaping", action="store_true", help="loopback, no namespaces or tc")
    p.add_argument("--seed", type=int, default=s.seed)
    p.add_argument("--target-accuracy", type=float, default=s.target_accuracy,
                   help=f"for the time-to-accuracy column (default {s.target_accuracy}; 0 = none)")
    p.add_argument("--evals-per-epoch", type=int, default=s.evals_per_epoch)
    p.add_argument("--timeout", type=float, default=s.timeout_s, metavar="SECONDS",
                   help="per run")
    p.add_argument("--no-progress", action="store_true")
    add_resource_options(p)
    p.set_defaults(func=_cmd_compare)
