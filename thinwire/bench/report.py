"""What every benchmark shares: timing by the median, and its ``--json`` output."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

from thinwire.output import format_table, write_json_atomic

__all__ = ["format_table", "median_time", "save_if_asked", "write_json_atomic"]


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 1,
                sync: Callable[[], None] | None = None) -> float:
    """Median wall time of `fn` over `repeats` runs, after `warmup` untimed runs."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def save_if_asked(path: str | os.PathLike | None, payload: Any) -> None:
    """The ``--json PATH`` of every benchmark: write atomically and say where, or do nothing."""
    if path:
        write_json_atomic(path, payload)
        print(f"wrote {path}")
