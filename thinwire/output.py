"""Output every command shares: JSON written atomically, and plain-text tables.

It sits at the bottom of the package (it imports nothing of thinwire), so the cluster, data,
recommender, simulator and training code can all use it without importing the benchmarks.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence


def _default_mode() -> int:
    """0666 less the umask: what ``open()`` would give a new file (mkstemp gives 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_json_atomic(path: str | os.PathLike, payload: Any) -> None:
    """Write JSON to a temporary file beside ``path``, then rename: never a half-written file.
    The file gets the usual mode for a new file (not mkstemp's private 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _default_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def format_table(rows: Sequence[dict], columns: Iterable[str]) -> str:
    """A fixed-width table of ``rows`` restricted to ``columns``; floats get 4 significant
    digits, missing values print as ``-``."""
    columns = list(columns)

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    cells = [[cell(row.get(col)) for col in columns] for row in rows]
    widths = [max([len(col)] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]
    lines = ["  ".join(col.rjust(w) for col, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)
