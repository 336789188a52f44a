r"""`thinwire plan`: what to run on a cluster, ranked by predicted time to target.

    thinwire plan --calibrate docs/results/sweep/mnist_results.json --calibrate-at 200mbit \
        --inter-node-bandwidth 100mbit --json results/plan.json

The step time of every candidate comes from the cost model calibrated on measured runs
(``--calibrate``: thinwire compare results, or any file `thinwire simulate --calibrate` reads);
its steps to target from a race of the same workload (``--steps-from``, default the
calibration files; an unshaped race measures them fastest, and races with other --seed values
measure their spread). See thinwire.sim.plan for what is ranked and how.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from thinwire.cliargs import integer, number
from thinwire.collectives import costs
from thinwire.output import check_output_path, format_table, write_json_atomic
from thinwire.sim.calibrate import floors_line
from thinwire.sim.network import PHASE_FORMS
from thinwire.sim.repeats import add_repeats_option

SHOWN_UNMEASURED = 6  # candidates without measured steps printed below the ranking


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="rank every candidate by predicted time to target on a described cluster",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_inputs(p)
    p.add_argument("--inter-node-bandwidth", nargs="+", action="extend", required=True,
                   metavar="RATE",
                   help="the cluster's inter-node rate(s), e.g. 100mbit 10gbit ('none': "
                        "unshaped; comma-separated or repeated); one ranking per rate")
    p.add_argument("--compute-ms", type=number(0, 1e7, low_open=True), default=None,
                   help="compute per step (forward, backward, step) measured on the cluster "
                        "(default: the calibration's, for the same cluster shape)")
    p.add_argument("--phase-form", default="max", choices=PHASE_FORMS,
                   help="how a phase's fixed cost and wire time combine (thinwire simulate)")
    p.add_argument("--measured", nargs="+", action="extend", default=None,
                   metavar="RESULTS_JSON",
                   help="races measured at the planned rates: print each ranked candidate's "
                        "measured time to target beside the prediction, and how much slower "
                        "the plan's choice ran than the measured fastest")
    p.add_argument("--algorithms", nargs="+", action="extend", default=None,
                   metavar="ALGORITHM",
                   help="rank only candidates of these algorithms (default: every one the "
                        "plan ranks; comma-separated or repeated)")
    p.add_argument("--json", default=None, help="write the plan here")
    p.set_defaults(func=main)


def parse_rates(values: list[str]) -> list[str]:
    """Link rates from --inter-node-bandwidth values (comma-separated, repeatable), each checked."""
    from thinwire.cluster.spec import parse_rate

    rates = [r.strip() for v in values for r in v.split(",") if r.strip()]
    if not rates:
        raise ValueError(f"--inter-node-bandwidth: no rate in {' '.join(values)!r}; name one or "
                         "more, e.g. 100mbit 1gbit (none: unshaped)")
    for rate in rates:
        if rate.lower() not in ("none", "unshaped"):
            parse_rate(rate, "--inter-node-bandwidth")  # names the flag and value
    return rates


def _print(plan: dict) -> None:
    spread = plan["steps_spread_over_seeds"]
    print(f"{plan['workload']}: compute {1e3 * plan['compute_s']:.1f} ms a step; steps to "
          f"target from {', '.join(plan['steps_from'])}"
          + (f" (spread over seeds up to {100 * spread:.0f}%)" if spread is not None
             else " (one seed: its spread is not measured)"))
    if plan.get("inter_efficiency") is not None:
        from thinwire import collectives
        from thinwire.sim.calibrate import paces_datagrams

        host_ns = 1e9 * (plan.get("inter_host_s_per_byte") or 0.0)
        paced = [name for name in collectives.names() if paces_datagrams(name)]
        print(f"inter-node byte: the wire at {plan['inter_efficiency']:.2f} of the nominal rate"
              + (f" plus {host_ns:.1f} ns of host time" if host_ns >= 0.05 else
                 " and no host time (fitted at 0, or held there where every calibration run "
                 "was paced by its link)")
              + (f"; {', '.join(paced)}: at the nominal rate (its sender paces its datagrams)"
                 if paced else ""))
    floors = floors_line({"cpu_floor": plan.get("cpu_floor", [])})
    if floors:
        print(f"{floors}; set_by=cpu: the step is held at it (the cores, not the link, set "
              f"its pace)")
    for one in plan["plans"]:
        ranked = [r for r in one["rows"] if r["time_to_target_s"] is not None]
        unmeasured = [r for r in one["rows"] if r["time_to_target_s"] is None]
        print(f"\nat {one['rate']}:")
        rows = [{"#": i + 1, "candidate": r["candidate"], "step_ms": 1e3 * r["step_s"],
                 "steps": r["steps"],
                 "steps_from": "measured" if r.get("steps_source") == "measured" else "between",
                 "to_target_s": r["time_to_target_s"],
                 "vs_best": r["vs_best"], "inter_MB/step": r["inter_node_mb_per_step"],
                 "set_by": "cpu" if r.get("cpu_floor_s") else ""}
                for i, r in enumerate(ranked)]
        if rows:
            print(format_table(rows, rows[0].keys()))
        else:
            print(f"no candidate ranked: none of {', '.join(plan['algorithms'])}'s candidates "
                  f"has its steps to target measured in the steps files, or between two "
                  f"measured values (give --steps-from races that ran them)")
        if unmeasured:
            shown = sorted(unmeasured, key=lambda r: r["step_s"])[:SHOWN_UNMEASURED]
            print(f"not ranked (steps to target neither measured nor between two measured "
                  f"values of its density, rank or H; {len(unmeasured)} in all, "
                  f"fastest steps first): "
                  + "; ".join(f"{r['candidate']} {1e3 * r['step_s']:.0f} ms/step"
                              for r in shown))
        if one["best"] is not None:
            print(f"best: {one['best']['candidate']}\n  emulated: {one['best']['command']['compare']}"
                  f"\n  cluster:  {one['best']['command']['train']}")
    print(f"\nbreak-even: {plan['break_even']['note']}")
    for note in plan["notes"]:
        print(f"left out: {note}")
    for warning in plan["warnings"]:
        print(f"warning: {warning}")


def _print_check(check: dict) -> None:
    print("\npredicted against measured time to target:")
    if check["rows"]:
        print(format_table(check["rows"], check["rows"][0].keys()))
    for s in check["summary"]:
        regret = "-" if s["regret"] is None else f"{100 * s['regret']:+.0f}%"
        worst = "-" if s["max_abs_error"] is None else f"{100 * s['max_abs_error']:.0f}%"
        print(f"at {s['rate']}: plan chose {s['plan_choice']}, measured fastest "
              f"{s['measured_fastest']} ({s['fastest_kind']}); the choice ran {regret} against "
              f"it; largest time-to-target error {worst}")
    cross = check.get("crossover")
    if cross:
        low, high = (b / 1e6 for b in cross["measured_between_bps"])
        predicted = "none" if cross["predicted_bps"] is None else \
            f"{cross['predicted_bps'] / 1e6:.0f} Mbit/s"
        print(f"measured crossover between {low:g} and {high:g} Mbit/s; predicted break-even "
              f"{predicted} ({'inside' if cross['predicted_between'] else 'OUTSIDE'})")


def add_plan_inputs(p: argparse.ArgumentParser) -> None:
    """What a plan is made from (`thinwire plan`, `thinwire bench seed-holdout`): the
    calibration, the steps files and the cluster's shape."""
    p.add_argument("--calibrate", nargs="+", action="extend", required=True,
                   metavar="RESULTS_JSON",
                   help="measured runs the cost model is fitted on")
    p.add_argument("--calibrate-at", default=None, metavar="RATE",
                   help="fit on the runs at this link rate only (default: all)")
    add_repeats_option(p)
    p.add_argument("--steps-from", nargs="+", action="extend", default=None,
                   metavar="RESULTS_JSON",
                   help="thinwire compare results measuring steps to target (default: "
                        "the --calibrate files)")
    p.add_argument("--workload", default=None,
                   help="the workload of the steps files to plan for (default: their only one)")
    p.add_argument("--steps-to", type=number(0, low_open=True), default=None,
                   metavar="QUALITY",
                   help="read steps to this quality (accuracy, or bits per byte) instead of "
                        "the races' target: a plan for another target; only runs that "
                        "trained past it (compare --no-stop-at-target) reach it")
    p.add_argument("--nodes", type=integer(1, costs.MAX_NODES), default=None,
                   help="nodes of the cluster (default: the calibration's)")
    p.add_argument("--ranks-per-node", type=integer(1, costs.MAX_RANKS_PER_NODE), default=None,
                   help="ranks (GPUs) per node (default: the calibration's)")


