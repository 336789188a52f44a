"""``thinwire bench seed-holdout``: how often a choice made from steps measured at some seeds is
right at a seed it did not see (issue 31: the error of the steps estimate, as a choice).

    thinwire bench seed-holdout --calibrate SWEEP.json --steps-from SWEEP.json S1.json ... \\
        --inter-node-bandwidth 25mbit,100mbit,200mbit,1gbit,none --json OUT.json

The plan's time to target is steps x step time, and the steps are measured once per workload at
one seed or several. Here one seed at a time is held out: each rule chooses a candidate from
the other seeds' steps, and the choice is scored at the held-out seed: its time to target there
over the fastest candidate's (both the cost model's step time times the held-out seed's
measured steps: the step-time model is the same for every rule, so this isolates the steps).
The candidates are those measured at every seed. Rules:

- ``median`` (what `thinwire plan` and auto use): the fastest by the median of the seeds' times;
- ``mean``: the fastest by their mean;
- ``least-worst-loss`` (minimax regret): the candidate whose largest loss to the fastest at the
  same seed is least over the seeds it sees.

Per (rate, held-out seed) each rule's choice and its loss; per rule the share of cases within
10% of the fastest, the worst loss and the geometric mean. Beside the rules, ``hindsight``: the
one candidate per rate that is within 10% of the fastest at the most seeds, chosen having seen
every seed, the held-out one included. No fixed choice of one candidate per rate beats it on
that count (a rule may choose differently for each held-out seed, and so could in principle);
where it too misses, the seeds' steps, not the rule, set the miss. Nothing is raced: it reads
results.
"""

from __future__ import annotations

import math
import statistics

from thinwire.bench.report import format_table, save_if_asked

WITHIN = 1.10  # a choice within 10% of the held-out seed's fastest counts as right


def _by_seed(row: dict, table_row: dict) -> dict[str, float]:
    """{seed: the candidate's time to target at that seed's steps}: the plan's time at its
    median steps moved by the steps' difference times the step time (every seed's steps lie
    past the dense warm-up, whose steps cost the same at every seed)."""
    seeds = {seed: float(statistics.median(steps))
             for seed, steps in table_row["steps_by_seed"].items()}
    return {seed: float(row["time_to_target_s"] + (steps - row["steps"]) * row["step_s"])
            for seed, steps in seeds.items()}


def least_worst_loss(times: dict[str, dict[str, float]]) -> str:
    seeds = {s for by in times.values() for s in by}
    fastest = {s: min(by[s] for by in times.values()) for s in seeds}
    worst = {name: max(by[s] / fastest[s] for s in by) for name, by in times.items()}
    return min(worst, key=lambda name: (worst[name], statistics.median(times[name].values())))


RULES = {
    "median": lambda times: min(times, key=lambda n: statistics.median(times[n].values())),
    "mean": lambda times: min(times, key=lambda n: statistics.mean(times[n].values())),
    "least-worst-loss": least_worst_loss,
}


def hindsight(times: dict[str, dict[str, float]]) -> str:
    """The candidate within WITHIN of the fastest at the most of ``times``' seeds (ties: the
    smaller geometric mean of its losses), every seed seen."""
    seeds = {s for by in times.values() for s in by}
    fastest = {s: min(by[s] for by in times.values()) for s in seeds}

    def score(name):
        losses = [times[name][s] / fastest[s] for s in seeds]
        return (-sum(loss <= WITHIN for loss in losses), statistics.fmean(map(math.log, losses)))
    return min(times, key=score)


SCORED = (*RULES, "hindsight")  # the rules, and the best fixed choice per rate


def holdout_rows(plan: dict) -> list[dict]:
    """One row per (rate, held-out seed): each rule's choice and its loss there."""
    table = {r["candidate"]: r for r in plan["steps_table"]}
    rows = []
    for one in plan["plans"]:
        ranked = [r for r in one["rows"] if r["time_to_target_s"] is not None]
        seeds = set().union(*(table[r["candidate"]]["steps_by_seed"] for r in ranked)) \
            if ranked else set()
        full = {r["candidate"]: _by_seed(r, table[r["candidate"]]) for r in ranked
                if set(table[r["candidate"]]["steps_by_seed"]) == seeds}
        if len(seeds) < 2 or len(full) < 2:
            continue
        best_in_hindsight = hindsight(full)
        for held in sorted(seeds, key=int):
            seen = {name: {s: t for s, t in by.items() if s != held} for name, by in full.items()}
            there = {name: by[held] for name, by in full.items()}
            fastest = min(there, key=there.get)
            row = {"rate": one["rate"], "held_out_seed": int(held), "fastest": fastest,
                   "candidates": len(full)}
            for rule, pick in RULES.items():
                chosen = pick(seen)
                row[rule] = chosen
                row[f"{rule}_loss"] = there[chosen] / there[fastest]
            row["hindsight"] = best_in_hindsight
            row["hindsight_loss"] = there[best_in_hindsight] / there[fastest]
            rows.append(row)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for rule in SCORED:
        losses = [r[f"{rule}_loss"] for r in rows]
        out.append({"rule": rule, "cases": len(losses),
                    "within_10pct": sum(loss <= WITHIN for loss in losses),
                    "worst_loss": max(losses),
                    "geomean_loss": math.exp(statistics.fmean(map(math.log, losses)))})
    return out


def run(args) -> int:
    from thinwire.sim.plan import make_plan
    from thinwire.sim.plan_cli import check_plan_inputs, parse_rates

    rates = parse_rates([args.inter_node_bandwidth])
    check_plan_inputs(args)
    plan = make_plan(args.calibrate, args.steps_from or args.calibrate, args.workload,
                     args.nodes, args.ranks_per_node, rates, calibrate_at=args.calibrate_at,
                     with_break_even=False, steps_to=args.steps_to, repeats=args.repeats)
    rows = holdout_rows(plan)
    if not rows:
        raise ValueError("--steps-from: fewer than two seeds measured for two candidates or "
                         "more; race the workload at other --seed values first")
    result = {"workload": plan["workload"], "rows": rows, "summary": summary(rows),
              "calibrate": args.calibrate, "steps_from": args.steps_from or args.calibrate,
              "steps_to": args.steps_to,
              "rates": rates}
    print(format_table(rows, ["rate", "held_out_seed", "fastest", *(
        c for rule in SCORED for c in (rule, f"{rule}_loss"))]))
    print()
    print(format_table(result["summary"], ["rule", "cases", "within_10pct", "worst_loss",
                                           "geomean_loss"]))
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    from thinwire.sim.plan_cli import add_plan_inputs

    parser = bench_subparsers.add_parser(
        "seed-holdout", help="how often a choice from some seeds' steps to target is right at "
                             "a seed left out (issue 31)")
    add_plan_inputs(parser)  # the same inputs as thinwire plan's
    parser.add_argument("--inter-node-bandwidth", required=True,
                        help="link rates, comma-separated (e.g. 25mbit,1gbit,none)")
    parser.add_argument("--json", default=None, help="write the rows and summary here")
    parser.set_defaults(func=run)
