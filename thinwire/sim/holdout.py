"""Out-of-sample check of the calibrated simulator: fit on the runs at one link rate, predict the
iteration time of the runs at every other rate of the sweep, report the error per algorithm.
DiLoCo runs among them are held out the same way (rows ``diloco H=...``): DiLoCo's own cost is
fitted on its runs at the calibration rate (:mod:`thinwire.sim.diloco_fit`).

    thinwire simulate --calibrate results/compare/mnist/results.json --calibrate-at 200mbit

The fit (:func:`thinwire.sim.calibrate.fit`) holds one compute time per setting, and a setting
includes its link rate, so a held-out run's compute time is not among the fitted ones. It is
taken, per held-out run, from

* ``calibrated``: the fitted compute time of the calibration setting with the same cluster and
  model (the model's compute does not depend on the link), or
* ``probe``: the run's own compute-only probe (``compute_ms_per_iter``, measured before training
  without any communication, so it is known before the run's steps are), where it has one.

Both are reported: on a shared machine the compute time moves between runs by more than the
communication does, and the probe carries that run's load into the prediction.

What one rate cannot determine is said, not hidden: each inter-node parameter (goodput ratio,
per-message latency) is moved by ``SENSITIVITY`` and the largest change of the calibration
runs' predictions is compared with that of the held-out ones. A parameter that moves the
calibration runs by less than ``IDENTIFIED`` is not determined by them (for ddp at a fast rate
its all-reduce hides behind the backward pass); its value then comes from the fit's prior
(:data:`thinwire.sim.calibrate.PRIOR_EFFICIENCY`), and the held-out change says how much of the
prediction rests on that assumption.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from thinwire.sim.calibrate import (DILOCO_APART, Run, rate_bps, reindexed, fit, mode_name,
                                    floors_line, overlap_modes, predict, read_runs,
                                    scales_json, wire_bound_algorithms)
from thinwire.sim.diloco_fit import fit_extra, placed_on, predicted_step, read_diloco_runs
from thinwire.sim.repeats import check_repeats, median_of_repeats

COMPUTE_SOURCES = ("calibrated", "probe")
SENSITIVITY = 0.8   # each inter-node parameter scaled by this factor
IDENTIFIED = 0.02   # ... must move some calibration run's prediction by at least this much


def _held_out_prediction(run: Run, params: dict, train: list[Run], compute_s: float,
                         overlap: bool) -> float:
    """Predicted iteration seconds of ``run`` with ``compute_s`` as its setting's compute."""
    # the fitted rates stay relative to the calibration's compute, whatever this run's is
    extended = dict(params, compute_s=list(params["compute_s"]) + [compute_s],
                    reference_compute_s=min(params["compute_s"]))
    placed = dataclasses.replace(run, setting_index=len(params["compute_s"]))
    return predict(placed, extended, overlap)["iteration_s"]


