"""Seeded Poisson failures in emulated time: exponential gaps with mean MTBF, a uniform shard."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from thinwire.recsys.cpr.overhead import check_n_emb, check_positive

MAX_EXPECTED_FAILURES = 1e6


@dataclass(frozen=True)
class Failure:
    time: float   # emulated seconds since the start of training
    shard: int    # the embedding shard whose node fails


def failure_schedule(mtbf: float, horizon: float, n_emb: int, seed: int) -> list[Failure]:
    """Every failure in [0, horizon): a Poisson process of rate 1/mtbf, the same for a seed."""
    mtbf = check_positive("mtbf", mtbf)
    horizon = check_positive("horizon", horizon, allow_zero=True)
    check_n_emb(n_emb)
    if horizon / mtbf > MAX_EXPECTED_FAILURES:  # also keeps the loop finite (t += tiny gaps)
        raise ValueError(f"horizon / mtbf = {horizon / mtbf:.3g} expected failures; at most "
                         f"{MAX_EXPECTED_FAILURES:g} allowed (mtbf={mtbf!r}, horizon={horizon!r})")
    rng = np.random.default_rng([seed, 0xC9])
    out, t = [], 0.0
    while True:
        t += float(rng.exponential(mtbf))
        if t >= horizon:
            return out
        out.append(Failure(t, int(rng.integers(n_emb))))
