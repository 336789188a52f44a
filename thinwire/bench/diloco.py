"""`thinwire bench diloco`: DiLoCo (dense and hitopk outer step) against per-step DDP and hitopk
on the emulated cluster, and thinwire's dense DiLoCo against torchft's per outer step.

Per configuration: time per inner step (slowest rank, evaluation excluded), inter-node bytes per
inner step (busiest rank, thinwire's ring model), held-out bits per byte at the end, and the time
to reach ``--target-bits`` (default: the final value of per-step hitopk in the same run, else the
worst final value; ratios to hitopk come from the same run). ``--torchft`` adds the per-outer-step
comparison with torchft on loopback (no shaping: both exchange the same bytes over gloo).
"""

from __future__ import annotations

import argparse
import statistics

from thinwire.bench.report import (add_collective_timeout, format_table,
                                   run_cluster_worker, save_if_asked)
from thinwire.cliargs import add_declared, integer, number, refuse_unused

# The DiLoCo settings this benchmark passes to its configurations, as `thinwire train` declares
# them (thinwire.train.settings): (dest, setting, flag, own default or None, which runs use it).
# The sparseloco configuration's outer learning rate and momentum have their own flags, since
# a race runs it beside dense DiLoCo (SparseLoCo's outer step has no momentum).
OUTER_SETTINGS = (
    ("outer_lr", "outer_lr", None, None, "diloco-H and diloco-hitopk-H"),
    ("outer_momentum", "outer_momentum", None, None, "diloco-H and diloco-hitopk-H"),
    ("fragments", "fragments", None, None, "the DiLoCo configurations"),
    ("overlap", "overlap", None, None, "the DiLoCo configurations"),
    ("sparse_density", "density", "--sparse-density", 0.1, "diloco-sparseloco-H"),
    ("outer_chunk", "outer_chunk", None, None, "diloco-sparseloco-H"),
    ("outer_bits", "outer_bits", None, None, "diloco-sparseloco-H"),
    ("outer_decay", "outer_decay", None, None, "diloco-sparseloco-H"),
    ("sparse_outer_lr", "outer_lr", "--sparse-outer-lr", 0.7, "diloco-sparseloco-H"),
    ("sparse_outer_momentum", "outer_momentum", "--sparse-outer-momentum", 0.0,
     "diloco-sparseloco-H"),
)
COLUMNS = ("config", "s_per_step", "vs_hitopk_time", "inter_kb_per_step", "ddp_bytes_over",
           "final_bits", "time_to_target_s", "vs_hitopk_to_target")


def _time_to(curve: list[dict], target: float) -> float | None:
    return next((point["seconds"] for point in curve if point["bits"] <= target), None)