def check_plan_inputs(args) -> None:
    """Every input file exists and holds results (thinwire compare's), named by the option
    that gave it (the steps table reads --calibrate's files where --steps-from is left out,
    and would name itself), and the cluster has an inter-node link (make_plan checks the
    workload before its fit)."""
    from thinwire.sim.calibrate import result_blocks

    given = (("--calibrate", args.calibrate), ("--steps-from", args.steps_from or []),
             ("--measured", getattr(args, "measured", None) or []))
    for flag, paths in given:
        for path in paths:
            if not Path(path).exists():
                raise FileNotFoundError(f"{flag}: plan input not found: {path}")
            if not Path(path).is_file():
                raise ValueError(f"{flag}: {path} is not a file (give thinwire compare's "
                                 "results.json)")
            try:
                result_blocks(path, f"{flag} file")
            except ValueError as exc:
                message = str(exc)
                raise ValueError(message if message.startswith(flag) else
                                 f"{flag}: {message}") from None
    if args.nodes == 1:
        raise ValueError("--nodes 1: one node has no inter-node link to plan for; the plan "
                         "needs --nodes 2 or more")


def _names(values: list[str] | None) -> list[str] | None:
    """--algorithms' names (comma-separated, repeatable); None where it was not given."""
    if values is None:
        return None
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--algorithms: no algorithm in {' '.join(values)!r}; name one or "
                         "more, or leave the option out to rank every one")
    return names


