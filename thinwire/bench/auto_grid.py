"""``thinwire bench auto-grid``: issue 31's targets, read from ``thinwire compare`` races of
``auto`` beside fixed choices (every cell: a workload, a cluster shape, a link rate).

    thinwire bench auto-grid --results R1.json R2.json ... --json docs/results/auto/grid.json

Per cell: every fixed choice's time to target, the fastest of them, auto's time, its ratio to
the fastest and what auto chose. Over the cells: the share where auto was within 10% of the
fastest (target: >= 90%), its worst ratio (target: <= 1.25), and the geometric mean of each
algorithm's time to target over the cells (target: auto's the lowest). A run that missed the
target counts at its budget in the geometric means (a lower bound of its time: the mean
flatters it) and is marked. Nothing here measures: it reads results.

``--by-setting`` names each fixed run by its setting as well (``powersgd r=1``, ``hitopk
d=0.01``, ``powersgd r=4 start=0`` where PowerSGD compressed before PyTorch's step 2), so that
races of one method at several ranks or densities (separate ``compare`` runs,
``--powersgd-rank``/``--density``) give each its own geometric mean: the issue's "PowerSGD at
its best rank, hitopk at its best fixed density". Without auto in the results, each cell's row
names the fastest setting.

``--over-seeds`` reads races of the same cells at several seeds (one ``compare --seed S`` each):
every (cell, seed) is judged on its own, and each cell again by every algorithm's median time
over its seeds (a miss counts as slower than any time: a median that falls on a miss is a miss).
Where a workload's steps to target vary by seed more than its candidates differ (the LM), one
seed's fastest is partly the luck of that seed, which no choice made before the run can see;
the medians say which choice is fastest to expect.

Where auto switched during a race (a changing link), its row also says at which step, what
its checks cost the run, and its median step time after the switch beside the switched-to
algorithm's own run over the same steps (:func:`after_switch`), and both runs' steps to target:
a switch that costs convergence, not pace, shows there.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from thinwire.bench.pace_trigger import check_seconds
from thinwire.bench.report import format_table, save_if_asked
from thinwire.sim.steps import steps_to_target
from thinwire.train.grad_sync import POWERSGD_START_ITER
from thinwire.train.run_groups import rate_bps  # "none" (unshaped) sorts last

WITHIN = 1.10    # auto within 10% of the fastest fixed choice...
SHARE = 0.90     # ...in at least this share of the cells
WORST = 1.25     # and never more than 25% slower


def label(run: dict, by_setting: bool = False) -> str:
    """The run's name in the tables: its algorithm, and with ``by_setting`` PowerSGD's rank or
    a sparse algorithm's density too."""
    from thinwire import collectives

    algorithm = run["algorithm"]
    if not by_setting or algorithm == "auto":
        return algorithm
    if algorithm == "powersgd" and run.get("powersgd_rank") is not None:
        start = (run.get("setting") or {}).get("powersgd_start_iter", POWERSGD_START_ITER)
        # a start other than PyTorch's is a candidate of its own (its steps differ)
        return f"powersgd r={run['powersgd_rank']}" + \
            ("" if start == POWERSGD_START_ITER else f" start={start}")
    if algorithm in collectives.names() and collectives.get(algorithm).sparse and \
            run.get("density") is not None:
        return f"{algorithm} d={run['density']:g}"
    return algorithm


def _cells(paths: list[str], by_setting: bool = False, by_seed: bool = False) -> dict:
    """{(workload, shape, rate): {label: run}} over every results file (the last file's
    run wins where two hold the same cell and label: a rerun replaces); with ``by_seed`` the
    key ends with the run's seed."""
    cells: dict = {}
    for path in paths:
        results = json.loads(Path(path).read_text())
        setting = results.get("setting") or {}
        shape = f"{setting.get('nodes')}x{setting.get('ranks_per_node')}"
        for run in results.get("runs", []):
            key = (setting.get("workload"), shape, cell_rate(run, setting))
            if by_seed:
                key += (run.get("seed", setting.get("seed")),)
            cells.setdefault(key, {})[label(run, by_setting)] = run
    return cells


def _median_time(runs: list[dict]) -> tuple[float | None, bool]:
    """The median time to target over ``runs`` (one seed each), a miss counting as slower
    than any time; (the median, or the budget where it falls on a miss; whether it did)."""
    times = [(math.inf if missed or t is None else t) for t, missed in map(_time, runs)]
    median = statistics.median(times)
    if math.isinf(median):
        return max((r.get("budget_s") or r.get("train_time_s") or 0.0) for r in runs), True
    return median, False


