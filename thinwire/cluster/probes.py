"""Where the measuring programs of `thinwire cluster check` (and the benchmarks) live.

The probes' socket programs use the standard library only: run as a file, they start without
importing the thinwire package (and torch), seconds faster on a loaded machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROBE_SCRIPT = str(Path(__file__).with_name("probe.py"))


def probe_argv(prefix: list[str], *args: str) -> list[str]:
    """``prefix`` (a namespace's exec prefix, or []) + python probe.py ARGS."""
    return prefix + [sys.executable, PROBE_SCRIPT, *args]
