"""DiLoCo's own cost, learned from DiLoCo runs among the calibration's races.

The per-step fit (:mod:`thinwire.sim.calibrate`) sees no DiLoCo run: DiLoCo's step is
predicted from what the per-step algorithms share (:func:`thinwire.sim.diloco.simulate_diloco`:
DDP inside each node, the outer exchange every H steps). On the emulator that falls 15-41%
short of measured DiLoCo runs (docs/results.md: 40-80 ms a step the phases do not hold: the
outer step's copies and optimizer, the nodes' drift apart over H local steps, which the first
to arrive waits out at the outer exchange, and the inner steps on the host's shared cores).

Where the calibration holds DiLoCo runs, their residual is fitted, after the shared
parameters and without changing them, as

    measured step = predicted step + slowdown * (per_step_s + per_outer_step_s / H)

(both >= 0, ``slowdown``: the setting's compute over the fastest setting's, as for every
fixed cost of CPU work on shared cores). ``per_step_s`` is paid every inner step,
``per_outer_step_s`` once an outer step. The fit takes each run's own share of outer steps
over its timed steps (a short run's differs from 1/H). The two terms are told apart only by
runs at two H or more; at one H the residual is taken as a cost per outer step (it then
shrinks with H, where the nodes' drift may not: a plan that ranks DiLoCo at an H beyond the
calibration's DiLoCo runs says so in its warnings, :func:`warnings`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from thinwire.sim.calibrate import (Run, diloco_extra_s, predict_diloco, rate_bps, read_run,
                                    result_blocks, setting_key)

NAME = "diloco"
# the residual terms the fit may reach (seconds): beyond these a run measured something else
MAX_PER_STEP_S, MAX_PER_OUTER_STEP_S = 5.0, 60.0


@dataclass(frozen=True)
class DilocoRun:
    run: Run               # read as a run of its outer algorithm: cluster, rate, model, step
    sync_every: int
    outer_algorithm: str
    # outer steps per timed step: 1/H over a long run, not in a short one (H=20 stopped at
    # step 30 with steps 3-30 timed made one exchange in 28 steps)
    outer_share: float


def outer_share(sync_every: int, steps, timed_steps) -> float:
    """Outer steps per step over the timed steps (the run's last ``timed_steps`` of
    ``steps``); 1/H where the run does not say."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
               for v in (steps, timed_steps)) or timed_steps > steps:
        return 1.0 / sync_every
    exchanges = steps // sync_every - (steps - timed_steps) // sync_every
    return exchanges / timed_steps


def read_diloco_runs(paths, calibrate_at: str | None = None) -> tuple[list[DilocoRun], list]:
    """The DiLoCo runs of ``paths`` the cost model can predict (at ``calibrate_at`` only,
    where given), and a note per one it cannot (fragments, overlap, a failed run)."""
    rate = rate_bps(calibrate_at) if calibrate_at is not None else None
    found, skipped = [], []
    for path in paths:
        for b, block in enumerate(result_blocks(path)):
            setting = block.get("setting") if isinstance(block.get("setting"), dict) else {}
            for r, raw in enumerate(block["runs"]):
                if not isinstance(raw, dict) or raw.get("algorithm") != NAME:
                    continue
                where = f"{path} result {b} run {r}"
                merged = {**setting, **(raw.get("setting") or {}), **raw}
                why = _unsupported(merged)
                if why:
                    skipped.append(f"{where}: {why}")
                    continue
                outer = str(merged["outer_algorithm"])
                # its cluster, rate, model and step are read as its outer algorithm's run's
                got = read_run(dict(raw, algorithm=outer), setting, where, str(path))
                if isinstance(got, str):
                    skipped.append(got)
                    continue
                if calibrate_at is not None and got.inter_bps != rate:
                    continue
                every = int(merged["sync_every"])
                found.append(DilocoRun(dataclasses.replace(got, algorithm=NAME), every, outer,
                                       outer_share(every, raw.get("steps"),
                                                   raw.get("timed_steps"))))
    return found, skipped


def _unsupported(merged: dict) -> str | None:
    """Why the model cannot predict this DiLoCo run (None: it can)."""
    every = merged.get("sync_every")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        return f"sync_every must be an integer >= 1, got {every!r}"
    if not isinstance(merged.get("outer_algorithm"), str):
        return f"no outer_algorithm (got {merged.get('outer_algorithm')!r})"
    if int(merged.get("fragments") or 1) != 1 or merged.get("overlap"):
        return "streaming DiLoCo (fragments > 1 or overlap) is not fitted"
    return None


