"""Output every command shares: JSON written atomically, plain-text tables, and the check that
an output path can be written, made before the work starts.

It sits at the bottom of the package (it imports nothing of thinwire), so the cluster, data,
recommender, simulator and training code can all use it without importing the benchmarks.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence


def _default_mode() -> int:
    """0666 less the umask: what ``open()`` would give a new file (mkstemp gives 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


MAX_INPUT_BYTES = 64 * 2**20  # a configuration or result file far larger than any we write


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # 1e400 parses to inf
        raise ValueError(f"the number {text} is out of range (not a finite float)")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a setting may hold")


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """A user's JSON file (a config, results, a layer table), parsed strictly: a clear
    ValueError naming the path for a file that is too large, malformed, nested too deep, or
    holds NaN, Infinity or a number beyond float (1e400), instead of a RecursionError,
    an OverflowError later, or a NaN accepted as a value."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise FileNotFoundError(f"{what} {path}: {exc.strerror}") from None
    if size > MAX_INPUT_BYTES:
        raise ValueError(f"{what} {path}: {size} bytes, more than the {MAX_INPUT_BYTES} a "
                         f"{what} may have")
    try:
        return json.loads(path.read_text(), parse_float=_finite_float,
                          parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"{what} {path}: nested too deeply to be a {what}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {path}: not valid JSON ({exc})") from None


class OutputPathError(ValueError):
    """An output file that cannot be written, named by the path the user gave."""


def finite_json(value: Any) -> Any:
    """``value`` with every float that is not finite (a diverged run's NaN loss) as None:
    JSON has no NaN, and a file holding one is refused by :func:`read_json` (thinwire plan's
    --calibrate, auto's --plan-from) and by strict parsers (jq)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(item) for item in value]
    return value


def write_json_atomic(path: str | os.PathLike, payload: Any) -> None:
    """Write JSON (every non-finite float as null: :func:`finite_json`) atomically
    (:func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(finite_json(payload), indent=2, allow_nan=False) + "\n")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename: never a half-written
    file. The file gets the usual mode for a new file (not mkstemp's private 0600). A failure
    is reported with ``path``, not the temporary file's name."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise OutputPathError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _default_mode())
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise OutputPathError(f"cannot write {path}: {exc.strerror}") from None
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> None:
    """``fig.savefig`` to a temporary file beside ``path``, then rename: a reader (a report,
    a browser) never finds half a PNG. The format is ``path``'s suffix."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or None)
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


def check_output_dir(path: str | os.PathLike, param: str) -> Path:
    """Check, before any work, that a folder can be written at ``path`` (created where
    missing): not empty, not a file, not under a file, writable; refused with the path the
    user gave and ``param``, the option that gave it."""
    target = Path(path)
    if str(path) == "":
        raise OutputPathError(f"{param} '': expected a folder path, got an empty string")
    if target.exists() and not target.is_dir():
        raise OutputPathError(f"{param} {path}: is a file, expected a folder")
    _writable_folder(target, path, param, ".")
    return target


def check_output_path(path: str | os.PathLike | None, param: str) -> Path | None:
    """Check, before any work, that a file can be written at ``path`` (``None``: no output).

    Missing folders are created (the documented commands write under ``results/``); a path
    that is a folder, under a file, or on something that cannot be written is refused with
    the path the user gave."""
    if path is None:
        return None
    target = Path(path)
    if str(path) == "" or target.is_dir():
        raise OutputPathError(f"{param} {str(path)!r}: expected a file path, got "
                              f"{'an empty string' if str(path) == '' else 'a folder'}")
    _writable_folder(target.parent, path, param, f".{target.name}.")
    return target


def _writable_folder(folder: Path, path, param: str, prefix: str) -> None:
    """``folder`` made where missing and written to (a probe file), else an OutputPathError
    naming ``param`` and the ``path`` the user gave."""
    ancestor = folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputPathError(f"{param} {path}: {ancestor} is a file, so no folder can be "
                              "created under it")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=prefix, suffix=".probe"):
            pass  # a write test: permissions alone do not tell root about read-only mounts
    except OSError as exc:
        raise OutputPathError(f"{param} {path}: cannot be written ({exc.strerror})") from None
