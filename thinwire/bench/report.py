"""What every benchmark shares: timing by the median, and its ``--json`` output."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

from thinwire.output import format_table, write_json_atomic

__all__ = ["format_table", "median_time", "run_cluster_worker", "save_if_asked",
           "write_json_atomic"]


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


def run_cluster_worker(spec, module: str, args: list[str], timeout_s: float) -> dict:
    """Runs ``python -m module --out FILE *args`` on every rank of the emulated cluster ``spec``
    and returns the JSON its rank 0 wrote to FILE (a benchmark's worker side)."""
    from thinwire.cluster import run as run_on_cluster

    with tempfile.TemporaryDirectory(prefix="thinwire-bench-") as tmp:
        out = os.path.join(tmp, "rows.json")
        status = run_on_cluster(spec, ["-m", module, "--out", out, *args], timeout_s=timeout_s,
                                output=sys.stderr)
        if status != 0:
            raise RuntimeError(f"the benchmark ranks of {module} failed with exit status {status}")
        with open(out) as handle:
            return json.load(handle)
