"""``thinwire bench pace-trigger``: ``--algorithm auto``'s pace trigger replayed over the curves
of recorded races (issue 31).

    thinwire bench pace-trigger --results R1.json R2.json ... --json OUT.json

auto probes the link again (:mod:`thinwire.train.replan`) on its clock and where the pace of
steps moved by more than ``--replan-share``; each probe costs training time (about 0.4 s at
25 Mbit/s), so a trigger that fires on the host's noise costs as much as one that misses a
change. This feeds each recorded auto run's evaluation curve to the real ``Replanner.due``
(its clock too, each check restarting the trigger as in the run), with the time the run's
own checks and switches took taken out of the curve, for each pair of interval counts asked
for (the reference's, and how many intervals in a row must move past the share), and counts
what fires: on runs whose link never changed (a noise check is pure cost) and on runs under a
bandwidth or failure schedule (where the first check after the change is the one that
matters; after a recorded switch the curve is another algorithm's pace, so what a rule fires
there is not what it would have met). The summary counts the pace's checks (the noise is
theirs) and the runs whose recorded checks a rule reproduces step for step (the clock runs
on the cleaned curve, so a check near its period may fall one evaluation apart).
Nothing is raced: it reads results.
"""

from __future__ import annotations

import json
from pathlib import Path

from thinwire.bench.report import format_table, save_if_asked


def check_seconds(run: dict) -> dict[int, float]:
    """The seconds auto's re-checks (and switches) took the run, by step: each check's
    ``took_s`` where recorded (all of it), else its probe and plan and the switch's own time
    (older records; a check whose probe failed recorded no time)."""
    replanning = (run.get("auto") or {}).get("replanning") or {}
    spent: dict[int, float] = {}
    for check in replanning.get("checks", []):
        took = check.get("took_s")
        if took is None:
            took = check.get("probe_and_plan_s") or check.get("probe_s", 0.0)
            took += sum(s.get("switch_s", 0.0) for s in replanning.get("switches", [])
                        if s["step"] == check["step"])
        spent[check["step"]] = spent.get(check["step"], 0.0) + took
    return spent


def cleaned_curve(run: dict) -> list[dict]:
    """The run's curve with the seconds its re-checks and switches took
    (:func:`check_seconds`) taken out of every later point (they count as training time in
    the run; a replay asks about the pace alone)."""
    spent = check_seconds(run)
    out, taken = [], 0.0
    for point in run.get("curve") or []:
        out.append({"step": point["step"], "train_time_s": point["train_time_s"] - taken})
        taken += spent.get(point["step"], 0.0)
    return out


def replay(curve: list[dict], share: float, reference: int, confirm: int,
           every_s: float = float("inf")) -> list[tuple[int, str]]:
    """The checks the trigger (``reference`` and ``confirm`` intervals, the clock every
    ``every_s`` seconds) makes along ``curve``: (step, "pace" or "clock"), each restarting it
    as a check does (the loop asks after every evaluation but the last)."""
    from thinwire.train.config import TrainConfig
    from thinwire.train.replan import Replanner

    cfg = TrainConfig(algorithm="auto", plan_from="-", replan_every_s=every_s,
                      replan_share=share)
    planner = Replanner(cfg, {"probe": {"goodput_Bps": 1.0}, "choice": "-"})
    planner.reference_intervals, planner.confirm_intervals = reference, confirm
    fired = []
    for end in range(1, len(curve)):  # none at the last evaluation: the run ends there
        now = curve[end - 1]
        clock = now["train_time_s"] - planner.checked_at_s >= every_s
        if planner.due(curve[:end]):
            fired.append((now["step"], "clock" if clock else "pace"))
            planner.restart(now["train_time_s"])
    return fired


def replayed_runs(paths: list[str], rules: list[tuple[int, int]]) -> list[dict]:
    rows = []
    for path in paths:
        results = json.loads(Path(path).read_text(encoding="utf-8"))
        setting = results.get("setting") or {}
        resources = setting.get("resources") or {}
        # a link that changes while the run trains: rates, or nodes lost and back
        schedule = resources.get("bandwidth_schedule") or resources.get("failure_schedule")
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
                fired = replay(curve, replanning.get("share", 0.3), reference, confirm,
                               replanning.get("every_s") or float("inf"))
                row[f"ref{reference}_confirm{confirm}"] = [s for s, _ in fired]
                row[f"ref{reference}_confirm{confirm}_pace"] = \
                    [s for s, why in fired if why == "pace"]
            rows.append(row)
    return rows


def summary(rows: list[dict], rules: list[tuple[int, int]]) -> list[dict]:
    """Per rule: the pace checks fired on steady links and under schedules (the clock's are
    the same for every rule but where a pace check moved it), and how many runs' recorded
    checks the rule reproduces (all checks, the clock's too)."""
    out = []
    for reference, confirm in rules:
        key = f"ref{reference}_confirm{confirm}"
        out.append({"rule": key, "reference_intervals": reference,
                    "confirm_intervals": confirm,
                    "steady_runs": sum(not r["schedule"] for r in rows),
                    "fired_steady": sum(len(r[key + "_pace"]) for r in rows
                                        if not r["schedule"]),
                    "scheduled_runs": sum(r["schedule"] for r in rows),
                    "fired_scheduled": sum(len(r[key + "_pace"]) for r in rows
                                           if r["schedule"]),
                    "reproduces_recorded": sum(r[key] == r["recorded"] for r in rows)})
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
                                           "scheduled_runs", "fired_scheduled",
                                           "reproduces_recorded"]))
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
