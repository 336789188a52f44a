"""`thinwire train` and `thinwire compare`."""

from __future__ import annotations

import argparse

from thinwire.output import check_output_dir
from thinwire.train import compare as compare_mod
from thinwire.cluster.cli import add_resource_options, resource_kwargs
from thinwire.train.config import add_arguments, add_config_file, algorithm_options, from_args


def _cmd_train(args: argparse.Namespace, argv: list[str]) -> int:
    from thinwire.train.entry import enable_stack_dumps, train

    if args.config:  # the file's settings under the command line's: parse the options again
        args = _with_config(argv)
    enable_stack_dumps()  # `kill -USR1 PID` shows a rank's threads
    train(from_args(args))
    return 0


def _with_config(argv: list[str]) -> argparse.Namespace:
    """``thinwire train``'s options with a ``--config`` file as their defaults (what
    ``python -m thinwire.train`` does; the subcommand's parser cannot, as the top-level
    parser has parsed the command line before the file is known)."""
    own = argv[argv.index("train") + 1:]
    parser = argparse.ArgumentParser(prog="thinwire train")
    add_arguments(parser)
    add_config_file(parser, own)
    return parser.parse_args(own)


def _cmd_compare(args: argparse.Namespace) -> int:
    from thinwire.train import report, workloads

    train = {k: v for k, v in vars(args).items() if k in compare_mod.TRAIN_FIELDS}
    if getattr(args, "algorithm_option", None):  # absent where a caller built args itself
        train["algorithm_options"] = algorithm_options(args)
    names = workloads.parse_workloads(args.workload)
    try:
        lr_grid = tuple(float(x) for x in args.lr_grid.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--lr-grid must list numbers > 0 (multiples of the learning rate, "
                         f"like 0.5,1,2), got {args.lr_grid!r}") from None
    races = [(name, compare_mod.CompareSettings(
        workload=name, algorithms=[a.strip() for a in args.algorithms.split(",")
                                   if a.strip()] if args.algorithms is not None
        else compare_mod.default_algorithms(bool(getattr(args, "fault_tolerant", False))),
        rates=compare_mod.parse_rates(args.inter_node_bandwidth), nodes=args.nodes,
        ranks_per_node=args.ranks_per_node, shaping=not args.no_shaping,
        target=args.target, budget_s=args.budget_s, eval_every=args.eval_every,
        stop_at_target=not args.no_stop_at_target, tune=args.tune, lr_grid=lr_grid,
        timeout_s=args.timeout, stall_s=args.stall_timeout, train=train,
        # a 0 is a value given (and refused by the spec), not an option left out
        resources={k: v for k, v in resource_kwargs(args).items()
                   if v is not None and v is not False})) for name in names]
    for _, settings in races:  # every workload's, before the first race (minutes each)
        settings.validate()
    check_output_dir(args.out, "--out")
    status = 0
    for name, settings in races:
        out = args.out if len(names) == 1 else f"{args.out}/{name}"
        results = compare_mod.compare(settings, out, progress=not args.no_progress)
        report.print_tables(results)
        print(f"\nwrote {out}/results.json, report.md and its figures")
        status = status or int(not all(r.get("status") == "ok" for r in results["runs"]))
    return status


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="train one model with one algorithm (torchrun-compatible)",
        description="Train one model with one gradient-synchronisation algorithm. Run it under "
                    "torchrun or `thinwire cluster run -- -m thinwire.train ...` for several "
                    "ranks; alone it is a world of one.")
    add_arguments(p)
    p.add_argument("--config", default=None, metavar="FILE",
                   help="JSON object of training settings (command-line options win)")
    p.set_defaults(func=_cmd_train, takes_argv=True)

    from thinwire.train import workloads

    s = compare_mod.CompareSettings()
    table = "; ".join(f"{w.name}: {w.description}, target {w.target:g}, budget {w.budget_s:g} s,"
                      f" {w.epochs} epoch(s), batch {w.batch_size}, lr {w.lr:g}, evaluation "
                      f"every {w.eval_every} steps" for w in workloads.WORKLOADS.values())
    p = subparsers.add_parser(
        "compare", help="every algorithm on the emulated cluster: time to target, plots",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Race every algorithm to a target quality on the emulated cluster: each "
                    "run trains until it reaches the target or its training-time budget ends. "
                    f"Workloads: {table}. Training options not given here are the workload's "
                    "(or thinwire train's defaults).")
    p.add_argument("--out", required=True, default=argparse.SUPPRESS, metavar="DIR",
                   help="(required) results go here (one "
                   "subdirectory per workload when there are several); re-running with the "
                   "same DIR skips the runs already finished")
    p.add_argument("--workload", default="mnist", help=f"{', '.join(workloads.WORKLOADS)}, a "
                   "comma-separated list, or all")
    p.add_argument("--algorithms", default=None, metavar="LIST",
                   help="comma-separated (default: " + ",".join(s.algorithms) + "; with "
                        "--fault-tolerant: " + ",".join(compare_mod.default_algorithms(True))
                        + "); also diloco and torchft-diloco (not raced by default: they "
                        "need --sync-every)")
    p.add_argument("--target", type=float, default=None, help="target quality (accuracy in "
                   "(0, 1], or bits per byte in (0, 8]); None: the workload's")
    p.add_argument("--budget-s", type=float, default=None, metavar="SECONDS",
                   help="training-time budget per run (0 = the whole schedule); None: the "
                        "workload's")
    p.add_argument("--no-stop-at-target", action="store_true",
                   help="train every run for the whole budget (quality at the budget for all)")
    p.add_argument("--eval-every", type=int, default=0, metavar="STEPS",
                   help="steps between evaluations (0 = the workload's)")
    p.add_argument("--tune", action="store_true", help="choose each algorithm's learning rate "
                   "(DiLoCo's: its outer one) from --lr-grid on seed + 1 first (same budget "
                   "for every method)")
    p.add_argument("--lr-grid", default=",".join(f"{m:g}" for m in s.lr_grid), metavar="LIST",
                   help="multiples of the workload's learning rate (DiLoCo: of --outer-lr) "
                        "tried by --tune")
    p.add_argument("--nodes", type=int, default=s.nodes, help="emulated nodes")
    p.add_argument("--ranks-per-node", type=int, default=s.ranks_per_node, help="ranks a node")
    p.add_argument("--inter-node-bandwidth", nargs="+", default=list(s.rates), metavar="RATE",
                   help="one rate or a list to sweep (space- or comma-separated; 'none' = "
                        "unshaped)")
    p.add_argument("--no-shaping", action="store_true", help="loopback, no namespaces or tc")
    p.add_argument("--timeout", type=float, default=s.timeout_s, metavar="SECONDS",
                   help="per run")
    p.add_argument("--stall-timeout", type=float, default=s.stall_s, metavar="SECONDS",
                   help="stop a run whose metrics show no new step for this long, report it "
                        "as failed (its log gets the ranks' stacks) and go on with the others")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_resource_options(p)
    group = p.add_argument_group("training options (as thinwire train's; the workload sets "
                                 "model, epochs, batch size and learning rate)")
    add_arguments(group, exclude=compare_mod.PER_RUN)
    base = compare_mod.TrainConfig()
    for action in group._group_actions:  # absent unless given: the workload decides otherwise
        default = action.default if action.default is not None else getattr(
            base, action.dest, None)
        action.default = argparse.SUPPRESS
        by_workload = action.dest in ("model", "epochs", "batch_size", "lr")
        action.help = (action.help or action.dest.replace("_", " ")).replace(
            f" (default {default})", "").replace(" (default: the model's for sgd, 2.0 for lars)",
                                                 "") + \
            (" (default: the workload's)" if by_workload else f" (default: {default})")
    p.set_defaults(func=_cmd_compare)
