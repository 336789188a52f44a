"""``thinwire bench phase-forms``: which way of joining a phase's fixed cost and its wire time
holds out best on recorded sweeps (issue 31: "the larger of the two, or whatever the
measurements support").

    thinwire bench phase-forms --results SWEEP.json [SWEEP2.json ...] [--repeats median] \\
        [--forms sum,max] --json OUT.json

For each form (``thinwire.sim.network.PHASE_FORMS``) and each shaped rate of the sweeps, the
cost model is fitted at that rate alone and predicts the others (`thinwire simulate
--calibrate-at`). Two counts per (form, calibration rate): the algorithms whose every held-out
step is within 20% (the issue's target) and the held-out (algorithm, rate) pairs within 20%;
with the median and mean of the held-out errors, and a total row per form.

Nothing is raced: it reads results.
"""

from __future__ import annotations

import statistics

from thinwire.bench.report import add_sweep_inputs, format_table, save_if_asked

WITHIN = 0.20  # the bound on a held-out step's error
COLUMNS = ("form", "calibrate_at_mbit", "algorithms_within", "algorithms", "pairs_within",
           "pairs", "median_error", "mean_error", "missed")


def form_rows(paths, rates: list[float], forms: list[str], repeats: str) -> list[dict]:
    """One row per (form, calibration rate), then one total row per form (rate None)."""
    from thinwire.sim.holdout import holdout, misses

    rows = []
    for form in forms:
        errors_of_form = []
        for bps in rates:
            result = holdout(paths, f"{int(bps)}bit", repeats=repeats, form=form)
            by_algorithm, missed, text = misses(result, WITHIN)
            errors = [float(abs(row["error_calibrated"])) for row in result["held_out"]
                      if row.get("error_calibrated") is not None]
            errors_of_form += errors
            rows.append({"form": form, "calibrate_at_mbit": bps / 1e6,
                         "algorithms_within": len(by_algorithm) - len(missed),
                         "algorithms": len(by_algorithm),
                         "pairs_within": sum(1 for e in errors if e <= WITHIN),
                         "pairs": len(errors),
                         "median_error": statistics.median(errors),
                         "mean_error": statistics.fmean(errors), "misses": missed,
                         "missed": text})
        mine = [r for r in rows if r["form"] == form]
        rows.append({"form": form, "calibrate_at_mbit": None,
                     "algorithms_within": sum(r["algorithms_within"] for r in mine),
                     "algorithms": sum(r["algorithms"] for r in mine),
                     "pairs_within": sum(r["pairs_within"] for r in mine),
                     "pairs": sum(r["pairs"] for r in mine),
                     "median_error": statistics.median(errors_of_form),
                     "mean_error": statistics.fmean(errors_of_form), "misses": {},
                     "missed": "(all rates)"})
    return rows


def check_forms(text: str) -> list[str]:
    from thinwire.sim.network import PHASE_FORMS

    forms = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in forms if f not in PHASE_FORMS]
    if not forms or unknown:
        raise ValueError(f"--forms {text!r}: name one or more of {', '.join(PHASE_FORMS)}, "
                         f"comma-separated")
    return forms


def run(args) -> int:
    from thinwire.sim.calibrate import read_runs
    from thinwire.sim.repeats import check_repeats

    check_repeats(args.repeats)
    forms = check_forms(args.forms)
    runs, _ = read_runs(args.results)
    rates = sorted({r.inter_bps for r in runs if r.inter_bps is not None})
    if len(rates) < 2:
        raise ValueError(f"--results: the runs hold {len(rates)} shaped rate(s); a holdout "
                         f"needs at least two (a sweep of several --inter-node-bandwidth)")
    rows = form_rows(args.results, rates, forms, args.repeats)
    print(format_table(rows, list(COLUMNS)))
    save_if_asked(args.json, {"results": args.results, "repeats": args.repeats,
                              "forms": forms, "rows": rows})
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "phase-forms", help="the cost model held out by rate under each phase form (a phase's "
                            "fixed cost and wire time summed, or the larger of the two) (issue 31)")
    add_sweep_inputs(parser, "the table")
    parser.add_argument("--forms", default="sum,max",
                        help="the forms to compare, comma-separated (default sum,max)")
    parser.set_defaults(func=run)
