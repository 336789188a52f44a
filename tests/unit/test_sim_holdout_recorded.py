"""The cost model out of sample on the recorded MNIST sweep (2 x 2 at 50 Mbit/s, 200 Mbit/s
and 1 Gbit/s, docs/results/sweep/mnist_results.json): calibrated at any one rate, it predicts
the step time at the other two within 20% for every algorithm (issue 31's target), but for
dlcp calibrated at 50 Mbit/s: its fixed cost a step (~0.15 s of datagram handling) is what the
fit at that wire-bound rate cannot see (docs/results.md). The model-generated sweeps of
test_sim_holdout pass by construction; these are measurements, so a change to the model that
loses the fit fails here."""

from pathlib import Path

import pytest

from thinwire.sim.calibrate import rate_bps
from thinwire.sim.holdout import holdout

SWEEP = Path(__file__).resolve().parents[2] / "docs" / "results" / "sweep" / "mnist_results.json"
WITHIN = 0.20
KNOWN_MISS = {"50mbit": {"dlcp"}, "200mbit": set(), "1gbit": set()}


@pytest.mark.parametrize("calibrate_at", ["50mbit", "200mbit", "1gbit"])
def test_the_recorded_sweep_is_predicted_within_20_percent_out_of_sample(calibrate_at):
    result = holdout([SWEEP], calibrate_at, form="max")  # as docs/results.md's command
    errors = {a: e.get("calibrated") for a, e in result["max_abs_error_by_algorithm"].items()}
    assert len(errors) == 10 and None not in errors.values(), errors  # all predicted
    assert {r["inter_node_bandwidth_bps"] for r in result["held_out"]} == \
        {5e7, 2e8, 1e9} - {rate_bps(calibrate_at)}
    missed = {a: e for a, e in errors.items() if e > WITHIN}
    assert set(missed) <= KNOWN_MISS[calibrate_at], missed
