"""auto's order where the steps to target were measured at several seeds
(thinwire.robust_choice): the least worst loss to a rival over the seeds first."""

from __future__ import annotations

import pytest

from thinwire import robust_choice


def test_the_lm_case_takes_the_candidate_that_never_lost_by_much():
    # compare's LM steps at seeds 0, 2, 3 (hitopk 80/130/85, PowerSGD 90/95/75) at one step
    # time each: hitopk's median is lower, but at seed 2 it took 1.37x PowerSGD's time
    times = {"hitopk": 85.0, "powersgd": 90.0}
    by_seed = {"hitopk": {"0": 80.0, "2": 130.0, "3": 85.0},
               "powersgd": {"0": 90.0, "2": 95.0, "3": 75.0}}
    taken, losses = robust_choice.order(times, by_seed)
    assert taken == ["powersgd", "hitopk"]
    assert losses["hitopk"] == pytest.approx(130 / 95)
    assert losses["powersgd"] == pytest.approx(90 / 80)


def test_one_seed_is_the_plain_ranking_by_predicted_time():
    times = {"a": 3.0, "b": 1.0, "c": None}
    taken, losses = robust_choice.order(times, {"a": {"0": 3.0}, "b": {"0": 1.0}})
    assert taken == ["b", "a"] and losses == {}


def test_a_candidate_seen_at_fewer_seeds_follows_the_compared_ones():
    """Its risk was never measured: it comes after every candidate measured at every seed,
    however fast its one seed was."""
    times = {"full": 10.0, "once": 5.0}
    by_seed = {"full": {"0": 10.0, "1": 10.0}, "once": {"0": 5.0}}
    taken, losses = robust_choice.order(times, by_seed)
    assert taken == ["full", "once"] and set(losses) == {"full"}


def test_equal_worst_losses_fall_back_to_the_predicted_time():
    times = {"a": 12.0, "b": 11.0}
    by_seed = {"a": {"0": 10.0, "1": 14.0}, "b": {"0": 14.0, "1": 10.0}}
    taken, losses = robust_choice.order(times, by_seed)
    assert losses["a"] == losses["b"] == pytest.approx(1.4)
    assert taken == ["b", "a"]


def test_the_best_at_every_seed_has_no_loss():
    by_seed = {"a": {"0": 1.0, "1": 2.0, "2": 3.0}, "b": {"0": 2.0, "1": 2.5, "2": 3.5}}
    assert robust_choice.worst_losses(by_seed) == {"a": 1.0, "b": pytest.approx(2.0)}