def over_seeds(cells: dict) -> dict:
    """{(workload, shape, rate): {label: run}} from cells keyed by seed too: each label's run
    stands for its median over the seeds at which every label of the cell ran (the seeds
    listed in its ``seeds``; auto's choices at them joined by '/')."""
    grouped: dict = {}
    for (workload, shape, rate, seed), runs in cells.items():
        grouped.setdefault((workload, shape, rate), {})[seed] = runs
    out: dict = {}
    for key, by_seed in grouped.items():
        labels = set().union(*by_seed.values())
        seeds = sorted((s for s, runs in by_seed.items() if labels <= set(runs)), key=str)
        if not seeds:
            continue
        cell = out.setdefault(key, {})
        for name in labels:
            runs = [by_seed[s][name] for s in seeds]
            median, missed = _median_time(runs)
            merged = {"algorithm": runs[0]["algorithm"], "seeds": seeds,
                      "status": "missed" if missed else "ok",
                      "time_to_target_s": None if missed else median, "budget_s": median}
            if name == "auto":
                choices = [_choice(r.get("auto") or {}) for r in runs]
                bounds = {str((r.get("auto") or {}).get("probe", {}).get("bound_by"))
                          for r in runs}
                verdicts = {str((r.get("fidelity") or {}).get("verdict")) for r in runs}
                merged["auto"] = {"choice": "/".join(dict.fromkeys(choices)),
                                  "probe": {"bound_by": "/".join(sorted(bounds))}}
                merged["fidelity"] = {"verdict": "/".join(sorted(verdicts))}
            cell[name] = merged
    return out


def fastest_row(key: tuple, runs: dict) -> dict:
    """A cell without auto: every run's time and the fastest of them."""
    workload, shape, rate = key
    times = {a: _time(r) for a, r in runs.items()}
    reached = {a: t for a, (t, missed) in times.items() if not missed and t is not None}
    fastest = min(reached, key=reached.get) if reached else None
    return {"workload": workload, "shape": shape, "rate": rate, "fastest": fastest,
            "fastest_s": reached.get(fastest),
            **{f"{a}_s": (None if missed else t) for a, (t, missed) in sorted(times.items())}}


def _time(run: dict) -> tuple[float | None, bool]:
    """(time to target, or the budget where it missed; whether it missed)."""
    if run.get("status") == "ok" and run.get("time_to_target_s") is not None:
        return float(run["time_to_target_s"]), False
    budget = run.get("budget_s") or run.get("train_time_s")
    return (float(budget) if budget else None), True


def _choice(record: dict) -> str:
    """What auto chose, short: the algorithm, and PowerSGD's start where it is not PyTorch's."""
    choice = (record.get("choice") or "?").split(" ")[0]
    start = (record.get("settings") or {}).get("powersgd_start_iter")
    return choice if start in (None, POWERSGD_START_ITER) else f"{choice} start={start}"


def _median_pace_ms(run: dict, after_step: int) -> float | None:
    """The median milliseconds a step of ``run``'s evaluation intervals that begin after
    ``after_step`` (None: no such interval)."""
    curve = run.get("curve") or []
    paces = [1000 * (b["train_time_s"] - a["train_time_s"]) / (b["step"] - a["step"])
             for a, b in zip(curve, curve[1:]) if b["step"] > a["step"] > after_step]
    return statistics.median(paces) if paces else None


def after_switch(auto: dict, runs: dict) -> dict:
    """Where auto switched: the step, what its checks cost the run (probe, plan and switch),
    and its median step time after the switch (from the interval after the one that held the
    check) beside the median of the switched-to algorithm's own run over the same steps,
    where the cell raced it (one run of that algorithm): a switch that leaves the new
    synchronisation slower than its own run shows here. A re-planned run that did not switch
    has the columns, empty; one not re-planned has none."""
    replanning = (auto.get("auto") or {}).get("replanning")
    if not replanning:  # not re-planned (or an older record): no columns
        return {}
    switches = replanning.get("switches") or []
    if not switches:  # re-planned without a switch: the columns, empty
        return dict.fromkeys(SWITCH_COLUMNS)
    step = switches[0]["step"]
    to = str(switches[0].get("to") or "").split(" ")[0]
    own = [r for r in runs.values() if r.get("algorithm") == to]
    return {"switched_at": step,
            "checks_s": sum(check_seconds(auto).values()),
            "after_switch_ms": _median_pace_ms(auto, step),
            "own_after_switch_ms": _median_pace_ms(own[0], step) if len(own) == 1 else None,
            "steps": _steps(auto), "own_steps": _steps(own[0]) if len(own) == 1 else None}