def run(spec, configs, steps: int, batch: int, density: float, eval_every: int,
        target_bits: float | None, model: str = "transformer", lr: float = 3e-3,
        outer_density: float | None = None, timeout_s: float = 3600,
        collective_timeout_s: float = 300.0,
        outer: dict | None = None) -> dict:
    """``outer``: {dest: value} of OUTER_SETTINGS (the rest keep their defaults)."""
    from thinwire.bench.diloco_worker import check_config_name

    for name in configs:  # before anything launches
        if name not in ("ddp", "hitopk"):
            check_config_name(name)
    outer = dict(outer or {})
    unknown = sorted(set(outer) - {dest for dest, *_ in OUTER_SETTINGS})
    if unknown:
        raise ValueError(f"outer: unknown settings {unknown}; allowed: "
                         f"{', '.join(dest for dest, *_ in OUTER_SETTINGS)}")
    args = ["--model", model, "--steps", str(steps), "--batch", str(batch),
            "--density", str(density), "--eval-every", str(eval_every), "--lr", str(lr)]
    if outer_density is not None:
        args += ["--outer-density", str(outer_density)]
    for key, value in outer.items():
        flag = f"--{key.replace('_', '-')}"
        args += ([flag] if value else []) if isinstance(value, bool) else [flag, str(value)]
    args += ["--configs", *configs]
    result = run_cluster_worker(spec, "thinwire.bench.diloco_worker", args, timeout_s,
        collective_timeout_s)
    rows = {row["config"]: row for row in result["rows"]}
    # default target: what per-step hitopk reaches at the end (else the worst final value)
    target = target_bits if target_bits is not None else \
        rows["hitopk"]["final_bits"] if "hitopk" in rows else \
        max(row["final_bits"] for row in result["rows"])
    for row in result["rows"]:
        row["inter_kb_per_step"] = row["inter_bytes_per_step"] / 1e3
        row["time_to_target_s"] = _time_to(row["curve"], target)
        if "ddp" in rows and row["inter_bytes_per_step"] > 0:
            row["ddp_bytes_over"] = rows["ddp"]["inter_bytes_per_step"] / row["inter_bytes_per_step"]
        if "hitopk" in rows:
            row["vs_hitopk_time"] = row["s_per_step"] / rows["hitopk"]["s_per_step"]
            base = rows["hitopk"]["time_to_target_s"] if "time_to_target_s" in rows["hitopk"] \
                else _time_to(rows["hitopk"]["curve"], target)
            if base and row["time_to_target_s"] is not None:
                row["vs_hitopk_to_target"] = row["time_to_target_s"] / base
    result["setting"] = {"nodes": spec.nodes, "ranks_per_node": spec.ranks_per_node,
                         "inter_node_bandwidth": spec.inter_node_bandwidth,
                         "shaping": spec.shaping, "model": model, "steps": steps,
                         "batch": batch, "density": density, "outer_density": outer_density or density,
                         "eval_every": eval_every, "outer": outer,
                         "lr": lr, "target_bits": target}
    return result


def torchft_outer_steps(nodes: int = 2, steps: int = 40, sync_every: int = 10,
                        repeats: int = 3) -> dict:
    """Median wall time of the inner step that carries the outer step (everything else is the
    same inner AdamW step), thinwire vs torchft, one process per node on loopback for thinwire,
    one thread per node for torchft (as torchft's own tests run it)."""
    import torch

    from thinwire.local_sgd import torchft_peer
    from thinwire.bench.diloco_peer import thinwire_replicas, torchft_lm_replica

    rows = []
    for repeat in range(repeats):
        ours = thinwire_replicas(nodes, steps, sync_every)
        theirs = torchft_peer.run_replicas(nodes, torchft_lm_replica, steps, sync_every,
                                           processes=True, timeout_s=600)
        worst = max(float((a - b).abs().max())
                    for a, b in zip(ours[0]["params"], theirs[0]["params"]))
        rows.append({"repeat": repeat, "max_param_diff": worst,
                     "thinwire_s": statistics.median(s for r in ours for s in r["sync_s"]),
                     "torchft_s": statistics.median(s for r in theirs for s in r["sync_s"])})
    for row in rows:
        row["ratio"] = row["thinwire_s"] / row["torchft_s"]
    thinwire_s = statistics.median(r["thinwire_s"] for r in rows)
    torchft_s = statistics.median(r["torchft_s"] for r in rows)
    return {"rows": rows, "thinwire_s": thinwire_s, "torchft_s": torchft_s,
            # the median of the per-repeat ratios (both measured in the same repeat)
            "thinwire_over_torchft": statistics.median(r["ratio"] for r in rows),
            "setting": {"nodes": nodes, "steps": steps, "sync_every": sync_every,
                        "model": "transformer", "repeats": repeats}}


def _main(args: argparse.Namespace) -> int:
    from thinwire.cluster import ClusterSpec

    result = {}
    configs = args.configs or (["ddp", "hitopk"] + [f"diloco-{h}" for h in args.sync_every]
                               + [f"diloco-hitopk-{h}" for h in args.sync_every])
    if not args.torchft_only:
        _refuse_unused(args, configs)
        spec = ClusterSpec(nodes=args.nodes, ranks_per_node=args.ranks_per_node,
                           inter_node_bandwidth=args.inter_node_bandwidth,
                           shaping=not args.no_shaping)
        result = run(spec, configs, args.steps, args.batch, args.density, args.eval_every,
                     args.target_bits, args.model, args.lr, args.outer_density,
                     outer={dest: getattr(args, dest) for dest, *_ in OUTER_SETTINGS},
                     collective_timeout_s=args.collective_timeout)
        print(format_table(result["rows"], COLUMNS))
    if args.torchft or args.torchft_only:
        result["torchft"] = torchft_outer_steps(repeats=args.repeats)
        print(format_table(result["torchft"]["rows"],
                           ("repeat", "thinwire_s", "torchft_s", "ratio", "max_param_diff")))
        print(f"thinwire / torchft per outer step: {result['torchft']['thinwire_over_torchft']:.3f}")
    save_if_asked(args.json, result)
    return 0


