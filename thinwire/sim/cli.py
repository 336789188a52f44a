r"""`thinwire simulate`: predicted iteration time and scaling, or calibration on measured runs.

    thinwire simulate --nodes 16 --gpus-per-node 8 --network cloud-25g --model resnet50 \
        --algorithm hier_allreduce --algorithm hitopk --json results/sim.json
    thinwire simulate --calibrate results.json --json results/calibration.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from thinwire.output import format_table, write_json_atomic
from thinwire.cliargs import (add_algorithm_option, add_declared, integer, number,
                              options_by_algorithm, refuse_unused)
from thinwire.collectives import sparse_wire_names
from thinwire.compress import SPARSE_WIRES
from thinwire.local_sgd.sparse_outer import NAME as SPARSELOCO
from thinwire.output import check_output_path
from thinwire.collectives import costs
from thinwire.sim import compute
from thinwire.sim.collectives import AlgorithmConfig, Cluster, names as algorithm_names
from thinwire.sim.iteration import SCALING_NODES, scaling, simulate
from thinwire.sim.network import GBIT, NETWORKS, network
from thinwire.sim.repeats import add_repeats_option
from thinwire.sync import DEFAULT_BUCKET_BYTES

MAX_NODES, MAX_GPUS_PER_NODE = costs.MAX_NODES, costs.MAX_RANKS_PER_NODE  # Cluster's bounds


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate", help="cost model: predicted iteration time and scaling (or --calibrate)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=integer(1, MAX_NODES), default=16,
                   help="nodes of the simulated cluster")
    p.add_argument("--gpus-per-node", "--ranks-per-node", dest="gpus_per_node",
                   type=integer(1, MAX_GPUS_PER_NODE), default=8, help="GPUs (ranks) per node")
    p.add_argument("--network", default="cloud-25g", help=f"one of {', '.join(NETWORKS)}")
    p.add_argument("--inter-gbps", type=number(0, 1e5, low_open=True), default=None,
                   help="override the preset's inter-node goodput (Gbit/s)")
    p.add_argument("--model", default="resnet50",
                   help=f"one of {', '.join(compute.MODELS)}, or a JSON table of measured "
                        "per-layer times (params, forward_s, backward_s)")
    p.add_argument("--device", default="v100", help=f"one of {', '.join(compute.DEVICES)}")
    p.add_argument("--tflops", type=number(0, 1e6, low_open=True), default=None,
                   help="override the device's effective TFLOP/s")
    p.add_argument("--batch-size", type=integer(1, 1 << 20), default=None,
                   help="per GPU (default: per model)")
    p.add_argument("--algorithm", action="append", default=None,
                   help=f"one of {', '.join(algorithm_names())}; repeat for several (default: all)")
    p.add_argument("--density", type=number(0, 1, low_open=True), default=0.01,
                   help="sparse algorithms: share of entries sent")
    p.add_argument("--wire", default="none", help="dense wire dtype: none, fp16, bf16")
    p.add_argument("--sparse-wire", default="fp32",
                   help="the selected values' dtype on the wire: fp32, fp16, bf16 (the "
                        "algorithms that take it: thinwire train --help)")
    add_algorithm_option(p)
    p.add_argument("--bucket-mb", type=number(0, 10240, low_open=True),
                   default=DEFAULT_BUCKET_BYTES / 2**20, help="gradient bucket size in MiB")
    p.add_argument("--no-overlap", action="store_true", help="communication after backward")
    p.add_argument("--scaling-nodes", type=_scaling_nodes,
                   default=",".join(map(str, SCALING_NODES)),
                   help="node counts of the scaling table (comma-separated)")
    # DiLoCo's settings as `thinwire train` declares them (thinwire.train.settings)
    from thinwire.train.settings import BY_NAME

    add_declared(p, BY_NAME["sync_every"], flag="--diloco-sync-every", dest="diloco_sync_every",
                 help_prefix="also predict DiLoCo rows, one per --outer-algorithm (0 = none): ")
    p.add_argument("--outer-algorithm", action="append", default=None,
                   help="DiLoCo's outer exchange (repeat for several; default hier_allreduce; "
                        f"one of {', '.join(BY_NAME['outer_algorithm'].allowed_choices())}; "
                        "sparse ones use --density)")
    add_declared(p, BY_NAME["fragments"], flag="--diloco-fragments", dest="diloco_fragments")
    add_declared(p, BY_NAME["overlap"], flag="--diloco-overlap", dest="diloco_overlap")
    for name in ("outer_chunk", "outer_bits"):
        add_declared(p, BY_NAME[name], help_prefix="--outer-algorithm sparseloco: ")
    p.add_argument("--calibrate", nargs="+", metavar="RESULTS_JSON", default=None,
                   help="fit to `thinwire compare` results instead of simulating")
    p.add_argument("--calibrate-at", default=None, metavar="RATE",
                   help="with --calibrate: fit on the runs at this link rate only (e.g. "
                        "200mbit) and predict the runs at the sweep's other rates (out-of-"
                        "sample error per algorithm); default: fit and predict all runs")
    p.add_argument("--overlap", default="hooks", choices=("hooks", "auto", "ddp", "none"),
                   help="calibration: which runs overlap communication with the backward pass "
                        "(hooks: as each run's hook does; auto: the better fit of ddp/none)")
    p.add_argument("--phase-form", default="sum", choices=("sum", "max"),
                   help="calibration: a phase costs its fixed cost plus its wire time (sum, the "
                        "alpha-beta model) or the larger of the two (max)")
    add_repeats_option(p)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--plot", default=None,
                   help="PNG path (default: beside --json, else results/simulate.png)")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.set_defaults(func=main)


def _layers(args) -> tuple[list, int | None, str]:
    if args.model.endswith(".json") or Path(args.model).is_file():
        return compute.read_layer_table(args.model), args.batch_size, "measured layer times"
    table = compute.model(args.model)
    dev = compute.device(args.device)
    flops = args.tflops * 1e12 if args.tflops is not None else dev.flops
    batch = args.batch_size if args.batch_size is not None else compute.MODELS[args.model][1]
    return compute.timed(table, flops, batch), batch, f"{args.device} at {flops / 1e12:g} TFLOP/s"


def _scaling_nodes(text: str) -> str:
    """An argparse type: one or more comma-separated node counts in [1, MAX_NODES]."""
    try:
        nodes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        nodes = []
    if not nodes or not all(1 <= m <= MAX_NODES for m in nodes):
        raise argparse.ArgumentTypeError(f"must be comma-separated integers in [1, {MAX_NODES}] "
                                         f"(at least one), got {text!r}")
    return text


def _node_list(text: str) -> list[int]:
    return [int(x) for x in _scaling_nodes(text).split(",") if x.strip()]


def _sparse_wire_for(name: str, sparse_wire: str) -> str:
    """--sparse-wire for the algorithms that take it, fp32 for the others (as compare runs a
    list of algorithms)."""
    return sparse_wire if name in sparse_wire_names() else "fp32"


def _refuse_unused_outer(args, outer_names: list[str]) -> None:
    """DiLoCo's settings without DiLoCo rows, and SparseLoCo's without a sparseloco outer
    exchange, are refused by name (they would be ignored); an outer algorithm is checked as
    `thinwire train` checks it."""
    from thinwire.train.settings import BY_NAME

    for name in outer_names:
        BY_NAME["outer_algorithm"].checked(name)
    diloco = bool(args.diloco_sync_every)
    refuse_unused(args, [
        ("--outer-algorithm", "outer_algorithm", None, diloco, "--diloco-sync-every H > 0"),
        ("--diloco-fragments", "diloco_fragments", 1, diloco, "--diloco-sync-every H > 0"),
        ("--diloco-overlap", "diloco_overlap", False, diloco, "--diloco-sync-every H > 0")]
        + [(BY_NAME[n].cli_flag, n, BY_NAME[n].default, SPARSELOCO in outer_names,
            "--outer-algorithm sparseloco") for n in ("outer_chunk", "outer_bits")])


def run_simulate(args) -> dict:
    cluster = Cluster(args.nodes, args.gpus_per_node)
    net = network(args.network)
    if args.inter_gbps is not None:
        if not args.inter_gbps > 0:
            raise ValueError(f"inter_gbps must be > 0, got {args.inter_gbps}")
        net = net.with_inter_bandwidth(args.inter_gbps * GBIT)
    layers, batch, compute_note = _layers(args)
    rates = compute.device(args.device).sparse
    wire = None if args.wire == "none" else args.wire
    names = args.algorithm or list(algorithm_names())
    if args.sparse_wire not in SPARSE_WIRES:
        raise ValueError(f"--sparse-wire must be one of {', '.join(SPARSE_WIRES)}, got "
                         f"{args.sparse_wire!r}")
    outer_names = (args.outer_algorithm or ["hier_allreduce"]) if args.diloco_sync_every else []
    _refuse_unused_outer(args, outer_names)
    own = options_by_algorithm(args.algorithm_option or [], names + list(outer_names))
    configs = [AlgorithmConfig(name, density=args.density, wire=wire,
                               sparse_wire=_sparse_wire_for(name, args.sparse_wire),
                               options=own.get(name)) for name in names]
    if not args.bucket_mb > 0:
        raise ValueError(f"bucket_mb must be > 0, got {args.bucket_mb}")
    options = {"bucket_bytes": int(args.bucket_mb * 2**20), "overlap": not args.no_overlap,
               "batch_size": batch}
    breakdown = [simulate(layers, cluster, net, cfg, rates, **options) for cfg in configs]
    rows = scaling(layers, args.gpus_per_node, net, configs, rates,
                   _node_list(args.scaling_nodes), **options)
    if args.diloco_sync_every:  # DiLoCo rows beside the per-step algorithms'
        from thinwire.sim.diloco import SparseLoCoConfig, simulate_diloco
        schedule = {"sync_every": args.diloco_sync_every, "fragments": args.diloco_fragments,
                    "overlap": args.diloco_overlap, "bucket_bytes": options["bucket_bytes"],
                    "batch_size": batch}
        for name in outer_names:
            outer = SparseLoCoConfig(args.density, args.outer_chunk, args.outer_bits or None) \
                if name == SPARSELOCO else \
                AlgorithmConfig(name, density=args.density, wire=wire,
                                sparse_wire=_sparse_wire_for(name, args.sparse_wire),
                                options=own.get(name))
            breakdown.append(simulate_diloco(layers, cluster, net, outer, rates, **schedule))
            rows += [simulate_diloco(layers, Cluster(m, args.gpus_per_node), net, outer, rates,
                                     **schedule) for m in _node_list(args.scaling_nodes)]
    setting = {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node,
               "network": args.network, "inter_bandwidth_Bps": net.inter.bandwidth,
               "inter_alpha_s": net.inter.alpha, "intra_bandwidth_Bps": net.intra.bandwidth,
               "intra_alpha_s": net.intra.alpha, "model": args.model, "device": args.device,
               "compute": compute_note, "batch_size_per_gpu": batch, "density": args.density,
               "wire": args.wire, "sparse_wire": args.sparse_wire,
               "algorithm_options": {cfg.name: cfg.options for cfg in configs if cfg.options},
               "bucket_mb": args.bucket_mb, "overlap": not args.no_overlap,
               "selection": vars(rates), "diloco_sync_every": args.diloco_sync_every}
    return {"setting": setting, "breakdown": breakdown, "scaling": rows}


def _print_simulation(result: dict) -> None:
    s = result["setting"]
    print(f"{s['model']} on {s['nodes']} x {s['gpus_per_node']} ({s['network']}, "
          f"{s['compute']}, batch {s['batch_size_per_gpu']}/GPU, density {s['density']})")
    rows = [{"algorithm": r["algorithm"], "iter_ms": 1e3 * r["iteration_s"],
             "compute_ms": 1e3 * r["compute_s"], "exposed_comm_ms": 1e3 * r["exposed_comm_s"],
             "exposed_select_ms": 1e3 * r["exposed_selection_s"],
             "inter_MB/node": r["inter_node_mb_per_iter"],
             "efficiency_%": 100 * r["scaling_efficiency"]} for r in result["breakdown"]]
    print(format_table(rows, rows[0].keys()))
    nodes = list(dict.fromkeys(r["nodes"] for r in result["scaling"]))
    table = []
    for m in nodes:
        row = {"nodes": m}
        for r in result["scaling"]:
            if r["nodes"] == m:
                row[r["algorithm"]] = 100 * r["scaling_efficiency"]
        table.append(row)
    print("\nscaling efficiency (%), compute / iteration time:")
    print(format_table(table, table[0].keys()))


def _print_calibration(result: dict) -> None:
    from thinwire.sim.calibrate import floors_line

    f = result["fitted"]
    print("fitted: " + ", ".join(f"{k}={v:.4g}" for k, v in f.items()
                                 if isinstance(v, float))
          + f", compute_s per setting={[round(v, 4) for v in f['compute_s_per_setting']]}"
          + f", overlap={result['overlap']}")
    extras = {k: round(1e3 * v, 1) for k, v in f.get("step_extra_s", {}).items() if v}
    if extras:
        print(f"fixed cost per step beyond the modelled phases (ms): {extras}")
    scaled = {r["algorithm"]: round(r["scale"], 2) for r in f.get("bytes_scale", [])
              if abs(r["scale"] - 1) > 0.05}
    if scaled:
        print(f"measured / modelled inter-node bytes: {scaled}")
    floors = floors_line(f)
    if floors:
        print(floors)
    rows = [{"algorithm": r["algorithm"], "nodes": r["nodes"], "ranks/node": r["ranks_per_node"],
             "measured_ms": 1e3 * r["measured_s"], "predicted_ms": 1e3 * r["predicted_s"],
             "error_%": 100 * r["error"]} for r in result["runs"]]
    print(format_table(rows, rows[0].keys()))
    print(f"max |error| {100 * result['max_abs_error']:.1f}% "
          f"({'within' if result['within_20pct'] else 'NOT within'} 20%)")
    for note in result["skipped"]:
        print(f"skipped: {note}")


def main(args) -> int:
    default_plot = (Path(args.json).with_suffix(".png") if args.json
                    else Path("results/simulate.png"))
    plot_path = Path(args.plot) if args.plot else default_plot
    check_output_path(args.json, "--json")  # before the work, not after it
    if not args.no_plot:
        check_output_path(plot_path, "--plot")
    if args.calibrate:
        from thinwire.sim.calibrate import calibrate
        for path in args.calibrate:
            if not Path(path).is_file():
                raise FileNotFoundError(f"calibration input not found: {path}")
        if args.calibrate_at is not None:
            from thinwire.sim.holdout import holdout, print_holdout
            result = holdout(args.calibrate, args.calibrate_at, overlap=args.overlap,
                             repeats=args.repeats, form=args.phase_form)
            print_holdout(result)
        else:
            result = calibrate(args.calibrate, overlap=args.overlap, form=args.phase_form)
            _print_calibration(result)
        if not args.no_plot and args.calibrate_at is None:
            from thinwire.sim.plot import calibration_plot
            calibration_plot(plot_path, result["runs"])
    else:
        result = run_simulate(args)
        _print_simulation(result)
        if not args.no_plot:
            from thinwire.sim.plot import scaling_plot
            s = result["setting"]
            scaling_plot(plot_path, result["breakdown"], result["scaling"],
                         f"{s['model']}, {s['gpus_per_node']} GPUs/node, {s['network']}")
    if not args.no_plot and not (args.calibrate and args.calibrate_at is not None):
        print(f"plot: {plot_path}")
    if args.json:
        write_json_atomic(args.json, result)
        print(f"json: {args.json}")
    return 0
