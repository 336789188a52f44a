"""DiLoCo's own cost, fitted from DiLoCo runs in the calibration (thinwire.sim.diloco_fit):
synthetic races whose DiLoCo steps carry a known cost beyond the model's phases."""

import dataclasses
import json

import pytest

from thinwire.sim.calibrate import predict_diloco, read_runs
from thinwire.sim.diloco_fit import fit_extra, outer_share, read_diloco_runs
from thinwire.sim.plan import calibrated, make_plan

from plan_helpers import RATES, TRUE, _curve, _results

PER_STEP_S, PER_OUTER_STEP_S = 0.02, 0.4  # the known cost beyond the phases
OUTER = "hier_allreduce"


def _model_step(template, bps: float, sync_every: int) -> float:
    """The model's DiLoCo step under the generating parameters, without any extra."""
    run = dataclasses.replace(template, inter_bps=bps, setting_index=0)
    return predict_diloco(run, TRUE, sync_every, OUTER, with_extra=False)["iteration_s"]


def _with_diloco(tmp_path, sync_everys=(5, 10, 20), rates=RATES, **raw_extra) -> tuple:
    """The synthetic per-step races plus DiLoCo runs at ``sync_everys`` whose steps are the
    model's plus PER_STEP_S + PER_OUTER_STEP_S / H."""
    path = _results(tmp_path)
    data = json.loads(path.read_text())
    template = read_runs([path])[0][0]
    for bps in rates:
        for h in sync_everys:
            step = _model_step(template, bps, h) + PER_STEP_S + PER_OUTER_STEP_S / h
            data["runs"].append({"algorithm": "diloco", "inter_node_bandwidth": bps,
                                 "status": "ok", "sync_every": h, "outer_algorithm": OUTER,
                                 "seed": 0, "curve": _curve(40, 44), "steps": 44,
                                 "iteration_s": step, **raw_extra})
    path.write_text(json.dumps(data))
    return path, template


def test_two_terms_are_recovered_from_runs_at_several_h(tmp_path):
    path, _ = _with_diloco(tmp_path)
    params, _, _ = calibrated([path], None, "max")
    extra = params["diloco_extra"]
    assert extra["runs"] == 9 and extra["sync_every"] == [5, 10, 20]
    assert extra["per_step_s"] == pytest.approx(PER_STEP_S, rel=0.15)
    assert extra["per_outer_step_s"] == pytest.approx(PER_OUTER_STEP_S, rel=0.15)


def test_the_plan_predicts_an_unmeasured_h_with_the_fitted_cost(tmp_path):
    """Calibrated at one rate with DiLoCo at H 5 and 20, the plan's DiLoCo step at another
    rate and H=8 (a candidate of the grid no race ran) is the generating one."""
    path, template = _with_diloco(tmp_path, sync_everys=(5, 20))
    plan = make_plan([path], [path], None, None, None, ["50mbit", "1gbit"],
                     calibrate_at="200mbit", with_break_even=False)
    assert plan["diloco_extra"]["runs"] == 2
    for one in plan["plans"]:
        row = next(r for r in one["rows"] if r["candidate"] == "diloco H=8")
        truth = _model_step(template, one["inter_node_bps"], 8) + PER_STEP_S \
            + PER_OUTER_STEP_S / 8
        assert row["step_s"] == pytest.approx(truth, rel=0.05), one["rate"]


def test_at_one_h_the_residual_is_a_cost_per_outer_step(tmp_path):
    path, template = _with_diloco(tmp_path, sync_everys=(10,))
    params, _, _ = calibrated([path], "200mbit", "max")
    extra = params["diloco_extra"]
    assert extra["per_step_s"] == 0.0
    # the whole residual at H=10, spread over the outer steps
    assert extra["per_outer_step_s"] == pytest.approx(10 * PER_STEP_S + PER_OUTER_STEP_S,
                                                      rel=0.15)


def test_without_diloco_runs_nothing_is_fitted_and_diloco_is_the_phases_alone(tmp_path):
    path = _results(tmp_path)
    params, _, runs = calibrated([path], None, "max")
    assert "diloco_extra" not in params
    run = dataclasses.replace(runs[0], setting_index=0)
    assert predict_diloco(run, params, 10, OUTER)["iteration_s"] == \
        predict_diloco(run, params, 10, OUTER, with_extra=False)["iteration_s"]


def test_a_fit_only_from_runs_of_a_setting_the_per_step_fit_holds(tmp_path):
    """DiLoCo at 25 Mbit/s, where no per-step race ran, has no fitted compute: left out."""
    path, _ = _with_diloco(tmp_path, rates=(2.5e7,))
    runs, _ = read_runs([path])
    diloco_runs, _ = read_diloco_runs([path])
    assert len(diloco_runs) == 3
    assert fit_extra(diloco_runs, runs, dict(TRUE, compute_s=[0.08] * 3)) is None


def test_streaming_runs_and_bad_h_are_skipped_with_a_reason(tmp_path):
    path, _ = _with_diloco(tmp_path, sync_everys=(10,), fragments=2)
    found, skipped = read_diloco_runs([path])
    assert not found and len(skipped) == 3 and "streaming" in skipped[0]
    path, _ = _with_diloco(tmp_path, sync_everys=(10,), sync_every=0)
    found, skipped = read_diloco_runs([path])
    assert not found and "sync_every must be an integer >= 1, got 0" in skipped[0]


