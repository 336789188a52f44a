"""``thinwire bench steps-between``: how well steps to target read between two measured
candidates (:mod:`thinwire.sim.steps_estimate`) match a race of the candidate itself.

    thinwire bench steps-between --steps-from SWEEP.json D001.json D002.json ... --json OUT.json

Every measured candidate with measured neighbours on both sides of its density, PowerSGD rank
or DiLoCo H is estimated from those two alone and set beside its own measured steps, per
workload and cluster shape in the files. Nothing is raced: it reads results. (The plan ranks
a candidate it never raced by such an estimate; this is that estimate's error.)
"""

from __future__ import annotations

import statistics

from thinwire.bench.report import format_table, save_if_asked


def holdout_all(paths) -> list[dict]:
    """The holdout rows of every (workload, cluster shape) of ``paths``."""
    from thinwire.sim.steps import read_table
    from thinwire.sim.steps_estimate import holdout

    table, _ = read_table(paths)
    rows = []
    for work, entries in sorted(table.items(), key=lambda item: item[0].describe()):
        for row in holdout({cand: entry.estimate for cand, entry in entries.items()}):
            rows.append({"workload": work.describe(), **row})
    return rows


def summary(rows: list[dict]) -> dict:
    errors = [abs(r["error"]) for r in rows]
    return {"cases": len(rows), "median_abs_error": statistics.median(errors),
            "worst_abs_error": max(errors), "within_10pct": sum(e <= 0.10 for e in errors),
            "within_20pct": sum(e <= 0.20 for e in errors)}


def run(args) -> int:
    rows = holdout_all(args.steps_from)
    if not rows:
        raise ValueError("--steps-from: no measured candidate has measured neighbours on both "
                         "sides of its density, rank or H; race at least three values of one")
    result = {"steps_from": args.steps_from, "rows": rows, "summary": summary(rows)}
    print(format_table(rows, ["workload", "candidate", "measured_steps", "estimated_steps",
                              "error"]))
    s = result["summary"]
    print(f"\n{s['cases']} cases: median |error| {s['median_abs_error']:.1%}, worst "
          f"{s['worst_abs_error']:.1%}; within 10%: {s['within_10pct']}, within 20%: "
          f"{s['within_20pct']}")
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "steps-between", help="the error of steps to target read between two measured "
                              "densities, ranks or H (issue 31)")
    parser.add_argument("--steps-from", nargs="+", required=True, metavar="RESULTS_JSON",
                        help="thinwire compare results files")
    parser.add_argument("--json", default=None, help="write the rows and summary here")
    parser.set_defaults(func=run)