def holdout(paths, calibrate_at: str, overlap: str = "hooks", repeats: str = "each",
            form: str = "sum", cpu_floor: bool = True) -> dict:
    """Fit on the runs at ``calibrate_at`` (a rate: "200mbit", or "none" for unshaped runs),
    predict the others; rows per held-out run and the largest error per algorithm.
    ``repeats``: "each" run on its own, or the "median" of the repetitions of a run.
    ``form``: how a phase's fixed cost and wire time combine (``sim.network.PHASE_FORMS``);
    ``cpu_floor``: take the runs' measured CPU floors (:func:`calibrate.cpu_floors`)."""
    modes = overlap_modes(overlap)
    check_repeats(repeats)
    rate = rate_bps(calibrate_at)
    runs, skipped = read_runs(paths)
    if repeats == "median":
        runs = median_of_repeats(runs)
    train = reindexed([r for r in runs if r.inter_bps == rate])
    held = [r for r in runs if r.inter_bps != rate]
    rates = sorted({r.inter_bps or 0.0 for r in runs})
    if not train:
        raise ValueError(f"--calibrate-at {calibrate_at}: no run at that rate (the runs' rates "
                         f"in bits/s: {rates}; 0 = unshaped)")
    if not held:
        raise ValueError(f"--calibrate-at {calibrate_at}: every run is at that rate, nothing "
                         f"is left to predict out of sample (give a sweep of several rates)")
    (params, sse), mode = min(((fit(train, m, form, cpu_floor=cpu_floor), m) for m in modes),
                              key=lambda f: f[0][1])
    fitted_compute = {}
    for run in train:
        fitted_compute[(run.nodes, run.ranks_per_node, run.layers_key)] = \
            params["compute_s"][run.setting_index]
    rows = []
    for run in held:
        key = (run.nodes, run.ranks_per_node, run.layers_key)
        if key not in fitted_compute:
            skipped.append(f"{run.source}: {run.algorithm} at {run.inter_bps} bits/s: no run "
                           f"of its cluster and model at the calibration rate")
            continue
        row = {"algorithm": run.algorithm, "inter_node_bandwidth_bps": run.inter_bps,
               "measured_s": run.iteration_s, "measured_compute_s": run.compute_s}
        for source in COMPUTE_SOURCES:
            compute_s = fitted_compute[key] if source == "calibrated" else run.compute_s
            if compute_s is None:
                row[f"predicted_s_{source}"] = row[f"error_{source}"] = None
                continue
            predicted = _held_out_prediction(run, params, train, compute_s, mode)
            row[f"predicted_s_{source}"] = predicted
            row[f"error_{source}"] = predicted / run.iteration_s - 1
        rows.append(row)
    diloco = _diloco_rows(paths, rate, params, train, fitted_compute, skipped)
    rows += diloco["rows"]
    per_algorithm = defaultdict(dict)
    for source in COMPUTE_SOURCES:
        for row in rows:
            error = row[f"error_{source}"]
            if error is not None:
                best = per_algorithm[row["algorithm"]].get(source)
                per_algorithm[row["algorithm"]][source] = max(abs(error), best or 0.0)
    in_sample = [abs(predict(r, params, mode)["iteration_s"] / r.iteration_s - 1) for r in train]
    kept = [r for r in held if (r.nodes, r.ranks_per_node, r.layers_key) in fitted_compute]
    sensitivity = _sensitivity(params, train, kept, fitted_compute, mode)
    return {"calibrate_at": calibrate_at, "calibrate_at_bps": rate, "repeats": repeats,
            "overlap": mode_name(mode), "phase_form": form, "sum_sq_residuals": sse,
            "fitted": {k: (list(map(float, v)) if k == "compute_s"
                           else scales_json(v) if k == "bytes_scale"
                           else scales_json(v, "floor_x_compute") if k == "cpu_floor"
                           else dict(v) if k == "step_extra_s" else float(v))
                       for k, v in params.items() if k != "phase_form"},
            "in_sample_max_abs_error": max(in_sample), "held_out": rows,
            "rows": [{"algorithm": name, "calibrate_at": calibrate_at, "phase_form": form,
                      **{f"max_abs_error_{source}": errors.get(source)
                         for source in COMPUTE_SOURCES}}
                     for name, errors in sorted(per_algorithm.items())],
            "max_abs_error_by_algorithm": {a: dict(v) for a, v in per_algorithm.items()},
            "sensitivity": sensitivity, "skipped": skipped,
            # no fixed cost per step fitted for these: every calibration run mostly wire
            "wire_bound": wire_bound_algorithms(train, params, mode),
            "diloco_extra": diloco["extra"], "diloco_in_sample_max_abs_error": diloco["in_sample"]}


def misses(result: dict, within: float) -> tuple[dict, dict, str]:
    """A :func:`holdout` result judged against a bound on the error: (each algorithm's largest
    held-out error, calibrated compute; the algorithms past ``within``, rounded; those as a
    line, "-" where none)."""
    worst = {name: float(errs["calibrated"])
             for name, errs in result["max_abs_error_by_algorithm"].items()
             if errs.get("calibrated") is not None}
    missed = {name: round(e, 3) for name, e in sorted(worst.items()) if e > within}
    return worst, missed, ", ".join(f"{name} {e:.0%}" for name, e in missed.items()) or "-"


