"""Repeated runs of one setting, taken as their median: on a loaded 2-core host one run per
(algorithm, rate) carries its own noise (the LM sweep's PowerSGD at 200 Mbit/s took 414 ms a
step once and 249 and 244 ms when measured again), and a fit or a held-out check on it inherits
that. ``thinwire simulate --calibrate-at`` and ``thinwire plan`` read ``--repeats``; auto's plan
reads ``--plan-repeats`` (the same choices and meaning, a setting of ``thinwire train``)."""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thinwire.sim.calibrate import Run

REPEATS = ("each", "median")
HELP = ("calibration: fit each run, or the median of a run's repetitions (several results "
        "files of the same sweep)")


def add_repeats_option(parser) -> None:
    """``--repeats``, declared once for every command that fits the cost model."""
    parser.add_argument("--repeats", default="each", choices=REPEATS, help=HELP)


def check_repeats(repeats: str) -> None:
    if repeats not in REPEATS:
        raise ValueError(f"repeats must be one of {', '.join(REPEATS)}, got {repeats!r}")


def median_of_repeats(runs: list[Run]) -> list[Run]:
    """One run per (algorithm, rate, cluster, model, options): the median of its repetitions'
    iteration, compute, hook and CPU times (repeated ``thinwire compare`` sweeps on a loaded
    machine differ by more than the communication being predicted)."""
    from thinwire.sim.calibrate import bytes_key  # what fixes a run's bytes: all but the rate

    groups = defaultdict(list)
    for run in runs:
        groups[(bytes_key(run), run.inter_bps)].append(run)

    def median(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    return [dataclasses.replace(
        group[0], source=f"median of {len(group)}: " + ", ".join(r.source for r in group),
        iteration_s=median(r.iteration_s for r in group),
        compute_s=median(r.compute_s for r in group), hook_s=median(r.hook_s for r in group),
        **_median_cpu(group), extra=_merged_extra(group))
        for group in groups.values()]


def _median_cpu(group: list[Run]) -> dict:
    """``cpu_s`` and ``cores`` of the repetitions that measured their CPU (older runs did not
    record it): the median share of the cores a step used, at the median cores, so that
    repetitions on hosts of different sizes are compared by what bounds a step (CPU / cores)."""
    measured = [r for r in group if r.cpu_s is not None and r.cores]
    if not measured:
        return {"cpu_s": None, "cores": None}
    cores = statistics.median(r.cores for r in measured)
    return {"cpu_s": cores * statistics.median(r.cpu_s / r.cores for r in measured),
            "cores": cores}


def _merged_extra(group: list[Run]) -> dict:
    """The first repetition's extras, with a fidelity verdict of "link" only where every
    repetition that has one says so: a host that paced one repetition lets the fit weigh the
    host's time per byte, as it does with each run on its own."""
    extra = dict(group[0].extra)
    verdicts = [r.extra["fidelity"] for r in group if "fidelity" in r.extra]
    if verdicts:
        extra["fidelity"] = next((v for v in verdicts if v != "link"), "link")
    return extra
