"""The plan's intra-node link from auto's intra-node probe (thinwire.sim.probed_links)."""

import pytest

from thinwire.sim.probed_links import FITTED, intra_from_probe

PARAMS = {FITTED: 2e9, "intra_alpha_s": 1e-4, "inter_efficiency": 0.9}


def probe(goodput, bound_by="link", **extra):
    return {"ranks_per_node": 2, "goodput_Bps": goodput, "fixed_s": 0.004,
            "host_busy": 0.5, "throttled_share": 0.0, "bound_by": bound_by, **extra}


def test_a_probe_that_measured_the_link_sets_the_bandwidth_and_nothing_else():
    params, record = intra_from_probe(PARAMS, probe(5e10))
    assert params == dict(PARAMS, **{FITTED: 5e10})  # the fixed cost stays the fit's
    assert PARAMS[FITTED] == 2e9  # the caller's parameters are not changed
    assert record["source"] == "probe" and record["planned_Bps"] == 5e10
    assert record["fitted_Bps"] == 2e9 and "50.00 GB/s" in record["why"]


@pytest.mark.parametrize("intra, why", [
    (None, "no intra-node probe"),
    ({"ranks_per_node": 1, "goodput_Bps": None,
      "why": "one rank a node: nothing inside a node to measure"}, "one rank a node"),
    (probe(None, why="8388608 bytes took no longer than 1048576"), "took no longer"),
    (probe(7e8, bound_by="host", host_busy=1.0), "host-bound"),
])
def test_the_fit_stays_where_the_probe_did_not_measure_the_link(intra, why):
    params, record = intra_from_probe(PARAMS, intra)
    assert params is PARAMS
    assert record["source"] == "calibration" and record["planned_Bps"] == 2e9
    assert why in record["why"]


@pytest.mark.parametrize("goodput", [0.0, -1.0, float("nan"), float("inf"), "fast", True])
def test_a_probe_figure_that_is_no_rate_is_refused_by_name(goodput):
    with pytest.raises(ValueError, match="goodput_Bps must be a finite number > 0"):
        intra_from_probe(PARAMS, probe(goodput))


def test_the_constants_fitted_against_the_fits_rate_are_fitted_again(tmp_path):
    """A probed intra-node rate far from the fit's: each algorithm's fixed cost per step is
    fitted again on the calibration runs, which it then predicts no worse than the constants
    fitted against the old rate would."""
    import statistics

    from thinwire.sim.calibrate import predict
    from thinwire.sim.plan import calibrated, with_probed_intra

    from plan_helpers import _results

    path = _results(tmp_path)
    fitted = calibrated([path], None, "max")
    same, record = with_probed_intra([path], fitted, probe(7e8, bound_by="host"))
    assert same is fitted and record["source"] == "calibration"
    params, mode, runs = fitted
    faster = 50 * params[FITTED]  # the intra-node phases all but vanish
    (probed, _, _), record = with_probed_intra([path], fitted, probe(faster))
    assert record["source"] == "probe" and probed[FITTED] == faster
    assert params[FITTED] != faster  # the cached fit is left as it was

    def error(p):
        return statistics.mean(abs(predict(r, p, mode)["iteration_s"] / r.iteration_s - 1)
                               for r in runs)
    kept = dict(params, **{FITTED: faster})  # the old constants beside the new rate
    assert error(probed) <= error(kept) + 1e-12
    assert probed["step_extra_s"] != kept["step_extra_s"]
