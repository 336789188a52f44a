"""CPR overhead model, PLS, interval choice, failure schedule and argument checks."""

import math

import numpy as np
import pytest

from thinwire.recsys.cpr import (CPRConfig, TimeModel, best_full_interval, failure_schedule,
                                 full_overhead, interval_for_pls, partial_overhead, plan, pls)


def test_full_overhead_formula_and_best_interval():
    t_save, t_load, t_res, mtbf = 180.0, 150.0, 120.0, 72000.0
    best = best_full_interval(t_save, mtbf)
    assert best == pytest.approx(math.sqrt(2 * t_save * mtbf))
    assert full_overhead(t_save, t_load, t_res, mtbf, 3600) == pytest.approx(
        180 / 3600 + (150 + 120 + 1800) / 72000)
    grid = np.linspace(best / 4, best * 4, 401)
    values = [full_overhead(t_save, t_load, t_res, mtbf, t) for t in grid]
    assert grid[int(np.argmin(values))] == pytest.approx(best, rel=0.02)


def test_partial_overhead_and_pls():
    assert partial_overhead(180, 160, 120, 72000, 20000, 8) == pytest.approx(
        180 / 20000 + (160 / 8 + 120) / 72000)
    assert pls(20000, 8, 72000) == pytest.approx(20000 / (2 * 8 * 72000))
    assert interval_for_pls(0.02, 8, 72000) == pytest.approx(2 * 8 * 72000 * 0.02)
    assert pls(interval_for_pls(0.05, 4, 1000.0), 4, 1000.0) == pytest.approx(0.05)


def test_plan_chooses_partial_only_where_it_is_cheaper():
    p = plan(180, 180, 120, 72000, 8, 0.02)
    assert p.mode == "partial" and p.partial_overhead < p.full_overhead
    assert p.interval == p.partial_interval and p.pls == pytest.approx(0.02)
    tight = plan(180, 180, 120, 72000, 8, 1e-5)  # a tiny PLS target: many saves
    assert tight.mode == "full" and tight.interval == tight.full_interval and tight.pls == 0


def test_failure_schedule_is_reproducible_from_its_seed():
    a = failure_schedule(100.0, 1e5, 8, seed=3)
    assert a == failure_schedule(100.0, 1e5, 8, seed=3)
    assert a != failure_schedule(100.0, 1e5, 8, seed=4)
    times = np.array([f.time for f in a])
    assert (np.diff(times) > 0).all() and times[-1] < 1e5
    assert np.diff(times).mean() == pytest.approx(100.0, rel=0.05)  # ~1000 gaps
    shards = np.bincount([f.shard for f in a], minlength=8)
    assert shards.min() > 0.7 * len(a) / 8


@pytest.mark.parametrize("call, words", [
    (lambda: failure_schedule(-5.0, 100, 4, 0), ["mtbf", "-5.0", "> 0"]),
    (lambda: full_overhead(1, 1, 1, -1.0, 10), ["mtbf", "-1.0", "> 0"]),
    (lambda: TimeModel(t_step=1.0, mtbf=-3.0), ["mtbf", "-3.0", "> 0"]),
    (lambda: interval_for_pls(1.5, 8, 100), ["pls_target", "1.5", "(0, 1)"]),
    (lambda: plan(1, 1, 1, 100, 8, 0.0), ["pls_target", "0.0", "(0, 1)"]),
    (lambda: CPRConfig("halfway"), ["mode", "'halfway'", "full", "partial", "mfu", "ssu"]),
    (lambda: CPRConfig("partial", pls_target=-0.1), ["pls_target", "-0.1", "(0, 1)"]),
    (lambda: CPRConfig("partial", n_emb=0), ["n_emb", "0", ">= 1"]),
    (lambda: TimeModel(t_step=1.0, t_save=-2.0), ["t_save", "-2.0", ">= 0"]),
])
def test_bad_input_names_parameter_value_and_allowed(call, words):
    with pytest.raises(ValueError) as err:
        call()
    for word in words:
        assert word in str(err.value)
