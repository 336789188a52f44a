"""``thinwire bench intra-probe``: does the plan predict better from the intra-node rate auto
probed than from the calibration's fitted one?

    thinwire bench intra-probe --plan-from SWEEP.json [--plan-steps-from S.json ...] \\
        --results GRID1.json GRID2.json ... --json OUT.json

For every ``auto`` run in ``--results`` that recorded an intra-node probe, the plan is made
with the fit's intra-node bandwidth and with the probe's (whatever the probe's trust; the
constants fitted against the fit's rate fitted again, as auto does:
:func:`thinwire.sim.plan.with_probed_intra`), at auto's compute scale. Each fixed candidate
raced beside it (same file, same rate) has its measured step set beside both predictions at
the rate it raced at; each plan's choice, made at the rate auto planned at, is set beside the
measured times to target of the cell. Nothing
is raced: it reads results. (The emulator's nodes are the calibration's nodes: this measures
whether the probe pins the intra-node rate better than the fit, not a cluster whose insides
differ from the calibration's.)
"""

from __future__ import annotations

import statistics

from thinwire.bench.report import format_table, save_if_asked


def _fixed_runs(block: dict, rate) -> dict:
    """{candidate label: run} of the fixed runs of ``block`` at ``rate`` that finished."""
    from thinwire.sim.steps import candidate_of, chooses, run_config

    setting = block.get("setting") or {}
    found = {}
    for raw in block.get("runs", []):
        if raw.get("status") != "ok" or chooses(raw.get("algorithm")) or \
                raw.get("inter_node_bandwidth") != rate:
            continue
        _, _, cfg = run_config(setting, raw)
        found[candidate_of(cfg).label()] = raw
    return found


def _changing(run: dict) -> bool:
    """A run under a bandwidth schedule or a node failure: its mean step is no one rate's."""
    resources = (run.get("setting") or {}).get("resources") or {}
    return bool(resources.get("bandwidth_schedule") or resources.get("failure_schedule"))


def _plans(plan_from, steps_from, auto_run, fitted, rates: list) -> list[dict]:
    """The plan at each of ``rates`` (rates compare names, or bit/s) on ``auto_run``'s
    cluster, with auto's compute scale, from ``fitted``: one plan, one reading of the steps."""
    from thinwire.sim.plan import make_plan

    plan = make_plan(plan_from, steps_from, None, auto_run["nodes"],
                     auto_run["world_size"] // auto_run["nodes"], rates, fitted=fitted,
                     with_break_even=False,
                     compute_scale=(auto_run["auto"].get("compute") or {}).get("scale", 1.0))
    return plan["plans"]


def rows_for(plan_from, steps_from, results) -> tuple[list[dict], list[dict]]:
    """(per fixed candidate beside an auto run: measured and both predicted steps; per auto
    run: both plans' choices and their measured times)."""
    from thinwire.output import read_json
    from thinwire.sim.plan import calibrated, with_probed_intra
    from thinwire.sim.probed_links import intra_from_probe

    fitted = calibrated(list(plan_from), None, "max")
    steps_from = list(plan_from) + list(steps_from)  # as auto reads steps
    steps_rows, choice_rows = [], []
    for path in results:
        block = read_json(path, "measured results (thinwire compare)")
        for auto_run in block.get("runs", []):
            intra = ((auto_run.get("auto") or {}).get("probe") or {}).get("intra_node")
            if auto_run.get("algorithm") != "auto" or auto_run.get("status") != "ok" or \
                    not intra or intra.get("goodput_Bps") is None or _changing(auto_run) \
                    or auto_run["auto"].get("planned_at_bps") is None:  # resumed, unplanned
                continue
            rate = auto_run["inter_node_bandwidth"]
            fixed = _fixed_runs(block, rate)
            # the probe's rate whatever its trust (the bench asks what its figure does), the
            # constants fitted against the fit's rate fitted again, as auto does
            probed_fit, _ = with_probed_intra(plan_from, fitted, dict(intra, bound_by="link"))
            # the steps at the rate the fixed runs raced at (the model's error alone); the
            # choices at the rate auto planned at (its inter-node probe's)
            rates = [rate, auto_run["auto"]["planned_at_bps"]]
            fit_at_rate, fit = _plans(plan_from, steps_from, auto_run, fitted, rates)
            probe_at_rate, probed = _plans(plan_from, steps_from, auto_run, probed_fit, rates)
            by_fit = {r["candidate"]: r for r in fit_at_rate["rows"]}
            by_probe = {r["candidate"]: r for r in probe_at_rate["rows"]}
            for label, run in sorted(fixed.items()):
                if label not in by_fit or not run.get("iter_ms"):
                    continue
                measured = run["iter_ms"] / 1e3
                steps_rows.append({
                    "results": str(path), "rate": rate, "seed": run.get("seed"),
                    "candidate": label, "measured_step_s": float(measured),
                    "fit_step_s": float(by_fit[label]["step_s"]),
                    "probe_step_s": float(by_probe[label]["step_s"]),
                    "fit_error": float(by_fit[label]["step_s"] / measured - 1),
                    "probe_error": float(by_probe[label]["step_s"] / measured - 1)})
            reached = {k: r["time_to_target_s"] for k, r in fixed.items()
                       if r.get("time_to_target_s") is not None}
            fastest = min(reached.values()) if reached else None

            def measured_vs_fastest(choice):
                t = reached.get(choice)
                return None if t is None or not fastest else t / fastest
            fit_choice = fit["best"]["candidate"] if fit["best"] else None
            probe_choice = probed["best"]["candidate"] if probed["best"] else None
            # auto's rule (probed_links): the probe's rate where it measured the link
            rule_choice = probe_choice if intra_from_probe(
                fitted[0], intra)[1]["source"] == "probe" else fit_choice
            choice_rows.append({
                "results": str(path), "rate": rate, "seed": auto_run.get("seed"),
                "probed_intra_GBps": float(intra["goodput_Bps"]) / 1e9,
                "fitted_intra_GBps": float(fitted[0]["intra_bandwidth_Bps"]) / 1e9,
                "probe_bound_by": intra.get("bound_by"),
                "auto_chose": auto_run["auto"].get("choice"),
                "fit_choice": fit_choice, "probe_choice": probe_choice,
                "rule_choice": rule_choice,
                "fit_choice_vs_fastest": measured_vs_fastest(fit_choice),
                "probe_choice_vs_fastest": measured_vs_fastest(probe_choice),
                "rule_choice_vs_fastest": measured_vs_fastest(rule_choice)})
    return steps_rows, choice_rows


