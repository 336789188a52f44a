"""`thinwire bench wavelet`: one wave against two (tick-tock) on the emulated cluster.

Same nodes, node CPU budget, node memory limit and link rate for both. Steps:

1. calibrate: one wave at ``--batch-size B`` without a memory limit; the node limit becomes its
   measured node peak (cgroup ``max_usage``) plus ``--limit-margin`` (unless ``--node-memory``
   is given): the limit one wave at batch B just fits;
2. the largest batch that fits that limit, with one wave and with two (each candidate of
   ``--fit-fractions`` x B runs a few steps; it fits when the run ends without an OOM kill);
3. ``--repeats`` x (one wave at B, two waves at the largest two-wave batch that fits), in that
   order within each repetition; both see about the same number of samples (one wave
   ``--steps`` steps, two waves as many samples in fewer steps), so test accuracy compares per
   sample seen. Ratios are taken within a repetition; the table reports medians.

Per run: samples/s over the timed steps, the exposed communication share of a step (the sync
phase after the last gradient, over the step), node peak memory, test accuracy. The figure
shows both waves' phases and memory (each process's RssAnon and the node cgroup's usage, every
10 ms) for the last repetition.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
from pathlib import Path

from thinwire.bench.report import format_table, save_if_asked

log = logging.getLogger(__name__)
COLUMNS = ("waves", "batch_per_process", "lr", "samples_per_step", "samples_per_s", "vs_one_wave",
           "comm_share", "node_peak_mib", "node_limit_mib", "test_accuracy", "samples_seen",
           "repeats")
FIT_COLUMNS = ("waves", "batch_per_process", "fits", "node_peak_mib", "node_limit_mib")


def _launch(args, waves: int, batch: int, steps: int, limit: str | None, folder: Path,
            tag: str, lr: float | None = None) -> dict:
    """One run; returns its summary with the node accounting, or {"fits": False, ...}."""
    from thinwire.cluster import ClusterSpec, run
    from thinwire.cluster.accounting import NodeOutOfMemory

    spec = ClusterSpec(args.nodes, waves, inter_node_bandwidth=args.inter_node_bandwidth,
                       node_cpus=args.node_cpus, node_memory=limit)
    summary, stats = folder / f"{tag}.json", folder / f"{tag}.stats.json"
    command = ["-m", "thinwire.wavelet", "--waves", str(waves), "--model", args.model,
               "--batch-size", str(batch), "--max-iters", str(steps), "--epochs", "1000",
               "--algorithm", args.algorithm, "--lr", str(args.lr if lr is None else lr),
               "--no-progress",
               "--compute-probe-iters", "0", "--summary", str(summary), "--log-every", "1000"]
    if args.warmup_steps is not None:
        command += ["--warmup-steps", str(args.warmup_steps)]
    if waves == 2:
        command += ["--wave-turn", args.wave_turn]
    log.info("bench wavelet: %s: %d wave(s), batch %d, %d steps, limit %s", tag, waves, batch,
             steps, limit)
    try:
        status = run(spec, command, timeout_s=args.timeout, stats_path=str(stats))
    except NodeOutOfMemory as exc:
        return {"fits": False, "status": "oom", "error": str(exc)}
    node_stats = json.loads(stats.read_text()) if stats.exists() else {"nodes": []}
    peak = max((n.get("peak_memory_bytes") or 0 for n in node_stats["nodes"]), default=None)
    if status != 0 or not summary.exists():
        return {"fits": False, "status": status, "node_peak_bytes": peak}
    result = json.loads(summary.read_text())
    result.update(fits=True, status=0, node_peak_bytes=peak,
                  node_series=[n["series"] for n in node_stats["nodes"]])
    return result


def comm_share(summary: dict) -> float | None:
    """Median over timed steps and ranks of (sync after the last gradient) / step time."""
    shares = []
    for record in summary["ranks"]:
        by_step: dict[int, dict] = {}
        for event in record["events"]:
            by_step.setdefault(event["step"], {})[event["kind"]] = event
        for step, kinds in by_step.items():
            if step < 2 or "sync" not in kinds or "forward" not in kinds:
                continue
            start = kinds.get("wait", kinds["forward"])["start"]
            span = kinds["update"]["end"] - start
            if span > 0:
                shares.append((kinds["sync"]["end"] - kinds["sync"]["start"]) / span)
    return statistics.median(shares) if shares else None


def run(args) -> dict:
    from thinwire.cluster.spec import format_size, parse_size
    from thinwire.wavelet.plot import plot_runs

    mib = 2 ** 20
    B = args.batch_size
    with tempfile.TemporaryDirectory(prefix="thinwire-bench-wavelet-") as scratch:
        folder = Path(scratch)
        if args.node_memory:
            limit_bytes = parse_size(args.node_memory, "--node-memory")
            calibration = None
        else:
            calibration = _launch(args, 1, B, args.fit_steps, None, folder, "calibrate")
            if not calibration["fits"]:
                raise RuntimeError(f"calibration run failed: {calibration}")
            limit_bytes = int(calibration["node_peak_bytes"] * (1 + args.limit_margin))
        limit = f"{limit_bytes // mib}m"
        fit_rows = []
        for waves, fractions in ((1, args.fit_fractions_one), (2, args.fit_fractions_two)):
            for fraction in sorted(fractions, reverse=waves == 2):
                batch = max(1, round(B * fraction))
                result = _launch(args, waves, batch, args.fit_steps, limit, folder,
                                 f"fit{waves}-{batch}")
                fit_rows.append({"waves": waves, "batch_per_process": batch,
                                 "fits": result["fits"],
                                 "node_peak_mib": (result.get("node_peak_bytes") or 0) / mib,
                                 "node_limit_mib": limit_bytes / mib,
                                 "status": result["status"]})
                if waves == 2 and result["fits"]:
                    break  # largest first: the first that fits is the largest
                if waves == 1 and not result["fits"]:
                    break  # smallest first: the first that fails ends the search
        largest = {w: max((r["batch_per_process"] for r in fit_rows
                           if r["waves"] == w and r["fits"]), default=None) for w in (1, 2)}
        b2 = largest[2]
        if b2 is None:  # a result, not an error: report the fit search and stop there
            log.warning("no two-wave batch in %s x %d fits %s", args.fit_fractions_two, B, limit)
            return {"settings": {k: v for k, v in vars(args).items() if k != "func"},
                    "node_limit": format_size(limit_bytes), "calibration_peak_bytes":
                    calibration["node_peak_bytes"] if calibration else None,
                    "largest_batch_that_fits": largest, "fit": fit_rows, "table": [],
                    "repeats": []}
        two_steps = max(4, round(args.steps * B / (2 * b2)))  # about the same samples seen
        lrs = {1: args.lr, 2: two_wave_lr(args.lr, args.lr_scaling, B, b2)}
        repeats = []
        for repeat in range(args.repeats):
            one = _launch(args, 1, B, args.steps, limit, folder, f"one-{repeat}", lrs[1])
            two = _launch(args, 2, b2, two_steps, limit, folder, f"two-{repeat}", lrs[2])
            repeats.append({"one": one, "two": two})
        good = [r for r in repeats if r["one"]["fits"] and r["two"]["fits"]]
        if not good:
            raise RuntimeError(f"no repetition completed: {[(r['one']['status'], r['two']['status']) for r in repeats]}")
        plot_runs([("one wave", good[-1]["one"]), ("two waves", good[-1]["two"])], args.png,
                  limit_bytes=limit_bytes)
    table = []
    for key, waves, batch in (("one", 1, B), ("two", 2, b2)):
        runs = [r[key] for r in good]
        table.append({
            "waves": waves, "batch_per_process": batch, "lr": lrs[waves],
            "samples_per_step": runs[0]["samples_per_step"],
            "samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
            "vs_one_wave": statistics.median(r[key]["samples_per_s"] / r["one"]["samples_per_s"]
                                             for r in good),
            "comm_share": statistics.median(comm_share(r) or 0 for r in runs),
            "node_peak_mib": max(r["node_peak_bytes"] for r in runs) / mib,
            "node_limit_mib": limit_bytes / mib,
            "test_accuracy": statistics.median(r["test_accuracy"] for r in runs),
            "samples_seen": runs[0]["samples_seen"], "repeats": len(runs)})
    for r in good:  # the bulky per-step records stay out of the JSON
        for key in ("one", "two"):
            r[key] = {k: v for k, v in r[key].items()
                      if k not in ("ranks", "config", "node_series")}
    return {"settings": {k: v for k, v in vars(args).items() if k != "func"},
            "node_limit": format_size(limit_bytes), "calibration_peak_bytes":
            calibration["node_peak_bytes"] if calibration else None,
            "largest_batch_that_fits": largest, "fit": fit_rows, "table": table,
            "repeats": good}


def two_wave_lr(lr: float, scaling: str, one_batch: int, two_batch: int) -> float:
    """Linear scaling (Goyal et al.): the lr grows with the samples per update, here from one
    wave's B to two waves' 2 b2 per process."""
    if scaling not in ("none", "linear"):
        raise ValueError(f"--lr-scaling must be none or linear, got {scaling!r}")
    return lr * 2 * two_batch / one_batch if scaling == "linear" else lr


def _main(args) -> int:
    payload = run(args)
    print(format_table(payload["fit"], FIT_COLUMNS))
    print(f"largest batch per process that fits {payload['node_limit']} per node: "
          f"one wave {payload['largest_batch_that_fits'][1]}, two waves "
          f"{payload['largest_batch_that_fits'][2]}")
    print(format_table(payload["table"], COLUMNS))
    print(f"figure: {args.png}")
    save_if_asked(args.json, payload)
    return 0


def _fractions(text: str) -> list[float]:
    values = [float(t) for t in text.split(",") if t.strip()]
    if not values or any(not 0 < v <= 4 for v in values):
        raise ValueError(f"fractions must be numbers in (0, 4], got {text!r}")
    return values


def register(bench_subparsers) -> None:
    p = bench_subparsers.add_parser(
        "wavelet", help="Wavelet tick-tock: one wave vs two under one node memory limit")
    p.add_argument("--nodes", type=int, default=2, help="emulated nodes, one device slot each "
                   "(default 2)")
    p.add_argument("--model", default="tallmlp", help="a thinwire train model or tallmlp "
                   "(default tallmlp: activations dominate its memory)")
    p.add_argument("--batch-size", type=int, default=256, help="one wave's batch per process, "
                   "B (default 256)")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    p.add_argument("--lr-scaling", default="none", choices=["none", "linear"],
                   help="two waves' learning rate: the same (none) or scaled with the combined "
                        "batch, lr x 2 b2 / B (linear; the one-wave lr is --lr)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="linear warm-up steps of both runs (default: thinwire train's, 5%% of "
                        "the run)")
    p.add_argument("--algorithm", default="hier_allreduce", help="gradient sync (default "
                   "hier_allreduce)")
    p.add_argument("--inter-node-bandwidth", default="50mbit", help="link rate (default 50mbit)")
    p.add_argument("--node-cpus", type=float, default=0.5, help="CPU cores per node (default 0.5)")
    p.add_argument("--node-memory", default=None, help="node memory limit (default: one wave's "
                   "measured node peak at B plus --limit-margin)")
    p.add_argument("--limit-margin", type=float, default=0.05, help="(default 0.05)")
    p.add_argument("--steps", type=int, default=12, help="one wave's steps per run; two waves "
                   "run as many samples (default 12)")
    p.add_argument("--fit-steps", type=int, default=3, help="steps of a fit probe (default 3)")
    p.add_argument("--fit-fractions-one", type=_fractions, default=[1.0, 1.25],
                   help="one-wave batches tried, as fractions of B (default 1,1.25)")
    p.add_argument("--fit-fractions-two", type=_fractions, default=[1.0, 0.875, 0.75, 0.5],
                   help="two-wave batches tried, largest first (default 1,0.875,0.75,0.5)")
    p.add_argument("--repeats", type=int, default=3, help="(default 3)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run (default 900)")
    p.add_argument("--png", default="results/wavelet/wavelet.png", help="figure (default "
                   "results/wavelet/wavelet.png)")
    p.add_argument("--json", default=None, help="write the results here (default: none)")
    from thinwire.cliargs import add_declared
    from thinwire.train.settings import BY_NAME

    add_declared(p, BY_NAME["wave_turn"], help_prefix="the two-wave runs: ")
    p.set_defaults(func=_main)