def _steps(run: dict) -> int | None:
    """The run's steps to its target (its first evaluation there; None: it missed)."""
    if not run.get("metric") or run.get("target") is None:
        return None
    return steps_to_target(run.get("curve") or [], run["metric"], run["target"])


def cell_row(key: tuple, runs: dict) -> dict | None:
    workload, shape, rate, *seed = key
    auto = runs.get("auto")
    fixed = {a: _time(r) for a, r in runs.items() if a != "auto"}
    reached = {a: t for a, (t, missed) in fixed.items() if not missed and t is not None}
    if auto is None or not fixed:
        return None
    auto_s, auto_missed = _time(auto)
    fastest = min(reached, key=reached.get) if reached else None
    if fastest is None:  # no fixed choice reached the target: nothing to be within 10% of
        ratio = None
    else:  # auto missing where a fixed choice reached it: infinitely slower
        ratio = math.inf if auto_missed else auto_s / reached[fastest]
    record = auto.get("auto") or {}
    return {"workload": workload, "shape": shape, "rate": rate,
            **({"seed": seed[0]} if seed else {}),
            **({"seeds": ",".join(map(str, auto["seeds"]))} if "seeds" in auto else {}),
            "auto_s": None if auto_missed else auto_s,
            "auto_choice": _choice(record),
            "fastest": fastest, "fastest_s": reached.get(fastest),
            "vs_fastest": None if ratio is None or math.isinf(ratio) else ratio,
            "auto_missed": auto_missed,
            "within_10pct": ratio is not None and ratio <= WITHIN,
            "probe_bound_by": (record.get("probe") or {}).get("bound_by"),
            "fidelity": (auto.get("fidelity") or {}).get("verdict"),
            **after_switch(auto, runs),
            **{f"{a}_s": (None if missed else t) for a, (t, missed) in sorted(fixed.items())}}


def summary(cells: dict, rows: list[dict]) -> list[dict]:
    """One row per algorithm: its geometric mean time over the cells every algorithm ran (a
    miss at its budget), the misses; auto's row also the targets' shares."""
    algorithms = sorted({a for runs in cells.values() for a in runs})
    common = [k for k, runs in cells.items() if all(a in runs for a in algorithms)]
    out = []
    for algorithm in algorithms:
        times = [_time(cells[k][algorithm]) for k in common]
        usable = [t for t, _ in times if t]
        out.append({"algorithm": algorithm, "cells": len(common),
                    "missed": sum(missed for _, missed in times),
                    "geomean_s": math.exp(sum(map(math.log, usable)) / len(usable))
                    if usable and len(usable) == len(times) else None})
    judged = [r for r in rows if r["fastest"] is not None]  # a miss of auto's counts
    auto = next((r for r in out if r["algorithm"] == "auto"), None)
    if auto is not None and judged:
        others = [r["geomean_s"] for r in out if r["algorithm"] != "auto"]
        share = sum(r["within_10pct"] for r in judged) / len(judged)
        worst = max(math.inf if r["auto_missed"] else r["vs_fastest"] for r in judged)
        auto.update({
            "judged_cells": len(judged), "within_10pct_share": share,
            "worst_vs_fastest": worst if math.isfinite(worst) else None,
            "meets_share": share >= SHARE, "meets_worst": worst <= WORST,
            "lowest_geomean": auto["geomean_s"] is not None and all(
                o is None or auto["geomean_s"] < o for o in others)})
    return out


ROW_COLUMNS = ["workload", "shape", "rate", "auto_s", "auto_choice", "fastest", "fastest_s",
               "vs_fastest", "probe_bound_by", "fidelity"]


SWITCH_COLUMNS = ["switched_at", "checks_s", "after_switch_ms", "own_after_switch_ms", "steps",
                  "own_steps"]


def cell_rate(run: dict, setting: dict) -> str:
    """The cell's rate: the run's link rate, and where the link changed during the race (a
    bandwidth schedule, a node failure) what changed it: such a race is a cell of its own."""
    resources = setting.get("resources") or {}
    rate = str(run.get("inter_node_bandwidth"))
    for key, word in (("bandwidth_schedule", "schedule"), ("failure_schedule", "fail")):
        if resources.get(key):
            rate += f" {word} {resources[key]}"
    return rate


