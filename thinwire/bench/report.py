"""Shared output for benchmarks: a JSON file written atomically and a plain-text table."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence


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


def write_json_atomic(path: str | os.PathLike, payload: Any) -> None:
    """Write JSON to a temporary file beside `path`, then rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def save_if_asked(path: str | os.PathLike | None, payload: Any) -> None:
    """The ``--json PATH`` of every benchmark: write atomically and say where, or do nothing."""
    if path:
        write_json_atomic(path, payload)
        print(f"wrote {path}")


def format_table(rows: Sequence[dict], columns: Iterable[str]) -> str:
    """A fixed-width table of `rows` restricted to `columns`; floats get 4 significant digits."""
    columns = list(columns)

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    cells = [[cell(row.get(col, "")) for col in columns] for row in rows]
    widths = [max([len(col)] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]
    lines = ["  ".join(col.rjust(w) for col, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)
