"""``--algorithm auto``'s compute probe: how fast this cluster computes a step, against the
calibration's.

The plan's compute per step is fitted on the calibration races (``--plan-from``), which may have
run on other machines than this run (a laptop's emulator, another GPU). Before it chooses, every
rank times ``--compute-probe-iters`` steps of the run's model and optimizer without any
communication, all ranks at once (so the host is as contended as in training), exactly as
``thinwire train`` times its compute-only steps (``compute_ms_per_iter`` in every result). The
ratio of this run's time to the calibration runs' median of that same measurement scales the
fitted compute: a like-for-like ratio, so what the fit folds into "compute" (the optimizer,
the hook's own work) scales with it. Where the probe lies within the calibration runs' own
spread of that measurement (widened by half either way), the cluster computes as they did and
the fit is used unscaled (on the 2-core development machine the spread is 41-106 ms over the
MNIST sweep, and a 5-step probe read 39 ms and 86 ms in two runs: its noise would otherwise
move the plan). A probe outside that spread is taken again (``COMPUTE_TRIES`` in all) and the
median of the tries is the probe: a cluster that computes differently reads so every time, one
noisy probe does not (one read 164 ms against a widened spread ending at 159, the plan scaled
compute by 2.4 and chose another algorithm; the same run's own measurement seconds later read
131 ms).
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist


def probe_ms(cfg, group, measure) -> float | None:
    """The mean over ranks of each rank's median compute-only step (ms): ``measure()``, the
    training loop's own timing (collective); None where ``--compute-probe-iters`` is 0 or no
    ``measure`` is given. ``group``: a gloo group of every rank."""
    if not cfg.compute_probe_iters or measure is None:
        return None
    total = torch.tensor([float(measure())], dtype=torch.float64)
    dist.all_reduce(total, group=group)
    return total.item() / dist.get_world_size()


# probes in all where the first lies outside the calibration's widened spread (the median used)
COMPUTE_TRIES = 3


def probe_tries(cfg, group, measure, calibrated: tuple | None) -> list[float]:
    """:func:`probe_ms`, taken again up to ``COMPUTE_TRIES`` times in all where the first lies
    outside ``calibrated``'s widened spread (:func:`within`); every try, in order (empty where
    there is no probe). ``calibrated``: rank 0's :func:`calibration_ms` (the other ranks' is
    not read): rank 0 decides whether to try again and tells every rank over ``group``."""
    first = probe_ms(cfg, group, measure)
    if first is None:
        return []
    again = torch.tensor([int(dist.get_rank() == 0 and calibrated is not None
                              and not within(first, calibrated))], dtype=torch.int64)
    dist.broadcast(again, src=0, group=group)
    if not again.item():
        return [first]
    return [first] + [probe_ms(cfg, group, measure) for _ in range(COMPUTE_TRIES - 1)]


def within(probed_ms: float, calibrated: tuple) -> bool:
    """Whether ``probed_ms`` lies within the calibration runs' spread widened by
    ``SPREAD_MARGIN`` either way (this cluster computes as they did)."""
    _, low, high = calibrated
    return low / SPREAD_MARGIN <= probed_ms <= high * SPREAD_MARGIN


def calibration_ms(files: list, nodes: int, ranks_per_node: int,
                   model: str) -> tuple[float, float, float] | None:
    """(median, lowest, highest) ``compute_ms_per_iter`` of the calibration's runs of this
    cluster shape and model; None where none recorded it."""
    from thinwire.sim.calibrate import result_blocks

    values = []
    for path in files:  # every form of results file the calibration reads
        for results in result_blocks(path, "--plan-from file"):
            values += _compute_ms(results, nodes, ranks_per_node, model)
    return (statistics.median(values), min(values), max(values)) if values else None


def _compute_ms(results: dict, nodes: int, ranks_per_node: int, model: str) -> list[float]:
    """The ``compute_ms_per_iter`` of one result block's runs of this shape and model."""
    values = []
    setting = results.get("setting") if isinstance(results.get("setting"), dict) else {}
    for run in results["runs"]:
        def field(name, run=run):  # a run's own, else its race's setting
            return run.get(name, setting.get(name))
        shape = (field("nodes"), run["world_size"] // field("nodes")
                 if run.get("world_size") and field("nodes") else
                 setting.get("ranks_per_node"))
        if field("model") == model and shape == (nodes, ranks_per_node) and \
                isinstance(run.get("compute_ms_per_iter"), (int, float)) and \
                run["compute_ms_per_iter"] > 0:
            values.append(float(run["compute_ms_per_iter"]))
    return values


# the calibration runs' spread of the compute-only step, widened this much either way, is
# "computes as they did": on the 2-core machine a 5-step probe of one model read 39 ms in one
# run and 86 ms in the next, against a calibration spread of 41-106 ms
SPREAD_MARGIN = 1.5


def scale(probed_ms: float | None, calibrated: tuple | None) -> dict:
    """The record, with ``scale``: 1.0 where either side is missing, or where the probe lies
    within the calibration runs' own spread widened by ``SPREAD_MARGIN`` (this cluster
    computes as they did: a scale would only carry the probe's noise); else the probe over
    their median."""
    if not probed_ms or not calibrated:
        return {"probed_ms": probed_ms, "calibration_ms": calibrated and calibrated[0],
                "scale": 1.0, "source": "calibration (not probed)"}
    median, low, high = calibrated
    inside = within(probed_ms, calibrated)
    return {"probed_ms": probed_ms, "calibration_ms": median,
            "calibration_range_ms": [low, high], "scale": 1.0 if inside else probed_ms / median,
            "source": "calibration (the probe lies within its spread)" if inside else "probed"}