def _diloco_rows(paths, rate, params: dict, train: list[Run], fitted_compute: dict,
                 skipped: list) -> dict:
    """DiLoCo runs held out as the others are: DiLoCo's own cost fitted on its runs at the
    calibration rate (:mod:`thinwire.sim.diloco_fit`, after the per-step fit, unchanged), then
    each DiLoCo run at another rate predicted at its own share of outer steps (each run on its
    own: ``repeats="median"`` groups the per-step runs only)."""
    found, notes = read_diloco_runs(paths)
    # read_runs noted every DiLoCo run as not per-step; those held out here are not skipped
    skipped[:] = [n for n in skipped if not n.endswith(DILOCO_APART)] + notes
    if not found:
        return {"rows": [], "extra": None, "in_sample": None}
    at_rate = [d for d in found if d.run.inter_bps == rate]
    extra = fit_extra(at_rate, train, params)
    with_extra = dict(params, diloco_extra=extra) if extra else params
    in_sample = [abs(predicted_step(d, with_extra) / d.run.iteration_s - 1)
                 for d in placed_on(at_rate, train)]
    rows = []
    for d in found:
        if d.run.inter_bps == rate:
            continue
        key = (d.run.nodes, d.run.ranks_per_node, d.run.layers_key)
        if key not in fitted_compute:
            skipped.append(f"{d.run.source}: diloco H={d.sync_every} at {d.run.inter_bps} "
                           f"bits/s: no run of its cluster and model at the calibration rate")
            continue
        row = {"algorithm": f"diloco H={d.sync_every}", "inter_node_bandwidth_bps":
               d.run.inter_bps, "measured_s": d.run.iteration_s,
               "measured_compute_s": d.run.compute_s}
        for source in COMPUTE_SOURCES:
            compute_s = fitted_compute[key] if source == "calibrated" else d.run.compute_s
            if compute_s is None:
                row[f"predicted_s_{source}"] = row[f"error_{source}"] = None
                continue
            extended = dict(with_extra, compute_s=list(params["compute_s"]) + [compute_s],
                            reference_compute_s=min(params["compute_s"]))
            placed = dataclasses.replace(d, run=dataclasses.replace(
                d.run, setting_index=len(params["compute_s"])))
            predicted = predicted_step(placed, extended)
            row[f"predicted_s_{source}"] = predicted
            row[f"error_{source}"] = predicted / d.run.iteration_s - 1
        rows.append(row)
    return {"rows": rows, "extra": extra, "in_sample": max(in_sample) if in_sample else None}


def _sensitivity(params: dict, train: list[Run], held: list[Run], fitted_compute: dict,
                 overlap: bool) -> dict:
    """Per inter-node parameter: the largest relative change of the calibration runs' and of
    the held-out runs' predicted iteration times when the parameter is scaled by SENSITIVITY."""
    def times(p):
        inside = [predict(r, p, overlap)["iteration_s"] for r in train]
        outside = [_held_out_prediction(r, p, train, fitted_compute[
            (r.nodes, r.ranks_per_node, r.layers_key)], overlap) for r in held]
        return inside, outside

    base_in, base_out = times(params)
    out = {}
    for name in ("inter_efficiency", "inter_alpha_s"):
        moved_in, moved_out = times(dict(params, **{name: params[name] * SENSITIVITY}))
        change_in = max((abs(m / b - 1) for m, b in zip(moved_in, base_in)), default=0.0)
        change_out = max((abs(m / b - 1) for m, b in zip(moved_out, base_out)), default=0.0)
        out[name] = {"calibration_change": change_in, "held_out_change": change_out,
                     "identified": bool(change_in >= IDENTIFIED)}
    return out


def print_holdout(result: dict) -> None:
    from thinwire.output import format_table

    print(f"fitted on the runs at {result['calibrate_at']} (overlap {result['overlap']}, "
          f"repeats {result.get('repeats', 'each')}; "
          f"in-sample max |error| {100 * result['in_sample_max_abs_error']:.1f}%); predicted:")
    rows = [{"algorithm": r["algorithm"],
             "rate_mbit": (r["inter_node_bandwidth_bps"] or 0) / 1e6,
             "measured_ms": 1e3 * r["measured_s"],
             **{f"pred_ms_{s}": (None if r[f"predicted_s_{s}"] is None
                                 else 1e3 * r[f"predicted_s_{s}"]) for s in COMPUTE_SOURCES},
             **{f"err_%_{s}": (None if r[f"error_{s}"] is None else 100 * r[f"error_{s}"])
                for s in COMPUTE_SOURCES}}
            for r in result["held_out"]]
    if rows:
        print(format_table(rows, rows[0].keys()))
    print("max |error| per algorithm (compute from the calibration fit / from the run's probe):")
    for name, errors in result["max_abs_error_by_algorithm"].items():
        print(f"  {name}: " + " / ".join(
            f"{100 * errors[s]:.1f}%" if s in errors else "-" for s in COMPUTE_SOURCES))
    for name, row in result.get("sensitivity", {}).items():
        verdict = "determined by" if row["identified"] else "NOT determined by"
        print(f"{name} x{SENSITIVITY:g}: moves the calibration runs by "
              f"{100 * row['calibration_change']:.1f}%, the held-out ones by "
              f"{100 * row['held_out_change']:.1f}%: {verdict} the runs at "
              f"{result['calibrate_at']}")
    if result.get("wire_bound"):
        print(f"wire-bound at {result['calibrate_at']} (no fixed cost per step fitted for "
              f"them; a miss at faster rates may be one): {', '.join(result['wire_bound'])}")
    floors = floors_line(result["fitted"])
    if floors:
        print(floors)
    for note in result["skipped"]:
        print(f"skipped: {note}")