def _rate_order(rate: str) -> tuple:
    """By the starting link rate's bit/s, then what changed it (a fixed rate first)."""
    first, _, changed = rate.partition(" ")
    return rate_bps(first), changed


def _ordered(cells: dict) -> list:
    return sorted(cells.items(), key=lambda kv: (kv[0][0] or "", kv[0][1],
                                                 _rate_order(kv[0][2]),
                                                 *(str(k) for k in kv[0][3:])))


def _judged(cells: dict, columns: list[str]) -> dict:
    """The rows and summary of cells holding auto, printed: the targets' verdict."""
    rows = [r for r in (cell_row(k, runs) for k, runs in _ordered(cells)) if r is not None]
    if not rows:
        raise ValueError("--results hold no cell with an auto run and a fixed choice (give "
                         "--by-setting to compare settings without auto)")
    result = {"rows": rows, "summary": summary(cells, rows)}
    if any(r.get("switched_at") is not None for r in rows):
        columns = columns + SWITCH_COLUMNS
    print(format_table(rows, columns))
    print()
    print(format_table(result["summary"], ["algorithm", "cells", "missed", "geomean_s"]))
    auto = next((r for r in result["summary"] if "within_10pct_share" in r), None)
    if auto is not None:
        print(f"\nauto within 10% of the fastest in {auto['within_10pct_share']:.0%} of "
              f"{auto['judged_cells']} cells (target >= {SHARE:.0%}: "
              f"{'met' if auto['meets_share'] else 'missed'}); worst "
              f"{auto['worst_vs_fastest'] or 'a miss'}x (target <= {WORST}: "
              f"{'met' if auto['meets_worst'] else 'missed'}); lowest geometric mean: "
              f"{'yes' if auto['lowest_geomean'] else 'no'}")
    return result


def judge(args) -> dict:
    """The cells and the summary (what ``--json`` writes), printed as two tables; with
    ``over_seeds`` the (cell, seed) rows first, then the cells by median over the seeds."""
    for path in args.results:
        if not Path(path).is_file():
            raise ValueError(f"--results: {path} is not a file")
    by_setting = bool(getattr(args, "by_setting", False))
    by_seed = bool(getattr(args, "over_seeds", False))
    cells = _cells(args.results, by_setting, by_seed)
    has_auto = any("auto" in runs for runs in cells.values())
    if by_setting and not by_seed and not has_auto:
        rows = [fastest_row(k, runs) for k, runs in _ordered(cells)]
        result = {"rows": rows, "summary": summary(cells, []), "results": list(args.results)}
        print(format_table(rows, ["workload", "shape", "rate", "fastest", "fastest_s"]))
        print()
        print(format_table(result["summary"], ["algorithm", "cells", "missed", "geomean_s"]))
        save_if_asked(args.json, result)
        return result
    targets = {"within": WITHIN, "share": SHARE, "worst": WORST}
    if by_seed:
        print("every (cell, seed):")
        per_seed = _judged(cells, ROW_COLUMNS[:3] + ["seed"] + ROW_COLUMNS[3:])
        print("\nevery cell, each algorithm's median time over its seeds:")
        medians = _judged(over_seeds(cells), ROW_COLUMNS[:3] + ["seeds"] + ROW_COLUMNS[3:])
        result = {**medians, "per_seed_rows": per_seed["rows"],
                  "per_seed_summary": per_seed["summary"], "targets": targets,
                  "results": list(args.results)}
    else:
        result = {**_judged(cells, ROW_COLUMNS), "targets": targets,
                  "results": list(args.results)}
    save_if_asked(args.json, result)
    return result


def run(args) -> int:
    judge(args)
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "auto-grid", help="issue 31's targets from compare races of auto beside fixed choices")
    parser.add_argument("--results", nargs="+", required=True, metavar="RESULTS_JSON",
                        help="thinwire compare results.json files (one per workload and shape)")
    parser.add_argument("--by-setting", action="store_true",
                        help="name fixed runs by PowerSGD's rank and a sparse algorithm's "
                             "density too (races of one method at several settings)")
    parser.add_argument("--over-seeds", action="store_true",
                        help="results of the same cells at several seeds: judge every (cell, "
                             "seed), then every cell by each algorithm's median over its seeds")
    parser.add_argument("--json", default=None, help="write the table and summary here")
    parser.set_defaults(func=run)
