"""Quality metrics and the time-to-target / quality-at-budget logic, on evaluation curves.

A curve is the list of evaluations of one run, in order: ``{"train_time_s": ..., <metric>: ...}``
where ``train_time_s`` is training time only (whole steps, evaluation excluded). Time to target
is the training time of the *first evaluation* at or past the target: an upper bound, late by
at most one evaluation interval (``resolution_s`` says how far apart that evaluation and the one
before it are). Quality at the budget is the last evaluation made within the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool
    low: float           # the metric's range: a target must lie strictly inside (low, high]
    high: float
    unit: str

    def reached(self, value: float | None, target: float) -> bool:
        if value is None or not math.isfinite(value):
            return False
        return value >= target if self.higher_is_better else value <= target

    def better(self, a: float | None, b: float | None) -> bool:
        """Is ``a`` strictly better than ``b`` (None and NaN are worst)?"""
        if a is None or not math.isfinite(a):
            return False
        if b is None or not math.isfinite(b):
            return True
        return a > b if self.higher_is_better else a < b


METRICS = {
    "test_accuracy": Metric("test_accuracy", True, 0.0, 1.0, "fraction of test samples"),
    # held-out cross-entropy in bits per byte; 8 is a uniform guess over 256 byte values
    "bits_per_byte": Metric("bits_per_byte", False, 0.0, 8.0, "bits per byte, held out"),
}


def check_metric(name: str) -> Metric:
    if name not in METRICS:
        raise ValueError(f"quality metric must be one of {', '.join(METRICS)}, got {name!r}")
    return METRICS[name]


def check_target(metric: str, target: float, param: str = "--target") -> float:
    m = check_metric(metric)
    if isinstance(target, bool) or not isinstance(target, (int, float)) \
            or not math.isfinite(target) or not m.low < target <= m.high:
        raise ValueError(f"{param} for {metric} must be a number in ({m.low:g}, {m.high:g}], "
                         f"got {target!r}")
    return float(target)


def check_budget(budget_s: float, param: str = "--budget-s") -> float:
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) \
            or not math.isfinite(budget_s) or budget_s < 0:
        raise ValueError(f"{param} must be a number of seconds >= 0 (0 = no budget), "
                         f"got {budget_s!r}")
    return float(budget_s)


def time_to_target(curve: list[dict], metric: str, target: float,
                   budget_s: float = 0.0) -> float | None:
    """Training time of the first evaluation that reaches ``target``; None if none does within
    ``budget_s`` (0 = no budget: a run may overshoot its budget by one evaluation interval,
    and reaching the target there is still a miss)."""
    m = check_metric(metric)
    for point in curve:
        if budget_s and point["train_time_s"] > budget_s:
            return None
        if m.reached(point.get(metric), target):
            return float(point["train_time_s"])
    return None


def resolution_s(curve: list[dict], metric: str, target: float) -> float | None:
    """How far the reaching evaluation is from the one before it (the time's uncertainty)."""
    m = check_metric(metric)
    previous = 0.0
    for point in curve:
        if m.reached(point.get(metric), target):
            return float(point["train_time_s"]) - previous
        previous = float(point["train_time_s"])
    return None


def quality_at_budget(curve: list[dict], metric: str, budget_s: float) -> float | None:
    """The metric at the last evaluation within ``budget_s`` of training (0 = no budget: the
    last evaluation); None when no evaluation happened within it."""
    check_metric(metric)
    inside = [p for p in curve if not budget_s or p["train_time_s"] <= budget_s]
    return inside[-1].get(metric) if inside else None


def stop_reason(curve: list[dict], metric: str, target: float | None, budget_s: float,
                stop_at_target: bool) -> str | None:
    """Why a run should stop after its latest evaluation: "target", "budget" or None."""
    if not curve:
        return None
    last = curve[-1]
    if stop_at_target and target is not None and check_metric(metric).reached(last.get(metric),
                                                                              target):
        return "target"
    if budget_s and last["train_time_s"] >= budget_s:
        return "budget"
    return None
