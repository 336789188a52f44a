"""A comparison's runs grouped by link rate: what the tables (report.py) and the figures
(report_plots.py) both read, kept apart so that neither module imports the other."""

from __future__ import annotations

import math
from collections import defaultdict

from thinwire.cluster import parse_rate


def rate_bps(rate: str) -> float:
    """A run's ``inter_node_bandwidth`` in bit/s; "none" (unshaped) is infinitely fast."""
    return math.inf if rate == "none" else float(parse_rate(rate))


def by_rate(runs: list[dict]) -> dict[str, list[dict]]:
    """Runs by their ``inter_node_bandwidth``, rates in order of first appearance."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for run in runs:
        groups[run["inter_node_bandwidth"]].append(run)
    return dict(groups)
