"""``thinwire bench ddp-auto-replan``: ``thinwire.ddp``'s auto, in a training script of its own,
against fixed choices under a link that changes (issue 31: adapt when the link changes, in the
library as in ``thinwire train``).

    thinwire bench ddp-auto-replan --plan docs/results/plan/mnist_cal_200mbit.json \\
        --fixed "hitopk d=0.05 mstopk-carry values=fp16" ddp-fp16 \\
        --bandwidth-schedule 0s:1gbit,20s:25mbit --json OUT.json

Runs ``examples/ddp_auto_replan.py`` on the emulated cluster once with auto (``register(...,
"auto")`` and ``replan(every_s=...)`` after each step) and once per fixed candidate of the plan,
one after the other, under the same schedule (counted from each job's start). A row per run:
the seconds from registering the hook to the last step (``train_s``: auto's first probe, its
checks, its pilot and its switches included), that over auto's (``vs_auto``), its first and
last choice and, for auto, the candidates its pilot measured, its checks (the pilot's
included) and where the link made it switch. The script is given ``--pilot`` (an ``--example``
of your own must take it). The script's model is an MLP of the plan's
model's size on random data: the race measures the steps' time, not a learning curve.
"""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

from thinwire.bench.report import format_table, save_if_asked
from thinwire.cliargs import integer

# in a source checkout; elsewhere give --example
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_auto_replan.py"
COLUMNS = ("run", "status", "train_s", "vs_auto", "first_choice", "piloted", "final_choice",
           "checks", "switched_at_step", "switched_at_s")


def _one(spec, example: Path, plan: str, steps: int, every_s: float, pilot: int,
         fixed: str | None, timeout_s: float) -> dict:
    from thinwire.cluster import run as cluster_run

    with tempfile.TemporaryDirectory() as out:
        record_path = Path(out) / "record.json"
        argv = [str(example), "--plan", plan, "--steps", str(steps), "--replan-every-s",
                str(every_s), "--pilot", str(pilot), "--json", str(record_path)] + \
            (["--fixed", fixed] if fixed else [])
        log = io.StringIO()
        status = cluster_run(spec, argv, timeout_s=timeout_s, output=log)
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    if status == 0 and not record:  # it ended well but left no record: not a result
        status = 1
    checks = record.get("checks", [])
    # the link's switches (a pilot's are its measuring, counted apart)
    switches = [c for c in checks if "switched_to" in c and not c.get("pilot")]
    piloted = [c["measured"] for c in checks if c.get("pilot")]
    return {"run": fixed or "auto", "status": status, "train_s": record.get("train_s"),
            "first_choice": record.get("first_choice"),
            "piloted": " / ".join(piloted) if piloted else None,
            "final_choice": record.get("final_choice"),
            "checks": len(record.get("checks", [])),
            "switched_at_step": switches[0]["step"] if switches else None,
            "switched_at_s": switches[0]["at_s"] if switches else None,
            "record": record, "log_tail": None if status == 0 else log.getvalue()[-3000:]}


def run(args) -> int:
    from thinwire import plan_choice
    from thinwire.cluster import ClusterSpec
    from thinwire.cluster.spec import parse_bandwidth_schedule

    example = Path(args.example)
    if not example.is_file():
        raise FileNotFoundError(f"--example {example} is not a file (examples/"
                                "ddp_auto_replan.py of a source checkout)")
    plan = plan_choice.load(args.plan)  # checked before anything launches
    for name in args.fixed:
        try:
            plan_choice.candidate_hook(plan, name)
        except ValueError as exc:
            raise ValueError(f"--fixed: {exc} ({args.plan})") from None
    parse_bandwidth_schedule(args.bandwidth_schedule, "--bandwidth-schedule")  # checked
    first_rate = args.bandwidth_schedule.split(",")[0].partition(":")[2].strip()
    spec = ClusterSpec(nodes=plan["nodes"], ranks_per_node=plan["ranks_per_node"],
                       inter_node_bandwidth=first_rate,
                       bandwidth_schedule=args.bandwidth_schedule)
    rows = [_one(spec, example, args.plan, args.steps, args.replan_every_s, args.pilot, fixed,
                 args.timeout) for fixed in [None, *args.fixed]]
    auto_s = rows[0]["train_s"]
    for row in rows:
        row["vs_auto"] = row["train_s"] / auto_s if row["train_s"] and auto_s else None
    print(format_table(rows, COLUMNS))
    save_if_asked(args.json, {"rows": rows, "setting": {
        "plan": args.plan, "steps": args.steps, "replan_every_s": args.replan_every_s,
        "pilot": args.pilot,
        "bandwidth_schedule": args.bandwidth_schedule, "nodes": plan["nodes"],
        "ranks_per_node": plan["ranks_per_node"]}})
    return max(row["status"] for row in rows)


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "ddp-auto-replan", help="thinwire.ddp's auto in a script of its own against fixed "
                                "choices under a changing link (issue 31)")
    parser.add_argument("--plan", required=True, help="thinwire plan --json's file")
    parser.add_argument("--fixed", nargs="*", default=[], metavar="CANDIDATE",
                        help="the plan's candidates to race as fixed choices")
    parser.add_argument("--bandwidth-schedule", required=True, metavar="TIME:RATE,...",
                        help="the inter-node rate over each job's time")
    parser.add_argument("--steps", type=integer(1), default=200, help="steps each run trains")
    parser.add_argument("--replan-every-s", type=float, default=10.0,
                        help="auto's seconds between checks (sooner where the pace moved)")
    parser.add_argument("--pilot", type=integer(0), default=2,
                        help="auto's runners-up measured on the script after each plan "
                             "choice (0: none)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    parser.add_argument("--example", default=str(EXAMPLE),
                        help="the script it runs (default: this checkout's "
                             "examples/ddp_auto_replan.py)")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.set_defaults(func=run)
