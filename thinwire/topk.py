"""Top-k selection by magnitude: exact, MSTopK (multiple-sampling bisection) and sampled.

Every method returns exactly ``k`` entries of ``x.flatten()`` chosen by magnitude:
``(values, indices)`` with ``indices`` int64 and unique and ``values == x.flatten()[indices]``
(signed). A fixed k is what lets the sparse all-gather skip a size exchange.

MSTopK (PAPERS.md section 1a) searches a magnitude threshold ``t = mean + ratio * (max - mean)``
by bisection on ``ratio``. thinwire's version returns what the paper's N-step bisection returns,
computed with less work:

* several thresholds per pass: each pass counts ``2**b - 1`` evenly spaced candidate ratios at
  once, which is ``b`` bisection steps in one pass over the data (the bisection path only ever
  visits those dyadic ratios, so the outcome is identical);
* a shrinking working set: a count at a threshold ``t`` only needs the entries ``>= t``. Once a
  threshold with more than k entries is known, the search continues on those entries alone. On
  the CPU the first working set comes from a deterministic strided sample (a hint only: the exact
  count of the compacted set is checked, so the hint never changes the result);
* the ratio interval is updated with tensor operations, so the loop reads nothing back to the
  host on a GPU (the CPU path re-compacts between passes, where reads are free).

Band filling: entries ``>= thres1`` (k1 of them, fewer than or equal to k) are certain; the
remaining ``k - k1`` are the largest-magnitude entries of the band ``thres2 <= |x| < thres1``
(ties broken by torch.topk). After N steps the band is narrow, so it is small and any choice in
it would lose little mass; taking the largest costs a top-k over the band only.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# "mstopk-carry": mstopk, except that the sparse algorithms first try the threshold carried from
# the bucket's previous selection (compress.TopK.select; a plain call searches as mstopk does)
# "auto" (the default): torch.topk ("exact") on a GPU, "mstopk" on the CPU. On an H100 a 25 MiB
# bucket (6.55M fp32 entries, k = 1%) took 0.46 ms with torch.topk and 6.2 ms with thinwire's
# MSTopK, whose ~30 small tensor operations a pass are bound by their launches there; on the
# CPU MSTopK's shrinking working set is what beats torch.topk (docs/results.md, "Top-k
# selection on an H100"; decision record 032).
METHODS = ("auto", "mstopk", "mstopk-carry", "exact", "sampled")


def resolve(method: str, device: torch.device) -> str:
    """The selector that ``method`` names on ``device`` ("auto" picks by device type)."""
    if method == "auto":
        return "mstopk" if device.type in ("cpu", "meta") else "exact"
    return method


def check_selector_options(method: str, options: dict) -> None:
    """Selector options belong to one named selector: "auto" takes none."""
    if method == "auto" and options:
        raise ValueError(f"selector options {sorted(options)} need a named selector; 'auto' "
                         "picks exact or mstopk by device, so name one of them")

# Entries per block when the CPU streams over a large tensor: small enough that temporaries stay
# in cache and come from the allocator's reused heap instead of fresh (page-faulting) mappings.
_CPU_BLOCK = 1 << 20
# Entries per row when screening a block for entries above a threshold (see _above_in_rows).
_ROW = 64
# Screening rows pays while fewer than ~1/8 of them hold a hit: with hits spread evenly that is
# fewer hits than numel / (8 * _ROW) (at 5% density nearly every row of 64 holds one).
_DENSE_HITS = 8 * _ROW
# Size of the deterministic strided sample that places the first working set on the CPU.
_HINT_SAMPLE = 1 << 16
# Elements x thresholds compared at once when counting; bounds the temporary boolean matrix.
_COUNT_BLOCK = 1 << 24
# The same on a GPU (a boolean matrix of up to 256 MiB): its memory is no cache to stay in.
_DEVICE_COUNT_BLOCK = 1 << 28


# --------------------------------------------------------------------------- validation


def validate_density(density: float, name: str = "density") -> float:
    if isinstance(density, bool) or not isinstance(density, (int, float)):
        raise TypeError(f"{name} must be a number in (0, 1], got {density!r}")
    if not (0.0 < float(density) <= 1.0) or math.isnan(float(density)):
        raise ValueError(f"{name} must be in (0, 1], got {density}")
    return float(density)


def k_for_density(numel: int, density: float) -> int:
    """Entries to keep for a tensor of ``numel`` entries: ``ceil(density * numel)``, at least 1."""
    density = validate_density(density)
    if numel < 1:
        raise ValueError(f"numel must be >= 1, got {numel}")
    return k_unchecked(numel, density)


def k_unchecked(numel: int, density: float) -> int:
    """:func:`k_for_density` for a density checked where it entered (the per-bucket hot path)."""
    return min(numel, max(1, math.ceil(density * numel)))


def _flat_checked(x: torch.Tensor, k: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"x must have a floating dtype (float16, bfloat16, float32, float64), got {x.dtype}")
    if x.numel() == 0:
        raise ValueError("x must not be empty, got a tensor with 0 elements")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {k!r}")
    if not 1 <= k <= x.numel():
        raise ValueError(f"k must be in [1, numel={x.numel()}], got {k}")
    return x.reshape(-1)


def _raise_if_not_finite(lo: torch.Tensor, hi: torch.Tensor) -> None:
    # min and max propagate NaN and reach +-inf when any entry does: one cheap pass tells all.
    if not (torch.isfinite(lo) and torch.isfinite(hi)):
        raise ValueError(
            "x must be finite, got NaN or Inf entries (a NaN gradient is never selected or "
            "dropped silently: find where it came from, or skip the step as GradScaler does)")


def _abs_max(flat: torch.Tensor) -> torch.Tensor:
    lo, hi = torch.aminmax(flat)
    _raise_if_not_finite(lo, hi)
    return torch.maximum(lo.abs(), hi.abs())


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    # float32 holds every float16 and bfloat16 value exactly, so counts are unchanged.
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------- exact


def exact(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by magnitude (``torch.topk(x.abs(), k, sorted=False)``)."""
    flat = _flat_checked(x, k)
    _abs_max(flat)
    _, indices = torch.topk(flat.abs(), k, sorted=False)
    return flat[indices], indices