def test_calibrate_at_keeps_the_diloco_runs_at_that_rate(tmp_path):
    path, _ = _with_diloco(tmp_path)
    found, _ = read_diloco_runs([path], "1gbit")
    assert {d.run.inter_bps for d in found} == {1e9} and len(found) == 3


@pytest.mark.parametrize("every, steps, timed, share", [
    (10, 40, 38, 4 / 38),   # steps 3-40: exchanges at 10, 20, 30, 40
    (20, 30, 28, 1 / 28),   # a short run: one exchange where 1/H would say 1.4
    (5, 42, 40, 8 / 40),
    (10, None, None, 0.1),  # not recorded: 1/H
    (10, 5, 8, 0.1),        # more timed steps than steps: not believed
])
def test_the_share_of_outer_steps_is_counted_over_the_timed_steps(every, steps, timed, share):
    assert outer_share(every, steps, timed) == pytest.approx(share)


def test_the_fit_uses_each_runs_own_share_of_outer_steps(tmp_path):
    """Runs that stopped before their exchanges averaged out (one exchange in 28 timed steps
    at H=20): fitted with the share they had, the generating costs come back."""
    path = _results(tmp_path)
    data = json.loads(path.read_text())
    template = read_runs([path])[0][0]
    for bps in RATES:
        for h, steps in ((5, 42), (20, 30)):
            share = outer_share(h, steps, steps - 2)
            run = dataclasses.replace(template, inter_bps=bps, setting_index=0)
            row = predict_diloco(run, TRUE, h, OUTER, with_extra=False)
            step = row["inner_step_s"] + share * sum(row["exchange_s"]) + PER_STEP_S \
                + PER_OUTER_STEP_S * share
            data["runs"].append({"algorithm": "diloco", "inter_node_bandwidth": bps,
                                 "status": "ok", "sync_every": h, "outer_algorithm": OUTER,
                                 "seed": 0, "curve": _curve(steps, steps), "steps": steps,
                                 "timed_steps": steps - 2, "iteration_s": step})
    path.write_text(json.dumps(data))
    extra = calibrated([path], None, "max")[0]["diloco_extra"]
    assert extra["per_step_s"] == pytest.approx(PER_STEP_S, rel=0.15)
    assert extra["per_outer_step_s"] == pytest.approx(PER_OUTER_STEP_S, rel=0.15)


def test_the_plan_warns_where_diloco_is_ranked_without_its_own_cost_or_beyond_it(tmp_path):
    path, _ = _with_diloco(tmp_path, sync_everys=(5, 10))
    steps_only = tmp_path / "steps_only.json"  # the same races as a steps table ...
    steps_only.write_text(path.read_text())
    (tmp_path / "cal").mkdir()
    per_step = _results(tmp_path / "cal")  # ... and a calibration without any DiLoCo run
    plan = make_plan([per_step], [steps_only], None, None, None, ["200mbit"],
                     with_break_even=False)
    # H=8 ranked too: its steps read between H=5 and H=10 (thinwire.sim.steps_estimate)
    assert any("DiLoCo (H 5, 8, 10) is ranked with its step from the per-step fit alone" in w
               for w in plan["warnings"]), plan["warnings"]
    # calibrated with DiLoCo at H 5 and 10 only; steps measured at H 20 too: extrapolated
    data = json.loads(path.read_text())
    data["runs"] += [dict(r, sync_every=20, inter_node_bandwidth=1.23e8)
                     for r in data["runs"] if r["algorithm"] == "diloco"][:1]
    steps_only.write_text(json.dumps(data))
    plan = make_plan([path], [steps_only], None, None, None, ["200mbit"],
                     with_break_even=False)
    assert any("DiLoCo at H 20 is ranked with its own cost fitted at H 5, 10" in w
               for w in plan["warnings"]), plan["warnings"]
    plan = make_plan([path], [path], None, None, None, ["200mbit"], with_break_even=False)
    assert not any("DiLoCo" in w for w in plan["warnings"])


def test_the_holdout_predicts_diloco_runs_at_the_other_rates(tmp_path):
    """thinwire simulate --calibrate-at: DiLoCo's cost fitted at 200 Mbit/s from its runs
    there, the DiLoCo runs at 50 Mbit/s and 1 Gbit/s predicted close to their generating step
    (the per-step fit recovers the generating parameters)."""
    from thinwire.sim.holdout import holdout

    path, _ = _with_diloco(tmp_path)
    result = holdout([path], "200mbit", form="max")
    rows = [r for r in result["held_out"] if r["algorithm"].startswith("diloco")]
    assert sorted({r["algorithm"] for r in rows}) == ["diloco H=10", "diloco H=20", "diloco H=5"]
    assert {r["inter_node_bandwidth_bps"] for r in rows} == {5e7, 1e9}
    assert all(abs(r["error_calibrated"]) < 0.05 for r in rows), rows
    assert result["diloco_extra"]["runs"] == 3 and result["diloco_in_sample_max_abs_error"] < 0.05
    assert {r["algorithm"] for r in result["rows"]} >= {"diloco H=5", "diloco H=10"}


def test_runs_without_an_exchange_while_timed_fit_nothing_rather_than_nan(tmp_path):
    """H=20 stopped at step 15 (13 timed): no exchange in the timed steps, nothing to learn
    about the outer step's cost; the fit must not divide 0 by 0."""
    path, _ = _with_diloco(tmp_path, sync_everys=(20,), steps=15, timed_steps=13)
    extra = calibrated([path], "200mbit", "max")[0]["diloco_extra"]
    assert extra["per_step_s"] == 0.0 and extra["per_outer_step_s"] == 0.0