def fit_extra(diloco_runs: list[DilocoRun], runs: list[Run], params: dict) -> dict | None:
    """{"per_step_s", "per_outer_step_s", "runs", "sync_every"} fitted on the DiLoCo runs
    whose setting (cluster, rate, model) the per-step ``runs`` fitted a compute time for;
    None where there are none. ``params``: the per-step fit."""
    placed = placed_on(diloco_runs, runs)
    if not placed:
        return None
    # relative residual r_i = (p_i + s_i * (a + b * share_i)) / m_i - 1: linear in (a, b);
    # p_i with the run's own share of outer steps (the model's 1/H where the run ran long)
    rows, target = [], []
    for d in placed:
        measured = d.run.iteration_s
        predicted, slowdown = _phases_at_own_share(d, params)
        rows.append([slowdown / measured, slowdown * d.outer_share / measured])
        target.append(1 - predicted / measured)
    # two terms only from runs at two H or more: runs at one H whose shares differ by their
    # lengths alone (1/28 against 1/48) would split one residual between two near-equal columns
    a, b = _nonnegative_fit(np.array(rows), np.array(target),
                            two_terms=len({d.sync_every for d in placed}) > 1)
    return {"per_step_s": min(a, MAX_PER_STEP_S), "per_outer_step_s": min(b, MAX_PER_OUTER_STEP_S),
            "runs": len(placed), "sync_every": sorted({d.sync_every for d in placed})}


def placed_on(diloco_runs: list[DilocoRun], runs: list[Run]) -> list[DilocoRun]:
    """The DiLoCo runs whose setting (cluster, rate, model) one of the per-step ``runs`` has,
    each at that setting's index (their compute time is the fit's for it)."""
    index = {setting_key(r): r.setting_index for r in runs}
    return [dataclasses.replace(d, run=dataclasses.replace(
        d.run, setting_index=index[setting_key(d.run)]))
        for d in diloco_runs if setting_key(d.run) in index]


def _phases_at_own_share(d: DilocoRun, params: dict) -> tuple[float, float]:
    """(the phases' step of ``d`` at its own share of outer steps, its setting's slowdown)."""
    reference = params.get("reference_compute_s", min(params["compute_s"]))
    slowdown = params["compute_s"][d.run.setting_index] / reference
    row = predict_diloco(d.run, params, d.sync_every, d.outer_algorithm, with_extra=False)
    return row["inner_step_s"] + d.outer_share * sum(row["exchange_s"]), slowdown


def predicted_step(d: DilocoRun, params: dict) -> float:
    """``d``'s step as the model gives it at the run's own share of outer steps, with the
    fitted DiLoCo cost where ``params`` has one (what to compare with its measured step)."""
    phases, slowdown = _phases_at_own_share(d, params)
    return phases + diloco_extra_s(params, slowdown, d.outer_share)


def _nonnegative_fit(rows: np.ndarray, target: np.ndarray, two_terms: bool) -> tuple:
    """(a, b) >= 0 minimising |rows @ (a, b) - target|; b alone where ``two_terms`` is False."""
    from scipy.optimize import nnls

    if two_terms:
        solution, _ = nnls(rows, target)
        return float(solution[0]), float(solution[1])
    column = rows[:, 1]
    if not column @ column > 0:  # no run made an exchange while timed: nothing to fit
        return 0.0, 0.0
    return 0.0, float(max(column @ target / (column @ column), 0.0))


def warnings(params: dict, ranked_h: list[int]) -> list[str]:
    """What a plan that ranks DiLoCo at ``ranked_h`` should say about DiLoCo's step."""
    if not ranked_h:
        return []
    extra = params.get("diloco_extra")
    if not extra:
        return [f"DiLoCo (H {', '.join(map(str, sorted(set(ranked_h))))}) is ranked with its step "
                f"from the per-step fit alone (no DiLoCo run in the calibration): on the "
                f"emulator that fell 14-41% short; calibrate with a DiLoCo race too"]
    beyond = sorted({h for h in ranked_h if h > max(extra["sync_every"])})
    if beyond:
        return [f"DiLoCo at H {', '.join(map(str, beyond))} is ranked with its own cost fitted "
                f"at H {', '.join(map(str, extra['sync_every']))}: beyond them it is "
                f"extrapolated"]
    return []