def summary(steps_rows: list[dict], choice_rows: list[dict]) -> dict:
    def stats(key):
        errors = [abs(r[key]) for r in steps_rows]
        return {"median_abs": statistics.median(errors), "worst_abs": max(errors),
                "within_20pct": sum(e <= 0.20 for e in errors)}
    return {"steps": len(steps_rows), "fit": stats("fit_error"),
            "probe": stats("probe_error"),
            "auto_runs": len(choice_rows),
            "choices_differ": sum(r["fit_choice"] != r["probe_choice"] for r in choice_rows),
            "rule_choices_differ": sum(r["fit_choice"] != r["rule_choice"]
                                       for r in choice_rows)}


def run(args) -> int:
    steps_rows, choice_rows = rows_for(args.plan_from, args.plan_steps_from or [],
                                       args.results)
    if not steps_rows:
        raise ValueError("--results: no auto run with an intra-node probe beside a fixed "
                         "candidate the plan ranks (race auto with them in one compare)")
    result = {"plan_from": args.plan_from, "plan_steps_from": args.plan_steps_from or [],
              "results": args.results, "rows": steps_rows, "choices": choice_rows,
              "summary": summary(steps_rows, choice_rows)}
    result["summary_rows"] = [dict(result["summary"][side], intra_rate=side)  # as a table
                              for side in ("fit", "probe")]
    print(format_table(steps_rows, ["rate", "seed", "candidate", "measured_step_s",
                                    "fit_error", "probe_error"]))
    print()
    print(format_table(choice_rows, ["rate", "seed", "probed_intra_GBps", "probe_bound_by",
                                     "fit_choice", "rule_choice", "fit_choice_vs_fastest",
                                     "rule_choice_vs_fastest"]))
    s = result["summary"]
    print(f"\nstep error, fit's intra rate ({s['fit']['median_abs']:.1%} median, "
          f"{s['fit']['worst_abs']:.1%} worst) against the probe's "
          f"({s['probe']['median_abs']:.1%}, {s['probe']['worst_abs']:.1%}); auto's choice "
          f"(the probe's rate where it measured the link) differs in "
          f"{s['rule_choices_differ']} of {s['auto_runs']} cells (the probe's rate everywhere: "
          f"{s['choices_differ']})")
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "intra-probe", help="the plan's step predictions from the probed intra-node rate "
                            "against the fitted one (issue 31)")
    parser.add_argument("--plan-from", nargs="+", required=True, metavar="RESULTS_JSON",
                        help="the calibration races (auto's --plan-from)")
    parser.add_argument("--plan-steps-from", nargs="*", default=[], metavar="RESULTS_JSON",
                        help="further races the plan reads steps from (auto's "
                             "--plan-steps-from)")
    parser.add_argument("--results", nargs="+", required=True, metavar="RESULTS_JSON",
                        help="compare results holding auto runs beside fixed candidates")
    parser.add_argument("--json", default=None, help="write the rows and summary here")
    parser.set_defaults(func=run)
