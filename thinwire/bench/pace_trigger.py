"""``thinwire bench pace-trigger``: ``--algorithm auto``'s pace trigger replayed over the curves
of recorded races (issue 31).

    thinwire bench pace-trigger --results R1.json R2.json ... --json OUT.json

auto probes the link again (:mod:`thinwire.train.replan`) on its clock and where the pace of
steps moved by more than ``--replan-share``; each probe costs training time (about 0.4 s at
25 Mbit/s), so a trigger that fires on the host's noise costs as much as one that misses a
change. This feeds each recorded auto run's evaluation curve to the real
``Replanner.due`` (its clock off: the pace alone), with the time the run's own checks and
switches took taken out of the curve, for each pair of interval counts asked for (the
reference's, and how many intervals in a row must move past the share), and counts what
fires: on runs whose link never changed (a noise check is pure cost) and on runs under a
``--bandwidth-schedule`` (where the first check after the fall is the one that matters; after
a recorded switch the curve is another algorithm's pace, so what a rule fires there is not
what it would have met). The replay has no clock: each rule reproduces the pace checks
recorded by the code that had it, not the clock's.
Nothing is raced: it reads results.
"""

from __future__ import annotations

import json
from pathlib import Path

from thinwire.bench.report import format_table, save_if_asked


def cleaned_curve(run: dict) -> list[dict]:
    """The run's curve with the seconds its re-checks and switches took taken out of every
    later point (they count as training time in the run; a replay asks about the pace alone)."""
    replanning = (run.get("auto") or {}).get("replanning") or {}
    spent: dict[int, float] = {}
    for check in replanning.get("checks", []):  # a check that planned: probe and plan
        took = check.get("probe_and_plan_s") or check.get("probe_s", 0.0)
        spent[check["step"]] = spent.get(check["step"], 0.0) + took
    for switch in replanning.get("switches", []):
        spent[switch["step"]] = spent.get(switch["step"], 0.0) + switch.get("switch_s", 0.0)
    out, taken = [], 0.0
    for point in run.get("curve") or []:
        out.append({"step": point["step"], "train_time_s": point["train_time_s"] - taken})
        taken += spent.get(point["step"], 0.0)
    return out


def replay(curve: list[dict], share: float, reference: int, confirm: int) -> list[int]:
    """The steps at which the pace trigger (``reference`` and ``confirm`` intervals) fires
    along ``curve``, a check restarting it each time (the loop asks after every evaluation but
    the last)."""
    from thinwire.train.config import TrainConfig
    from thinwire.train.replan import Replanner

    cfg = TrainConfig(algorithm="auto", plan_from="-", replan_every_s=float("inf"),
                      replan_share=share)
    planner = Replanner(cfg, {"probe": {"goodput_Bps": 1.0}, "choice": "-"})
    planner.reference_intervals, planner.confirm_intervals = reference, confirm
    fired = []
    for end in range(1, len(curve)):  # none at the last evaluation: the run ends there
        if planner.due(curve[:end]):
            fired.append(curve[end - 1]["step"])
            planner.restart_pace()
    return fired


def replayed_runs(paths: list[str], rules: list[tuple[int, int]]) -> list[dict]:
    rows = []
    for path in paths:
        results = json.loads(Path(path).read_text(encoding="utf-8"))
        setting = results.get("setting") or {}
        schedule = (setting.get("resources") or {}).get("bandwidth_schedule")
        for run in results.get("runs", []):
            if run.get("algorithm") != "auto" or not run.get("curve"):
                continue
            replanning = (run.get("auto") or {}).get("replanning")
            if replanning is None:
                continue  # re-planning off in this run: nothing to compare with
            curve = cleaned_curve(run)
            row = {"source": Path(path).name, "workload": setting.get("workload"),
                   "rate": str(run.get("inter_node_bandwidth")),
                   "schedule": bool(schedule),
                   "recorded": [c["step"] for c in replanning.get("checks", [])]}
            for reference, confirm in rules:
                row[f"ref{reference}_confirm{confirm}"] = replay(
                    curve, replanning.get("share", 0.3), reference, confirm)
            rows.append(row)
    return rows


def summary(rows: list[dict], rules: list[tuple[int, int]]) -> list[dict]:
    """Per rule: the checks fired on steady links and under schedules."""
    out = []
    for reference, confirm in rules:
        key = f"ref{reference}_confirm{confirm}"
        out.append({"rule": key, "reference_intervals": reference,
                    "confirm_intervals": confirm,
                    "steady_runs": sum(not r["schedule"] for r in rows),
                    "fired_steady": sum(len(r[key]) for r in rows if not r["schedule"]),
                    "scheduled_runs": sum(r["schedule"] for r in rows),
                    "fired_scheduled": sum(len(r[key]) for r in rows if r["schedule"])})
    return out


def _rule(text: str) -> tuple[int, int]:
    try:
        reference, confirm = (int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--rules: each rule is REFERENCE,CONFIRM (two integers >= 1), got "
                         f"{text!r}") from None
    if reference < 1 or confirm < 1:
        raise ValueError(f"--rules: each rule is REFERENCE,CONFIRM (two integers >= 1), got "
                         f"{text!r}")
    return reference, confirm


def run(args) -> int:
    rules = [_rule(text) for text in args.rules]
    rows = replayed_runs(args.results, rules)
    if not rows:
        raise ValueError("--results: no auto run with re-planning in these files")
    result = {"results": args.results, "rows": rows, "summary": summary(rows, rules)}
    columns = ["source", "rate", "schedule", "recorded"] + \
        [f"ref{r}_confirm{c}" for r, c in rules]
    print(format_table([{k: (" ".join(map(str, v)) if isinstance(v, list) else v)
                         for k, v in row.items()} for row in rows], columns))
    print()
    print(format_table(result["summary"], ["rule", "steady_runs", "fired_steady",
                                           "scheduled_runs", "fired_scheduled"]))
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "pace-trigger", help="auto's pace trigger replayed over recorded races' curves: the "
                             "checks each rule fires (issue 31)")
    parser.add_argument("--results", nargs="+", required=True, metavar="RESULTS_JSON",
                        help="compare results holding auto runs with re-planning")
    parser.add_argument("--rules", nargs="+", default=["1,1", "2,2"],
                        metavar="REFERENCE,CONFIRM",
                        help="interval counts to replay: the reference's and how many in a row "
                             "must move past the share (default: 1,1 the old rule, 2,2 now)")
    parser.add_argument("--json", default=None, help="write the rows and summary here")
    parser.set_defaults(func=run)
