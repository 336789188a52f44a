"""Steps to target for a candidate no race measured, read between two that were.

The plan multiplies steps to target by the cost model's step time, and steps come from races
(:mod:`thinwire.sim.steps`). The registry offers more candidates than anyone races (four
densities per sparse algorithm, four PowerSGD ranks, three DiLoCo H). A candidate that differs
from measured ones only in one ordered setting - a sparse algorithm's density, PowerSGD's rank,
DiLoCo's H - and lies *between* two measured values of it gets the steps of the line through
those two in the logarithm of the setting (steps fall as density or rank grow and rise with H,
roughly by factors: 0.01 -> 0.02 -> 0.05 is a doubling, then 2.5x). Never beyond the measured
range: a guess outside it has nothing to hold it.

Its error, measured by holding out each measured candidate that has neighbours on both sides
(:func:`holdout`; MNIST 2 x 2, docs/results.md): the figure is in the plan docs. A plan row
says where its steps came from (``steps_source``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from thinwire.sim.steps import Candidate

# the ordered settings steps are read between (a candidate varies in at most one of them)
KNOBS = ("density", "powersgd_rank", "sync_every")


@dataclass(frozen=True)
class Estimate:
    steps: float
    knob: str
    between: tuple  # (label, steps) of the measured candidate below and above


def _split(cand: Candidate) -> tuple[str, float, tuple] | None:
    """(knob, its value, the other options) of ``cand``; None where it has no knob."""
    options = dict(cand.options)
    found = [k for k in KNOBS if isinstance(options.get(k), (int, float))
             and not isinstance(options.get(k), bool) and options[k] > 0]
    if len(found) != 1:
        return None
    knob = found[0]
    rest = tuple((k, v) for k, v in cand.options if k != knob)
    return knob, float(options[knob]), rest


def interpolated(cand: Candidate, measured: dict) -> Estimate | None:
    """Steps for ``cand`` between its nearest measured neighbours along its knob (same
    algorithm, same other settings), or None. ``measured``: {Candidate: steps} of those that
    reached the target."""
    split = _split(cand)
    if split is None:
        return None
    knob, value, rest = split
    below, above = None, None
    for other, steps in measured.items():
        theirs = _split(other)
        if other.algorithm != cand.algorithm or theirs is None or theirs[0] != knob \
                or theirs[2] != rest:
            continue
        at = theirs[1]
        if at < value and (below is None or at > below[0]):
            below = (at, other, steps)
        elif at > value and (above is None or at < above[0]):
            above = (at, other, steps)
    # the nearest on each side, reached or not: a neighbour that missed the target is an
    # answer, not a gap to read across
    if below is None or above is None or below[2] is None or above[2] is None:
        return None
    share = (math.log(value) - math.log(below[0])) / (math.log(above[0]) - math.log(below[0]))
    steps = below[2] + share * (above[2] - below[2])
    return Estimate(steps, knob, ((below[1].label(), below[2]), (above[1].label(), above[2])))


def holdout(measured: dict) -> list[dict]:
    """Each measured candidate with measured neighbours on both sides of its knob, estimated
    from them as if it had not been raced: {candidate, measured, estimated, error, between}."""
    rows = []
    for cand, steps in sorted(measured.items(), key=lambda item: item[0].label()):
        if steps is None:
            continue
        others = {c: s for c, s in measured.items() if c != cand}
        guess = interpolated(cand, others)
        if guess is None:
            continue
        rows.append({"candidate": cand.label(), "knob": guess.knob, "measured_steps": steps,
                     "estimated_steps": guess.steps, "error": guess.steps / steps - 1,
                     "between": [label for label, _ in guess.between]})
    return rows
