"""thinwire.topk: the selection contract, MSTopK against the paper's bisection, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thinwire import topk

METHODS = topk.METHODS


def assert_contract(x: torch.Tensor, k: int, values: torch.Tensor, indices: torch.Tensor):
    flat = x.reshape(-1)
    assert indices.dtype == torch.int64
    assert indices.numel() == k and values.numel() == k
    assert indices.unique().numel() == k, "indices must be unique"
    assert int(indices.min()) >= 0 and int(indices.max()) < flat.numel()
    assert values.dtype == x.dtype
    assert torch.equal(values, flat[indices]), "values must be the signed entries at indices"


# ----------------------------------------------------------------- input families (hypothesis)

def _tensor(kind: str, n: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        x = torch.randn(n, generator=g, dtype=torch.float64)
    elif kind == "laplace":
        u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
        x = -torch.sign(u) * torch.log1p(-2 * u.abs())
    elif kind == "heavy_ties":
        x = torch.randint(-3, 4, (n,), generator=g).to(torch.float64)
    elif kind == "all_equal":
        x = torch.full((n,), -0.5, dtype=torch.float64)
    elif kind == "mostly_zero":
        x = torch.zeros(n, dtype=torch.float64)
        hot = torch.randint(0, n, (max(1, n // 50),), generator=g)
        x[hot] = torch.randn(hot.numel(), generator=g, dtype=torch.float64)
    elif kind == "adversarial":  # one huge outlier, the rest tiny and tied: mean and max far apart
        x = torch.full((n,), 1e-3, dtype=torch.float64)
        x[::2] *= -1
        x[seed % n] = 3e4  # still finite in float16
    else:
        raise AssertionError(kind)
    return x.to(dtype)


KINDS = ["gaussian", "laplace", "heavy_ties", "all_equal", "mostly_zero", "adversarial"]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(KINDS), n=st.integers(1, 3000), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from(DTYPES), method=st.sampled_from(METHODS),
       k_fraction=st.floats(0.0, 1.0))
def test_contract_on_many_inputs(kind, n, seed, dtype, method, k_fraction):
    x = _tensor(kind, n, seed, dtype)
    k = max(1, min(n, math.ceil(k_fraction * n)))
    values, indices = topk.select(x, k, method)
    assert_contract(x, k, values, indices)
    # Every method here must capture the mass of the exact top-k on these small inputs, except
    # MSTopK, whose band fill is exact only up to the bisection's resolution.
    if method != "mstopk":
        reference = torch.topk(x.reshape(-1).abs().double(), k).values
        chosen = x.reshape(-1)[indices].abs().double().sort(descending=True).values
        assert torch.equal(chosen, reference)


@pytest.mark.parametrize("method", METHODS)
def test_multidimensional_input_indexes_the_flattened_tensor(method):
    x = torch.randn(7, 11, 3, generator=torch.Generator().manual_seed(1))
    values, indices = topk.select(x, 20, method)
    assert_contract(x, 20, values, indices)


# ----------------------------------------------------------------- MSTopK equals the paper


def paper_mstopk_thresholds(x: torch.Tensor, k: int, steps: int):
    """PAPERS.md section 1a, literally: one threshold per iteration, float64."""
    a = x.reshape(-1).abs().double()
    n = a.numel()
    mean, amax = a.mean(), a.max()
    low, high = 0.0, 1.0
    k1, thres1 = 0, math.inf
    k2, thres2 = n, 0.0
    for _ in range(steps):
        ratio = (low + high) / 2
        t = float(mean + ratio * (amax - mean))
        c = int((a >= t).sum())
        if c <= k:
            high = ratio
            if c > k1:
                k1, thres1 = c, t
        else:
            low = ratio
            if c < k2:
                k2, thres2 = c, t
    return thres1, thres2


@pytest.mark.parametrize("n,k,seed", [(50_000, 50, 0), (50_000, 500, 1), (400_000, 400, 2),
                                      (400_000, 4000, 3), (1_000, 1, 4), (1_000, 999, 5)])
@pytest.mark.parametrize("per_pass", [1, 7])
def test_mstopk_selects_what_the_papers_bisection_selects(n, k, seed, per_pass):
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    iterations = 30  # a multiple of both 1 and 3 bits per pass, so both run exactly 30 steps
    thres1, thres2 = paper_mstopk_thresholds(x, k, iterations)
    values, indices = topk.mstopk(x, k, iterations=iterations, thresholds_per_pass=per_pass)
    assert_contract(x, k, values, indices)
    a = x.abs()
    certain = (a >= thres1).nonzero().squeeze(1)
    band = ((a >= thres2) & (a < thres1)).nonzero().squeeze(1)
    fill = band[torch.topk(a[band], k - certain.numel()).indices]
    expected = torch.cat([certain, fill]).sort().values
    assert torch.equal(indices.sort().values, expected)


def test_mstopk_large_input_takes_the_working_set_path_and_stays_exact():
    # Above the hint threshold the CPU search runs on a compacted working set.
    n = 4 * 65536 * 2
    x = torch.randn(n, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    for k in (10, 500, 20_000):
        thres1, thres2 = paper_mstopk_thresholds(x, k, 30)
        values, indices = topk.mstopk(x, k, iterations=30)
        assert_contract(x, k, values, indices)
        assert bool((x.abs() >= thres1).sum() <= k)
        # Every certain entry is selected.
        certain = set((x.abs() >= thres1).nonzero().squeeze(1).tolist())
        assert certain <= set(indices.tolist())


@pytest.mark.parametrize("dist", ["gaussian", "laplace"])
@pytest.mark.parametrize("density", [0.001, 0.01, 0.1])
@pytest.mark.parametrize("method", METHODS)
def test_captured_mass_is_at_least_95_percent(dist, density, method):
    x = _tensor(dist, 1_000_000, 11, torch.float32)
    k = topk.k_for_density(x.numel(), density)
    _, indices = topk.select(x, k, method)
    assert topk.captured_mass(x, indices) >= 0.95


def test_captured_mass_of_the_exact_selection_is_one_and_of_the_smallest_is_low():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(3))
    _, best = topk.exact(x, 100)
    assert topk.captured_mass(x, best) == pytest.approx(1.0)
    worst = torch.topk(x.abs(), 100, largest=False).indices
    assert topk.captured_mass(x, worst) < 0.01


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [0, -1, 11])
def test_k_out_of_range_names_k(method, k):
    with pytest.raises(ValueError, match=r"k must be in \[1, numel=10\], got"):
        topk.select(torch.randn(10), k, method)


@pytest.mark.parametrize("method", METHODS)
def test_empty_tensor_is_rejected(method):
    with pytest.raises(ValueError, match="x must not be empty"):
        topk.select(torch.empty(0), 1, method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8])
def test_integer_and_bool_dtypes_are_rejected(method, dtype):
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        topk.select(torch.ones(10, dtype=dtype), 2, method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("n", [10, 1_000_000])
def test_nan_and_inf_are_never_selected_or_dropped_silently(method, bad, n):
    x = torch.randn(n)
    x[n // 3] = bad
    with pytest.raises(ValueError, match="x must be finite"):
        topk.select(x, 2, method)


@pytest.mark.parametrize("density", [0.0, -0.1, 1.5, math.nan])
def test_density_outside_unit_interval_is_rejected(density):
    with pytest.raises(ValueError, match=r"density must be in \(0, 1\], got"):
        topk.k_for_density(100, density)


def test_density_must_be_a_number():
    with pytest.raises(TypeError, match="density must be a number"):
        topk.k_for_density(100, "0.1")


def test_k_for_density_rounds_up_and_keeps_at_least_one():
    assert topk.k_for_density(1000, 0.01) == 10
    assert topk.k_for_density(1001, 0.01) == 11
    assert topk.k_for_density(5, 0.001) == 1
    assert topk.k_for_density(5, 1.0) == 5


def test_unknown_method_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="method must be one of auto, mstopk, mstopk-carry, exact, sampled, got 'fast'"):
        topk.select(torch.randn(10), 2, "fast")


@pytest.mark.parametrize("per_pass", [0, 2, 6, -1])
def test_mstopk_thresholds_per_pass_must_be_a_power_of_two_minus_one(per_pass):
    with pytest.raises(ValueError, match="thresholds_per_pass must be 2\\*\\*b - 1"):
        topk.mstopk(torch.randn(10), 2, thresholds_per_pass=per_pass)


def test_mstopk_iterations_must_be_positive():
    with pytest.raises(ValueError, match="iterations must be an int >= 1, got 0"):
        topk.mstopk(torch.randn(10), 2, iterations=0)


def test_sampled_is_reproducible_with_a_generator():
    x = torch.randn(500_000, generator=torch.Generator().manual_seed(0))
    a = topk.sampled(x, 300, generator=torch.Generator().manual_seed(5))[1]
    b = topk.sampled(x, 300, generator=torch.Generator().manual_seed(5))[1]
    assert torch.equal(a.sort().values, b.sort().values)


# ----------------------------------------------------------------- scale and devices


@pytest.mark.slow
def test_more_than_two_to_the_31_elements():
    n = 2**31 + 5
    try:
        x = torch.zeros(n, dtype=torch.float16)
    except RuntimeError as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"cannot allocate {n} float16 entries: {exc}")
    tail = torch.arange(1, 101, dtype=torch.float16)
    x[-100:] = tail  # the largest entries sit beyond index 2**31
    values, indices = topk.mstopk(x, 10)
    assert int(indices.min()) >= n - 10
    assert torch.equal(values, x[indices])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_mean_abs_of_a_long_tensor_matches_float64(dtype):
    # 2**24 + 3 entries: many CPU blocks and a ragged last one. A single float32 accumulator
    # came out 0.5% low here (9% at 2**26 entries).
    x = torch.randn(2**24 + 3, generator=torch.Generator().manual_seed(5),
                    dtype=torch.float64).to(dtype)
    expected = x.double().abs().mean().item()
    assert topk._mean_abs(x).item() == pytest.approx(expected, rel=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_contract(method, dtype):
    x = torch.randn(1_000_000, device="cuda").to(dtype)
    values, indices = topk.select(x, 1000, method)
    assert_contract(x, 1000, values, indices)
    assert topk.captured_mass(x, indices) >= 0.95


@pytest.mark.parametrize("n", [1, 63, 64, 1000, 70_001, 3 * (1 << 20) + 17])
@pytest.mark.parametrize("threshold", [0.0, 0.5, 3.0, 10.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_entries_at_least_matches_a_plain_comparison(n, threshold, dtype):
    # Covers the row screening, its dense-hit fallback, the ragged tail and block offsets.
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    t = torch.tensor(threshold, dtype=torch.float32)
    indices, magnitudes = topk.entries_at_least(x, t)
    expected = torch.nonzero(x.abs().float() >= t).squeeze(1)
    assert torch.equal(indices, expected)
    assert torch.equal(magnitudes, x.abs().float()[expected])
