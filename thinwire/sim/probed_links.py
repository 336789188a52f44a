"""The plan's intra-node link from what a run probed inside its nodes.

The cost model's intra-node link is fitted from the calibration's races, on the calibration's
cluster: the emulator's loopback, or whatever cluster the races ran on. A run's own nodes may
have another link inside (NVLink against PCIe against the host's memory), and the calibration
pins the intra-node rate poorly where its steps hardly depend on it. auto's intra-node probe
(:mod:`thinwire.node_probe`) measures it where the run trains: the goodput a rank sends in a
ring all-reduce among its node's ranks, the slope of two sizes' times (fixed costs cancel).

What is taken from the probe: the bandwidth (bytes a rank sends per second, the quantity the
model's intra link charges bytes against). What is not: the probe's fixed cost. In the model's
max form a phase's fixed cost is the ranks' work around the transfer (framing, selection,
bookkeeping, fitted per phase), not the wire's latency the probe's intercept measures; the
emulator cannot add latency to check that use either.

A probe the host bound (saturated or throttled CPUs while it ran) measured the host, and a
probe with one rank a node measured nothing: the fit's link stays then, and the record says why.
What was fitted against the fit's rate (each algorithm's fixed cost per step, DiLoCo's cost) is
fitted again against the probe's by :func:`thinwire.sim.plan.with_probed_intra`.
"""

from __future__ import annotations

import math

FITTED = "intra_bandwidth_Bps"


def intra_from_probe(params: dict, intra: dict | None) -> tuple[dict, dict]:
    """(``params`` with the probed intra-node bandwidth where the probe is usable, a record
    of what the plan used and why). ``intra``: :func:`thinwire.node_probe.probe_intra_node`'s
    result, or None (no probe)."""
    fitted = params[FITTED]
    record = {"fitted_Bps": fitted, "probed_Bps": None, "planned_Bps": fitted,
              "source": "calibration"}
    if not intra:
        return params, dict(record, why="no intra-node probe")
    goodput = intra.get("goodput_Bps")
    record["probed_Bps"] = goodput
    if goodput is None:
        return params, dict(record, why=intra.get("why") or "the probe measured no goodput")
    if isinstance(goodput, bool) or not isinstance(goodput, (int, float)) or not (
            math.isfinite(goodput) and goodput > 0):
        raise ValueError(f"intra-node probe: goodput_Bps must be a finite number > 0, "
                         f"got {goodput!r}")
    if intra.get("bound_by") == "host":
        return params, dict(record, why=f"the probe was host-bound (host busy "
                                        f"{intra.get('host_busy')}, throttled "
                                        f"{intra.get('throttled_share')}): it measured the "
                                        f"host, not the link")
    return dict(params, **{FITTED: float(goodput)}), dict(
        record, planned_Bps=float(goodput), source="probe",
        why=f"the probe measured the link inside the nodes ({goodput / 1e9:.2f} GB/s; the "
            f"calibration's fit: {fitted / 1e9:.2f} GB/s)")
