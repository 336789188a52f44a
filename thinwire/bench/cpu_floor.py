"""``thinwire bench cpu-floor``: what the ranks' CPU time a step tells the cost model (issue 31).

    thinwire bench cpu-floor --results SWEEP.json [SWEEP2.json ...] [--repeats median] \\
        --json OUT.json

Reads `thinwire compare` sweeps whose runs recorded their CPU a step (``cpu_ms_per_iter``, the
ranks' process CPU summed; ``host_cores``). Two tables:

- per algorithm and rate, the CPU a step, its share of what the cores could give in the step
  (CPU / (cores x step): near 1, the host set the pace) and the CPU at each rate over the CPU
  at the fastest: near 1, the host work is the same whatever the link, as a floor carried from
  one rate to another assumes;
- per calibration rate, the held-out algorithms within 20% (`thinwire simulate --calibrate-at`,
  max form) with the floor and without it, and the misses of each.

Nothing is raced: it reads results.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from thinwire.bench.report import add_sweep_inputs, format_table, save_if_asked

WITHIN = 0.20  # the bound on a held-out step's error


def cpu_rows(runs) -> list[dict]:
    """Per (algorithm, rate): the median CPU a step over the runs that measured it, its share
    of the cores' time in the median step, and its ratio to the same algorithm's at the
    fastest shaped rate."""
    groups = defaultdict(list)
    for run in runs:
        if run.cpu_s is not None and run.cores and run.inter_bps is not None:
            groups[(run.algorithm, run.inter_bps)].append(run)
    medians = {}
    for key, group in groups.items():
        cpu_s = statistics.median(r.cpu_s for r in group)
        step_s = statistics.median(r.iteration_s for r in group)
        medians[key] = (cpu_s, step_s, group[0].cores, len(group))
    rows = []
    for (algorithm, bps), (cpu_s, step_s, cores, count) in sorted(medians.items()):
        fastest = max(rate for name, rate in medians if name == algorithm)
        rows.append({"algorithm": algorithm, "rate_mbit": bps / 1e6, "runs": count,
                     "step_ms": 1e3 * step_s, "cpu_ms": 1e3 * cpu_s, "cores": cores,
                     "cores_share": cpu_s / (cores * step_s),
                     "cpu_vs_fastest": cpu_s / medians[(algorithm, fastest)][0]})
    return rows


def holdout_rows(paths, runs, repeats: str) -> list[dict]:
    """Per calibration rate (each shaped rate of ``runs``, the runs ``paths`` hold), with and
    without the floor: algorithms within 20% and misses."""
    from thinwire.sim.holdout import holdout, misses

    rates = sorted({r.inter_bps for r in runs if r.inter_bps is not None})
    rows = []
    for bps in rates:
        at = f"{int(bps)}bit"
        for floor in (True, False):
            result = holdout(paths, at, repeats=repeats, form="max", cpu_floor=floor)
            errors, missed, text = misses(result, WITHIN)
            rows.append({"calibrate_at_mbit": bps / 1e6, "cpu_floor": floor,
                         "within_20pct": len(errors) - len(missed), "algorithms": len(errors),
                         "misses": missed, "missed": text,
                         "wire_bound": result["wire_bound"],
                         "max_abs_error": {n: round(e, 4) for n, e in sorted(errors.items())}})
    return rows


def run(args) -> int:
    from thinwire.sim.calibrate import read_runs
    from thinwire.sim.repeats import check_repeats

    check_repeats(args.repeats)
    runs, _ = read_runs(args.results)
    cpu = cpu_rows(runs)
    if not cpu:
        raise ValueError("--results: no shaped run recorded its CPU a step (cpu_ms_per_iter and "
                         "host_cores; thinwire train records them since 2b3fad3): race again")
    held = holdout_rows(args.results, runs, args.repeats)
    print(format_table(cpu, ["algorithm", "rate_mbit", "runs", "step_ms", "cpu_ms", "cores",
                             "cores_share", "cpu_vs_fastest"]))
    print()
    print(format_table(held, ["calibrate_at_mbit", "cpu_floor", "within_20pct", "algorithms",
                              "missed"]))
    save_if_asked(args.json, {"results": args.results, "repeats": args.repeats, "cpu": cpu,
                              "holdout": held})
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "cpu-floor", help="the ranks' CPU a step by rate, and the held-out step times with the "
                          "cost model's CPU floor and without it (issue 31)")
    add_sweep_inputs(parser, "the tables")
    parser.set_defaults(func=run)