def _add_outer_settings(parser) -> None:
    from thinwire.train.settings import BY_NAME

    for dest, name, flag, default, used_by in OUTER_SETTINGS:
        add_declared(parser, BY_NAME[name], flag=flag, dest=dest,
                     default=BY_NAME[name].default if default is None else default,
                     help_prefix=f"{used_by}: ")


def _refuse_unused(args, configs: list[str]) -> None:
    """A DiLoCo setting given where no configuration of the race uses it is refused by name."""
    from thinwire.train.settings import BY_NAME

    kinds = {name.rpartition("-")[0] for name in configs if name not in ("ddp", "hitopk")}
    users = {"diloco-H and diloco-hitopk-H": bool(kinds & {"diloco", "diloco-hitopk"}),
             "the DiLoCo configurations": bool(kinds),
             "diloco-sparseloco-H": "diloco-sparseloco" in kinds}
    rules = [(flag or BY_NAME[name].cli_flag, dest,
              BY_NAME[name].default if default is None else default, users[used_by], used_by)
             for dest, name, flag, default, used_by in OUTER_SETTINGS]
    rules.append(("--outer-density", "outer_density", None, "diloco-hitopk" in kinds,
                  "diloco-hitopk-H"))
    refuse_unused(args, rules)


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "diloco", help="DiLoCo vs per-step DDP and hitopk on the emulated cluster (and torchft)")
    parser.add_argument("--nodes", type=integer(1, 250), default=2, help="emulated nodes")
    parser.add_argument("--ranks-per-node", type=integer(1, 256), default=2, help="ranks (processes) per node")
    parser.add_argument("--inter-node-bandwidth", default="100mbit",
                        help="rate of each node's link: 100mbit, 1gbit")
    parser.add_argument("--no-shaping", action="store_true",
                        help="loopback only (no root needed): the logical topology, no slow links")
    parser.add_argument("--model", default="transformer",
                        help="model trained by every configuration")
    parser.add_argument("--steps", type=integer(1), default=120, help="inner steps per configuration")
    parser.add_argument("--batch", type=integer(1), default=16, help="blocks per rank per step")
    parser.add_argument("--lr", type=number(0, 1e3, low_open=True), default=3e-3, help="inner AdamW learning rate")
    parser.add_argument("--density", type=number(0, 1, low_open=True), default=0.01,
                        help="share of entries sent by hitopk (per step, and on the outer step)")
    parser.add_argument("--sync-every", type=integer(1), nargs="+", default=[20],
                        help="DiLoCo's inner steps between outer steps (H); several for a sweep")
    parser.add_argument("--outer-density", type=number(0, 1, low_open=True), default=None,
                        help="density of the hitopk outer step (default: --density)")
    parser.add_argument("--configs", nargs="+", default=None,
                        help="explicit list: ddp, hitopk, diloco-H, diloco-hitopk-H, "
                             "diloco-sparseloco-H")
    _add_outer_settings(parser)
    parser.add_argument("--eval-every", type=integer(1), default=20,
                        help="steps between held-out evaluations")
    parser.add_argument("--target-bits", type=number(0, 8, low_open=True), default=None,
                        help="bits per byte for time to target (not set: per-step hitopk's "
                             "final value)")
    parser.add_argument("--torchft", action="store_true",
                        help="also time thinwire's dense DiLoCo against torchft per outer step")
    parser.add_argument("--torchft-only", action="store_true",
                        help="only the thinwire-against-torchft timing")
    parser.add_argument("--repeats", type=integer(1), default=3,
                        help="torchft timing: repetitions (the median is reported)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    add_collective_timeout(parser)
    parser.set_defaults(func=_main)
