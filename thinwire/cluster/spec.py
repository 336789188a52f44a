"""What an emulated cluster looks like: `ClusterSpec` and the parsing of rates, latencies, loss.

All checks happen here, before anything touches the system, so that a bad argument fails with a
message naming the parameter, the value and what is allowed - and nothing needs cleaning up.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Decimal units, as tc reads them ("mbit" = 10**6 bit/s). tc's "bps" means *bytes* per second,
# which is a classic source of 8x mistakes, so it is deliberately not accepted.
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
LATENCY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}

MIN_RATE_BPS = 10**5           # 100kbit: below this HTB's quanta make the rate coarse
MAX_RATE_BPS = 100 * 10**9     # 100gbit: far above what a veth pair can carry anyway
MAX_LATENCY_S = 10.0
MAX_NODES = 250                # node i gets 10.77.0.(i+1) on a /24
MAX_RANKS_PER_NODE = 256

_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z%]*)\s*$", re.IGNORECASE)


def _split(param: str, value: object, example: str, units: str) -> tuple[float, str]:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{param} must be a string like {example} ({units}), got {value!r}")
    match = _NUMBER_UNIT.match(value)
    if not match:
        raise ValueError(f"{param} must be a number followed by a unit, like {example} "
                         f"({units}), got {value!r}")
    return float(match.group(1)), match.group(2).lower()


def parse_rate(value: str, param: str = "bandwidth") -> int:
    """'100mbit' -> 100_000_000 (bits per second). Units: bit, kbit, mbit, gbit, tbit."""
    units = "units: " + ", ".join(RATE_UNITS)
    number, unit = _split(param, value, "'100mbit' or '1gbit'", units)
    if unit not in RATE_UNITS:
        what = f"unknown unit {unit!r}" if unit else "missing unit"
        raise ValueError(f"{param}: {what} in {value!r}; allowed {units}")
    bps = number * RATE_UNITS[unit]
    if not (MIN_RATE_BPS <= bps <= MAX_RATE_BPS):
        raise ValueError(f"{param} must be between {format_rate(MIN_RATE_BPS)} and "
                         f"{format_rate(MAX_RATE_BPS)}, got {value!r}")
    return int(round(bps))


def parse_latency(value: str, param: str = "latency") -> float:
    """'0.5ms' -> 0.0005 (seconds). Units: us, ms, s."""
    units = "units: " + ", ".join(LATENCY_UNITS)
    number, unit = _split(param, value, "'0.5ms' or '20ms'", units)
    if unit not in LATENCY_UNITS:
        what = f"unknown unit {unit!r}" if unit else "missing unit"
        raise ValueError(f"{param}: {what} in {value!r}; allowed {units}")
    seconds = number * LATENCY_UNITS[unit]
    if seconds > MAX_LATENCY_S:
        raise ValueError(f"{param} must be between 0 and {MAX_LATENCY_S:g}s, got {value!r}")
    return seconds


def parse_loss(value: str | float | int, param: str = "loss") -> float:
    """'1%', '1' or 1.0 -> 1.0 (percent of packets dropped on each shaped hop), in [0, 100)."""
    if isinstance(value, bool):
        raise ValueError(f"{param} must be a percentage in [0, 100), got {value!r}")
    if isinstance(value, (int, float)):
        percent = float(value)
    else:
        text = value.strip().rstrip("%") if isinstance(value, str) else None
        try:
            percent = float(text)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"{param} must be a percentage like '0.1%' or '1', "
                             f"in [0, 100), got {value!r}") from None
    if not (math.isfinite(percent) and 0.0 <= percent < 100.0):
        raise ValueError(f"{param} must be a percentage in [0, 100), got {value!r}")
    return percent


def format_rate(bps: float) -> str:
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bps >= RATE_UNITS[unit]:
            return f"{bps / RATE_UNITS[unit]:.4g}{unit}"
    return f"{bps:.4g}bit"


def format_latency(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.4g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.4g}ms"
    return f"{seconds * 1e6:.4g}us"


def _check_count(name: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise ValueError(f"{name} must be an integer between 1 and {maximum}, got {value!r}")


@dataclass(frozen=True)
class ClusterSpec:
    """An emulated cluster: `nodes` machines with `ranks_per_node` ranks each.

    inter_node_bandwidth: each node's link to the switch, both directions ('1gbit'); None = unshaped.
    inter_node_latency: one-way node-to-node latency ('0.5ms'); half of it on each hop.
    intra_node_bandwidth: rate of each node's loopback, i.e. between ranks of one node.
    loss: percent of packets dropped on each shaped hop of the inter-node path.
    shaping: False runs the same launch on 127.0.0.1 without namespaces or tc (no root needed).
    """

    nodes: int
    ranks_per_node: int
    inter_node_bandwidth: str | None = "1gbit"
    inter_node_latency: str | None = None
    intra_node_bandwidth: str | None = None
    loss: str | float | None = None
    shaping: bool = True

    def __post_init__(self) -> None:
        _check_count("nodes", self.nodes, MAX_NODES)
        _check_count("ranks_per_node", self.ranks_per_node, MAX_RANKS_PER_NODE)
        if not isinstance(self.shaping, bool):
            raise ValueError(f"shaping must be True or False, got {self.shaping!r}")
        # Parsing validates; the parsed values are exposed as properties below.
        _ = (self.inter_node_bps, self.inter_node_latency_s, self.intra_node_bps, self.loss_percent)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def inter_node_bps(self) -> int | None:
        if self.inter_node_bandwidth is None:
            return None
        return parse_rate(self.inter_node_bandwidth, "inter_node_bandwidth")

    @property
    def inter_node_latency_s(self) -> float | None:
        if self.inter_node_latency is None:
            return None
        return parse_latency(self.inter_node_latency, "inter_node_latency")

    @property
    def intra_node_bps(self) -> int | None:
        if self.intra_node_bandwidth is None:
            return None
        return parse_rate(self.intra_node_bandwidth, "intra_node_bandwidth")

    @property
    def loss_percent(self) -> float | None:
        if self.loss is None:
            return None
        return parse_loss(self.loss, "loss")

    def describe(self) -> str:
        parts = [f"{self.nodes} nodes x {self.ranks_per_node} ranks"]
        if not self.shaping:
            return parts[0] + ", loopback, no shaping"
        bps, lat = self.inter_node_bps, self.inter_node_latency_s
        parts.append(f"inter-node {format_rate(bps) if bps else 'unshaped'}")
        if lat:
            parts.append(f"latency {format_latency(lat)}")
        if self.intra_node_bps:
            parts.append(f"intra-node {format_rate(self.intra_node_bps)}")
        if self.loss_percent:
            parts.append(f"loss {self.loss_percent:g}%")
        return ", ".join(parts)
