"""The calibration's host time per inter-node byte (``inter_host_s_per_byte``): CPU work of
sending (copies, the TCP stack, gloo's reduction) paid in series with the wire where the ranks'
compute already holds the host's cores. On the emulator's LM runs at 1 Gbit/s it, not the
link, set the pace; without it a fit there read the host as a link at half its rate."""

import json

import pytest

from thinwire.sim import calibrate
from thinwire.sim.calibrate import (Run, fit, inter_s_per_byte, network_for, predict,
                                    read_runs)
from thinwire.sim.compute import uniform
from thinwire.sim.holdout import holdout

TRUE = {"inter_alpha_s": 3e-4, "inter_efficiency": 0.9, "intra_alpha_s": 1e-4,
        "intra_bandwidth_Bps": 2e9, "sparse_rate": 5e7, "sparse_alpha_s": 2e-3,
        "pass_rate": 1e9, "inter_host_s_per_byte": 1e-8, "compute_s": [0.3],
        "phase_form": "max"}
ALGORITHMS = ("allreduce", "hier_allreduce", "topk_allgather", "hitopk")
RATES = (5e7, 2e8, 1e9)


def test_a_byte_costs_its_wire_time_plus_the_hosts_time_by_hand():
    # 8 bits at 0.9 x 1 Gbit/s: 8.889 ns; plus 10 ns of host; twice the bytes on the wire
    assert inter_s_per_byte(TRUE, 1e9, bytes_scale=2.0) == pytest.approx(2 * (8.889e-9 + 1e-8),
                                                                          rel=1e-3)
    assert network_for(TRUE, 1e9).inter.bandwidth == pytest.approx(1 / 18.889e-9, rel=1e-3)
    old = {k: v for k, v in TRUE.items() if k != "inter_host_s_per_byte"}  # an older fit
    assert network_for(old, 1e9).inter.bandwidth == pytest.approx(0.9e9 / 8)


def _sweep(tmp_path, truth):
    runs = []
    for bps in RATES:
        for algorithm in ALGORITHMS:
            run = Run("synthetic", algorithm, algorithm, 2, 2, bps, "u", uniform(2_000_000),
                      0.01, None, 1.0)
            row = predict(run, dict(truth, bytes_scale={}, step_extra_s={}), overlap="hooks")
            runs.append({"algorithm": algorithm, "inter_node_bandwidth": bps, "status": "ok",
                         "iteration_s": row["iteration_s"],
                         "compute_ms_per_iter": 1e3 * row["compute_s"]})
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"setting": {"nodes": 2, "ranks_per_node": 2,
                                            "parameters": 2_000_000}, "runs": runs}))
    return path


@pytest.mark.parametrize("calibrate_at", ["50mbit", "200mbit", "1gbit"])
def test_a_host_cost_seen_at_one_rate_is_carried_to_the_others(tmp_path, calibrate_at):
    """Within 5%: at 50 Mbit/s the host is 5% of a byte's time (10 of 188 ns), so the fit
    there determines it less sharply than at the faster rates."""
    result = holdout([_sweep(tmp_path, TRUE)], calibrate_at, form="max")
    for row in result["held_out"]:
        assert abs(row["error_calibrated"]) < 0.05, row


def test_without_the_host_term_the_fit_reads_the_host_as_a_slow_link(tmp_path, monkeypatch):
    """Not vacuous: the host term held at ~0 (its bounds pinned), the fit at 1 Gbit/s lowers
    the goodput instead and over-predicts 50 Mbit/s, where the wire is most of the step."""
    index = calibrate.FIT_NAMES.index("inter_host_s_per_byte")
    pinned = lambda bounds, value: tuple(value if i == index else b for i, b in enumerate(bounds))
    monkeypatch.setattr(calibrate, "LOWER", pinned(calibrate.LOWER, 1e-12))
    monkeypatch.setattr(calibrate, "UPPER", pinned(calibrate.UPPER, 1.01e-12))
    monkeypatch.setattr(calibrate, "START", pinned(calibrate.START, 1.005e-12))
    result = holdout([_sweep(tmp_path, TRUE)], "1gbit", form="max")
    assert result["fitted"]["inter_efficiency"] < 0.7
    slow = [r for r in result["held_out"] if r["inter_node_bandwidth_bps"] == 5e7]
    assert max(r["error_calibrated"] for r in slow) > 0.2


def test_two_rates_tell_the_goodput_from_the_host(tmp_path):
    """At one rate only the prior splits a byte's time; at two, the wire's share (inverse in
    the rate) and the host's (the same at every rate) are both determined, away from it."""
    truth = dict(TRUE, inter_efficiency=0.7, inter_host_s_per_byte=5e-9)
    runs, _ = read_runs([_sweep(tmp_path, truth)])
    two = [r for r in runs if r.inter_bps in (5e7, 1e9)]
    for r in two:
        r.setting_index = 0
    params, _ = fit(two, overlap="hooks", form="max")
    assert params["inter_efficiency"] == pytest.approx(0.7, rel=0.05)
    assert params["inter_host_s_per_byte"] == pytest.approx(5e-9, rel=0.2)
