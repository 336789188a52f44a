"""The Wavelet benchmarks' arithmetic: the two-wave learning rate, and the table of the
model-parallel comparison (ratios taken within each repetition)."""

from __future__ import annotations

import argparse

import pytest

from thinwire.bench.wavelet import two_wave_lr
from thinwire.bench.wavelet_pipeline import ideal_utilisation, runs_of, table


def test_linear_scaling_follows_the_combined_batch():
    assert two_wave_lr(0.05, "none", 800, 600) == 0.05
    assert two_wave_lr(0.05, "linear", 800, 600) == pytest.approx(0.075)
    assert two_wave_lr(0.05, "linear", 800, 400) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="--lr-scaling must be none or linear, got 'sqrt'"):
        two_wave_lr(0.05, "sqrt", 800, 600)


def _args(**kw):
    base = dict(group=8, stages=4, dataset="digits", hidden="16,16,16", cuts="1,2,3",
                micro_batch=4, samples=64, lr=0.02, momentum=0.9, timeout=60.0)
    return argparse.Namespace(**{**base, **kw})


def test_three_runs_gpipe_half_gpipe_same_and_ticktock():
    cfgs = runs_of(_args())
    assert [(c.schedule, c.group) for c in cfgs] == [("gpipe", 4), ("gpipe", 8), ("ticktock", 8)]
    with pytest.raises(ValueError, match="--group must be even and >= 2"):
        runs_of(_args(group=5))


def test_table_takes_ratios_within_each_repetition():
    rates = {("gpipe", 4): [100.0, 50.0], ("gpipe", 8): [120.0, 60.0], ("ticktock", 8): [150.0, 60.0]}
    stage = {"steady_utilisation": 0.5}
    results = [{"schedule": s, "group": g, "repeat": k, "samples_per_s": v, "samples": 64,
                "per_stage": [stage] * 4, "cpu_s": [0.1, 0.2, 0.16, 0.1]}
               for (s, g), vs in rates.items() for k, v in enumerate(vs)]
    rows = {(r["schedule"], r["group"]): r for r in table(results, _args(node_cpus=0.4))}
    tick = rows[("ticktock", 8)]
    assert tick["vs_gpipe_one_wave"] == pytest.approx((1.5 + 1.2) / 2)  # not 105 / 75 = 1.4
    assert tick["vs_gpipe_same_m"] == pytest.approx((1.25 + 1.0) / 2)
    assert tick["cpu_ms_per_sample"] == pytest.approx(1000 * 0.2 / 64)  # the busiest rank
    assert tick["budget_bound_samples_per_s"] == pytest.approx(0.4 * 64 / 0.2)
    assert tick["per_wave"] == 4 and rows[("gpipe", 4)]["per_wave"] == 4
    assert ideal_utilisation("gpipe", 4, 4) == pytest.approx(4 / 7)
    assert ideal_utilisation("gpipe", 4, 2) < ideal_utilisation("ticktock", 4, 4)
