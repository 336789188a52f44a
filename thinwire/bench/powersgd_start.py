"""``thinwire bench powersgd-start``: PowerSGD's time to target by the step it starts
compressing at (issue 31).

    thinwire bench powersgd-start --results R1.json R2.json ... --json OUT.json

PyTorch's PowerSGD all-reduces its first steps densely (it needs ``start_powerSGD_iter >= 2``
with error feedback: its error memory is keyed by bucket index, which DDP's bucket rebuild after
the first step reshuffles). thinwire's hook carries the memory through the rebuild by parameter
(``thinwire.train.grad_sync.carry_error``), so ``--powersgd-start-iter 0`` compresses from the
first step. What that saves is the dense steps' time; what it may cost is steps to target
(error feedback starts from a cold model). This reads compare results holding PowerSGD runs
(each race one start; race the starts at the same seeds and rates) and tabulates, per (rate,
seed), each start's time to target and steps, and its ratio to the start the others are
compared with (``--baseline``, PyTorch's 2). Nothing is raced: it reads results.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from thinwire.bench.report import format_table, save_if_asked


def powersgd_runs(paths: list[str]) -> list[dict]:
    """Every finished PowerSGD run of ``paths``: rate, seed, start, time to target, steps."""
    rows = []
    for path in paths:
        results = json.loads(Path(path).read_text(encoding="utf-8"))
        for run in results.get("runs", []):
            if run.get("algorithm") != "powersgd":
                continue
            setting = {**(results.get("setting") or {}), **(run.get("setting") or {})}
            if "powersgd_start_iter" not in setting:
                raise ValueError(f"--results {path}: its PowerSGD run does not record "
                                 "powersgd_start_iter")
            rows.append({"rate": str(run.get("inter_node_bandwidth")),
                         "seed": run.get("seed", setting.get("seed")),
                         "start_iter": int(setting["powersgd_start_iter"]),
                         "time_to_target_s": run.get("time_to_target_s"),
                         "steps": run.get("steps") if run.get("time_to_target_s") else None,
                         "source": path})
    return rows


def compared(rows: list[dict], baseline: int) -> list[dict]:
    """``rows`` with ``vs_baseline``: the time to target over the baseline start's at the
    same rate and seed (None where either missed the target or the baseline was not run)."""
    base = {(r["rate"], r["seed"]): r["time_to_target_s"] for r in rows
            if r["start_iter"] == baseline}
    out = []
    for r in rows:
        b = base.get((r["rate"], r["seed"]))
        ratio = r["time_to_target_s"] / b if b and r["time_to_target_s"] else None
        out.append(dict(r, vs_baseline=ratio))
    return sorted(out, key=lambda r: (r["rate"], r["seed"], r["start_iter"]))


def summary(rows: list[dict]) -> list[dict]:
    """Per (rate, start): seeds, misses, the median time, steps and ratio to the baseline."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["rate"], r["start_iter"]), []).append(r)

    def median(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None
    return [{"rate": rate, "start_iter": start, "seeds": len(group),
             "missed": sum(r["time_to_target_s"] is None for r in group),
             "median_time_s": median(r["time_to_target_s"] for r in group),
             "median_steps": median(r["steps"] for r in group),
             "median_vs_baseline": median(r["vs_baseline"] for r in group)}
            for (rate, start), group in sorted(groups.items())]


def run(args) -> int:
    rows = compared(powersgd_runs(args.results), args.baseline)
    if not rows:
        raise ValueError("--results: no PowerSGD run in these files")
    result = {"results": args.results, "baseline": args.baseline, "rows": rows,
              "summary": summary(rows)}
    print(format_table(rows, ["rate", "seed", "start_iter", "time_to_target_s", "steps",
                              "vs_baseline"]))
    print()
    print(format_table(result["summary"], ["rate", "start_iter", "seeds", "missed",
                                           "median_time_s", "median_steps",
                                           "median_vs_baseline"]))
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "powersgd-start", help="PowerSGD's time to target by the step it starts compressing "
                               "at (issue 31)")
    parser.add_argument("--results", nargs="+", required=True, metavar="RESULTS_JSON",
                        help="compare results holding PowerSGD runs")
    parser.add_argument("--baseline", type=int, default=2,
                        help="the start the others are compared with (PyTorch's least: 2)")
    parser.add_argument("--json", default=None, help="write the rows and summary here")
    parser.set_defaults(func=run)