# --------------------------------------------------------------------------- helpers


def entries_at_least(flat: torch.Tensor, threshold: torch.Tensor, expected: int | None = None):
    """``(indices, magnitudes)`` of the entries with ``|x| >= threshold``, streamed in blocks.

    Indices are int64 and ascending; magnitudes come in the threshold's dtype. The comparison
    runs in the threshold's dtype: comparing a float16 tensor with a float32 scalar would round
    the scalar to float16 and change the count. ``expected``: about how many entries the caller
    expects to pass; where that many would leave few rows without a hit, the row screening of
    :func:`_above_in_rows` is skipped (it would read the data twice more and then compare
    every entry all the same).
    """
    screen = expected is None or expected * _DENSE_HITS < flat.numel()
    if flat.device.type != "cpu" or flat.numel() <= _CPU_BLOCK:
        return _above_in_rows(flat, threshold, 0, screen)
    parts = [_above_in_rows(flat[start:start + _CPU_BLOCK], threshold, start, screen)
             for start in range(0, flat.numel(), _CPU_BLOCK)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _above_in_rows(block: torch.Tensor, threshold: torch.Tensor, offset: int,
                   screen: bool = True):
    """Screen rows of ``_ROW`` entries by their largest magnitude (max and -min, no |x| copy),
    then compare entries only in the rows that can hold a hit. With few hits (the top-k case)
    this reads the block once and touches almost nothing else: about 7x faster on the CPU than
    ``nonzero(|block| >= t)``, which writes a full |x| and a full mask first. With
    ``screen=False`` every entry is compared at once (for hits dense enough to be in most
    rows)."""
    whole = block.numel() - block.numel() % _ROW
    rows = block[:whole].view(-1, _ROW)
    if screen:
        peaks = torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg()).to(threshold.dtype)
        hit_rows = torch.nonzero(peaks >= threshold).squeeze(1)
    if not screen or hit_rows.numel() * 8 > rows.shape[0]:  # dense hits: compare all
        magnitudes = block.abs().to(threshold.dtype)
        indices = torch.nonzero(magnitudes >= threshold).squeeze(1)
        return indices + offset, magnitudes[indices]
    candidates = rows[hit_rows].abs().to(threshold.dtype)
    row, col = torch.nonzero(candidates >= threshold, as_tuple=True)
    indices = hit_rows[row] * _ROW + col
    magnitudes = candidates[row, col]
    if whole < block.numel():  # the ragged end, compared directly
        tail = block[whole:].abs().to(threshold.dtype)
        local = torch.nonzero(tail >= threshold).squeeze(1)
        indices = torch.cat([indices, local + whole])
        magnitudes = torch.cat([magnitudes, tail[local]])
    return indices + offset, magnitudes