def check_measured_rates(paths: list[str], measured: dict, rates: list[str]) -> None:
    """The --measured races (``measured``: their :func:`thinwire.sim.plan.measured_times`)
    hold a candidate's time at one of the planned ``rates`` at least; else there is nothing
    to check the plan against: say which rates they hold."""
    from thinwire.sim.calibrate import rate_bps

    held = {rate for rate, _ in measured}
    if not held & {rate_bps(rate) for rate in rates}:
        shown = sorted("none" if bps is None else f"{bps / 1e6:g}mbit" for bps in held)
        raise ValueError(f"--measured: {', '.join(paths)} hold no race at the planned rates "
                         f"({', '.join(rates)}); they hold {', '.join(shown) or 'no usable run'}")


def main(args) -> int:
    check_output_path(args.json, "--json")  # before the work
    check_plan_inputs(args)
    from thinwire.sim.plan import check_algorithms, make_plan

    check_algorithms(_names(args.algorithms), "--algorithms")  # before the fit
    rates = parse_rates(args.inter_node_bandwidth)
    measured = None
    if args.measured:  # read once: checked now, beside the plan after the fit
        from thinwire.sim.plan import measured_times
        measured = measured_times(args.measured)
        check_measured_rates(args.measured, measured, rates)

    plan = make_plan(args.calibrate, args.steps_from or args.calibrate, args.workload,
                     args.nodes, args.ranks_per_node, rates,
                     args.compute_ms, args.calibrate_at, args.phase_form,
                     steps_to=args.steps_to, algorithms=_names(args.algorithms),
                     repeats=args.repeats)
    _print(plan)
    plan["rows"] = plan["steps_table"]  # what docs/results.md reads, unless --measured
    if args.measured:
        from thinwire.sim.plan import check_against
        plan["check"] = check_against(plan, args.measured, measured)
        plan["rows"] = plan["check"]["summary"]  # one per rate (docs/results.md reads rows)
        _print_check(plan["check"])
    if args.json:
        write_json_atomic(args.json, plan)
        print(f"json: {args.json}")
    return 0
