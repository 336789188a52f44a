"""The carried-over threshold of TopK.select(key=...): the same exact top-k as a search, in
one pass where the threshold still fits, and a search where it does not."""

from __future__ import annotations

import torch

from thinwire import compress, topk


def _exact_set(x, k):
    return set(torch.topk(x.abs(), k).indices.tolist())


def test_hinted_selection_is_the_exact_top_k_step_after_step():
    g = torch.Generator().manual_seed(3)
    n, density = 200_000, 0.05
    k = compress.TopK(density).k(n)
    hinted = compress.TopK(density, selector="mstopk-carry")
    residual = torch.zeros(n, dtype=torch.float64)
    for step in range(6):
        x = torch.randn(n, generator=g, dtype=torch.float64) + residual
        values, indices = hinted.select(x.clone(), key=7)
        assert indices.numel() == k and set(indices.tolist()) == _exact_set(x, k)
        assert torch.equal(values, x[indices])
        residual = x.clone()
        residual[indices] = 0
    assert hinted.hints[7][0] == n and hinted.hints[7][1] > 0


def test_a_threshold_that_keeps_too_few_or_too_many_falls_back_to_the_search():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(4))
    k = 500
    assert topk.top_k_above(x, k, 100.0) == (None, None, 0)  # nothing passes
    assert topk.top_k_above(x, k, 0.0) == (None, None, 10_000)  # everything: 20 k
    values, indices, passed = topk.top_k_above(x, k, 1.5)
    assert k <= passed <= 4 * k and set(indices.tolist()) == _exact_set(x, k)
    selector = compress.TopK(0.05, selector="mstopk-carry")
    selector.hints[0] = (x.numel(), 100.0, 0.9)  # a stale hint: no entry passes, nor at 0.7x
    values, indices = selector.select(x, key=0)
    assert set(indices.tolist()) == _exact_set(x, k)
    assert selector.hints[0][2] < 0.9  # the margin widened after the miss
    selector.hints[1] = (5, 1.0, 0.9)  # a hint for another length is not used
    assert set(selector.select(x, key=1)[1].tolist()) == _exact_set(x, k)


def test_a_non_finite_entry_is_named_not_dropped():
    x = torch.randn(1000)
    x[17] = float("nan")
    try:
        topk.top_k_above(x, 10, 0.5)
    except ValueError as exc:
        assert "must be finite" in str(exc)
    else:
        raise AssertionError("a NaN passed silently")


def test_only_the_carry_selector_carries_a_threshold():
    # mstopk (the default) searches every time: the carried threshold made the LM workload's
    # step slower (docs/benchmarks.md), so it is a selector of its own, chosen per workload
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(5))
    plain = compress.TopK(0.05)
    plain.select(x, key=0)
    assert plain.hints == {}
    carry = compress.TopK(0.05, selector="mstopk-carry")
    carry.select(x, key=0)
    assert 0 in carry.hints
    assert set(topk.select(x, 100, "mstopk-carry")[1].tolist()) == _exact_set(x, 100)


def test_a_carried_threshold_a_little_off_is_corrected_by_one_retry_not_a_search(monkeypatch):
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(6))
    k = 1000
    kth = float(torch.topk(x.abs(), k).values.min())

    def no_search(*args, **kwargs):
        raise AssertionError("searched although a retry would do")

    for stale, direction in ((1.2 * kth, "too few passed"), (0.55 * kth, "too many passed")):
        selector = compress.TopK(0.05, selector="mstopk-carry")
        selector.hints[0] = (x.numel(), stale, 0.9)
        monkeypatch.setattr(topk, "select", no_search)
        values, indices = selector.select(x, key=0)
        monkeypatch.undo()
        assert set(indices.tolist()) == _exact_set(x, k), direction
        assert torch.equal(values, x[indices])
        # the margin moves the way of the retry: lower after too few, higher after too many
        assert (selector.hints[0][2] < 0.9) == (stale > kth), direction