def _mean_abs(flat: torch.Tensor) -> torch.Tensor:
    """Mean of |x|, read once without materialising |x|. On the CPU it streams in blocks whose
    1-norms are added in float64: one float32 sum over 2**26 normal entries came out 9% low (its
    running total outgrew the addends' precision), and a float16 tensor's norm with a float32
    accumulator ran 4x slower than the blocks (12.8 s for 2**31 entries)."""
    work = _work_dtype(flat.dtype)
    if flat.device.type != "cpu" or flat.numel() <= _CPU_BLOCK:
        return torch.linalg.vector_norm(flat, 1, dtype=work) / flat.numel()
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, flat.numel(), _CPU_BLOCK):
        total += torch.linalg.vector_norm(flat[start:start + _CPU_BLOCK].to(work), 1)
    return (total / flat.numel()).to(work)


def _count_at_least(values: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """``counts[j] = #(values >= thresholds[j])`` for every threshold, in blocks of elements
    (on a GPU in few large blocks: each block is kernel launches, not cache misses)."""
    block = _COUNT_BLOCK if values.device.type == "cpu" else _DEVICE_COUNT_BLOCK
    step = max(1, block // max(1, thresholds.numel()))
    counts = torch.zeros(thresholds.numel(), dtype=torch.int64, device=values.device)
    column = thresholds.unsqueeze(1)
    for start in range(0, values.numel(), step):
        counts += torch.count_nonzero(values[start:start + step].unsqueeze(0) >= column, dim=1)
    return counts


# --------------------------------------------------------------------------- MSTopK


def mstopk(x: torch.Tensor, k: int, iterations: int = 30,
           thresholds_per_pass: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """MSTopK approximate top-k (see the module docstring).

    ``iterations`` is the paper's N (bisection steps); ``thresholds_per_pass`` (``2**b - 1``)
    candidate thresholds are counted per pass, so ``ceil(N / b)`` passes run.
    """
    flat = _flat_checked(x, k)
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")
    bits = (thresholds_per_pass + 1).bit_length() - 1
    if (isinstance(thresholds_per_pass, bool) or not isinstance(thresholds_per_pass, int)
            or thresholds_per_pass < 1 or 2 ** bits - 1 != thresholds_per_pass):
        raise ValueError(
            f"thresholds_per_pass must be 2**b - 1 (1, 3, 7, 15, ...), got {thresholds_per_pass!r}")
    n = flat.numel()
    amax = _abs_max(flat)
    if k == n or amax == 0:  # everything, or all zeros: any k entries are a top-k
        indices = torch.arange(k, device=flat.device)
        return flat[indices], indices
    work = _work_dtype(flat.dtype)
    mean = _mean_abs(flat).to(work)
    amax = amax.to(work)
    search = _ThresholdSearch(mean, amax, k, thresholds_per_pass)

    if flat.device.type == "cpu":
        members, magnitudes = _first_working_set(flat, k, search)
    else:  # the GPU counts on all entries: no host read to size a working set
        members, magnitudes = None, flat.abs().to(work)
    for _ in range(math.ceil(iterations / bits)):
        search.count_pass(magnitudes)
        if members is not None:
            members, magnitudes = search.shrink(members, magnitudes)

    if members is None:
        members, magnitudes = entries_at_least(flat, search.thres2)
    return _fill_from_band(flat, members, magnitudes, search.thres1, k)


def _first_working_set(flat: torch.Tensor, k: int, search: "_ThresholdSearch"):
    """Entries above a threshold known (by an exact count) to keep more than k of them; all
    entries when no small such set is found (the passes then shrink it as they go)."""
    n = flat.numel()
    work = search.mean.dtype
    if n > 4 * _HINT_SAMPLE:
        stride = n // _HINT_SAMPLE
        sample = flat[::stride].abs().to(work)
        # Aim for about twice k entries; a miss only costs a second, lower try.
        for factor in (2.0, 8.0):
            rank = min(sample.numel(), math.ceil(factor * k * sample.numel() / n) + 16)
            guess = torch.topk(sample, rank, sorted=False).values.min()
            # Every threshold the search tests is positive, so zeros never need to be kept.
            guess = torch.clamp(guess, min=torch.finfo(work).tiny)
            members, magnitudes = entries_at_least(flat, guess)
            if k < members.numel() <= n // 4:
                search.known_floor = guess
                return members, magnitudes
    return torch.arange(n), flat.abs().to(work)


def _fill_from_band(flat, members, magnitudes, upper, k):
    """The certain entries (``>= upper``), then the largest of the band below them."""
    certain = magnitudes >= upper
    n_certain = int(certain.sum())
    if n_certain > k:  # cannot happen with exact counts; guards the contract regardless
        certain = torch.zeros_like(certain)
        n_certain = 0
    band_magnitudes = magnitudes[~certain]
    _, fill = torch.topk(band_magnitudes, k - n_certain, sorted=False)
    indices = torch.cat([members[certain], members[~certain][fill]])
    return flat[indices], indices


class _ThresholdSearch:
    """The paper's bisection state on ``ratio``, advanced ``b`` steps per counting pass.

    ``low``/``high`` bracket the ratio; ``(k1, thres1)`` is the best threshold keeping <= k
    entries (the certain set), ``thres2`` the best keeping > k (the band's floor). All are
    tensors, so a pass never reads back to the host.
    """

    def __init__(self, mean, amax, k, per_pass):
        self.mean, self.amax, self.k = mean, amax, k
        self.per_pass = per_pass
        device, dtype = mean.device, mean.dtype
        self.low = torch.zeros((), dtype=dtype, device=device)
        self.high = torch.ones((), dtype=dtype, device=device)
        self.thres1 = torch.full((), math.inf, dtype=dtype, device=device)
        self.thres2 = torch.zeros((), dtype=dtype, device=device)
        self.known_floor = None  # a threshold with an exact count > k, under the working set
        self._steps = torch.arange(1, per_pass + 1, dtype=dtype, device=device) / (per_pass + 1)

    def threshold(self, ratio):
        return self.mean + ratio * (self.amax - self.mean)

    def count_pass(self, values):
        ratios = self.low + (self.high - self.low) * self._steps
        thresholds = self.threshold(ratios)
        counts = _count_at_least(values, thresholds)
        if self.known_floor is not None:
            # Below the working set's floor every threshold keeps more than k entries.
            counts = torch.where(thresholds <= self.known_floor,
                                 torch.full_like(counts, self.k + 1), counts)
        above = counts > self.k  # true for a prefix: counts fall as the threshold rises
        n_above = above.sum()
        last_above = (n_above - 1).clamp(min=0).view(1)
        first_at_most = n_above.clamp(max=self.per_pass - 1).view(1)
        has_above, has_at_most = n_above > 0, n_above < self.per_pass
        # gather, not ratios[t]: indexing by a 0-d tensor reads it to the host, a device
        # synchronisation per pick (four a pass: on an H100 they made the search 20x slower)
        self.low = torch.where(has_above, ratios.gather(0, last_above)[0], self.low)
        self.thres2 = torch.where(has_above, thresholds.gather(0, last_above)[0], self.thres2)
        self.high = torch.where(has_at_most, ratios.gather(0, first_at_most)[0], self.high)
        self.thres1 = torch.where(has_at_most, thresholds.gather(0, first_at_most)[0],
                                  self.thres1)

    def shrink(self, members, magnitudes):
        """Drop working-set entries under the band's floor (CPU: the read-back is free)."""
        keep = magnitudes >= self.thres2
        if int(keep.sum()) * 2 <= members.numel():
            members, magnitudes = members[keep], magnitudes[keep]
            self.known_floor = (self.thres2 if self.known_floor is None
                                else torch.maximum(self.thres2, self.known_floor))
        return members, magnitudes


# --------------------------------------------------------------------------- sampled


def sampled(x: torch.Tensor, k: int, sample_fraction: float = 0.005,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Threshold estimated from a random sample, then exact top-k of the entries above it.

    The DGC family: the k*fraction-th largest magnitude of a random sample estimates the
    threshold; entries above a slightly lower threshold are gathered in one pass and an exact
    top-k among them gives the answer. If fewer than k pass, the threshold is lowered and the
    pass repeated, so the result is always exactly k entries.
    """
    flat = _flat_checked(x, k)
    if not isinstance(sample_fraction, (int, float)) or not 0.0 < sample_fraction <= 1.0:
        raise ValueError(f"sample_fraction must be in (0, 1], got {sample_fraction!r}")
    n = flat.numel()
    _abs_max(flat)
    size = min(n, max(1024, math.ceil(sample_fraction * n)))
    if size >= n // 2:
        return exact(flat, k)
    positions = torch.randint(0, n, (size,), generator=generator, device="cpu").to(flat.device)
    sample = flat[positions].abs().to(torch.float64)
    for factor in (1.5, 4.0, 16.0):
        rank = min(size, math.ceil(factor * k * size / n) + 8)
        guess = torch.topk(sample, rank, sorted=False).values.min().to(flat.dtype)
        candidates, magnitudes = entries_at_least(flat, guess)
        if candidates.numel() >= k:
            _, pos = torch.topk(magnitudes, k, sorted=False)
            return flat[candidates[pos]], candidates[pos]
    return exact(flat, k)


# --------------------------------------------------------------------------- with a hint


def top_k_above(x: torch.Tensor, k: int, threshold: float, most: float = 4.0):
    """The exact top-k of ``x`` found among the entries with ``|x| >= threshold`` (one pass and
    a top-k over those). Returns ``(values, indices, passed)``, ``passed`` the number of
    entries at or above the threshold; values and indices are None where that set holds fewer
    than k entries (it then cannot hold the top-k) or more than ``most * k`` (the top-k over it
    would cost more than a search): ``passed`` then says which way the threshold missed.

    A threshold carried over from the previous step of the same bucket (error feedback keeps
    the magnitudes' distribution steady from step to step) makes this one pass, where MSTopK
    needs several; the result is the same exact top-k (up to ties)."""
    flat = _flat_checked(x, k)
    work = _work_dtype(flat.dtype)
    if not bool(torch.isfinite(flat.sum(dtype=work))):  # NaN/Inf: the full check names it
        _abs_max(flat)
    members, magnitudes = entries_at_least(flat, torch.tensor(threshold, dtype=work), k)
    count = members.numel()
    if count < k or count > most * k:
        return None, None, count
    indices = _ascending_subset(members, torch.topk(magnitudes, k, sorted=False).indices)
    return flat[indices], indices, count


def _ascending_subset(members: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """``members[chosen]`` (members ascending, chosen unique positions) in ascending order, by a
    mask over the members rather than a sort: the packed wire format needs its indices
    ascending, and a mask costs a fraction of sorting k int64 (0.7 against 1.9 ms for 80k of
    100k on this CPU, counting pack's sort)."""
    mask = torch.zeros(members.numel(), dtype=torch.bool, device=members.device)
    mask[chosen] = True
    return members[mask]


# --------------------------------------------------------------------------- front door

_SELECTORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "mstopk": mstopk, "mstopk-carry": mstopk, "exact": exact, "sampled": sampled,
}


def select(x: torch.Tensor, k: int, method: str = "mstopk",
           **options) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k by magnitude with the named method (one of METHODS; "mstopk-carry" searches as
    "mstopk": the carried threshold lives in compress.TopK, per bucket)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    check_selector_options(method, options)
    return _SELECTORS[resolve(method, x.device)](x, k, **options)


def captured_mass(x: torch.Tensor, indices: torch.Tensor) -> float:
    """Squared L2 mass of ``x`` at ``indices`` over that of the exact top-k (k = len(indices))."""
    flat = x.reshape(-1).to(torch.float64)
    k = indices.numel()
    if k == 0:
        raise ValueError("indices must not be empty")
    best = torch.topk(flat.abs(), k, sorted=False).values.square().sum()
    if best == 0:
        return 1.0
    return float(flat[indices].square().sum() / best)
