"""Was this run measuring the wire or the host? A verdict from the run's accounting.

The emulated cluster's nodes share one machine's cores, so a slow step can be the shaped
link's doing or the host's. From the accounting series (every 100 ms: each node's link bytes,
the host's CPU busy share, each node's CPU throttling) this says, per node and for the run:

* ``link_peak_share``: the node's best one-second egress rate over its configured link rate at
  that time (the bandwidth schedule's, where there is one). Near 1: the wire was the limit at
  least then;
* ``busy_share``: of the intervals in which the node sent anything worth counting (more than
  5% of its link rate), the share in which the host's CPUs were saturated (>= 95% busy);
* ``throttled_s``: time its CPU quota held the node back (node budgets);
* ``qdisc_dropped``: packets its links' queues dropped, both directions: a full queue at the
  shaped rate (TCP resends them: the wire was the limit then; many, and the goodput lies under
  the rate by the resends), plus the emulated loss where the spec has ``loss``.

and for the host, beside the share of intervals it was saturated, its run queue (tasks ready
to run) over the run: its median and maximum, and the share of intervals in which it was
longer than the host's cores (work waiting for a CPU: the host set some of the pace).

Verdict: ``link`` when some node drove its link to >= 80% of its rate; else ``host`` when the
host was saturated during at least half the intervals with traffic, or a node was throttled
for more than a tenth of the run; else ``neither`` (light traffic on a free host: the step
was set by latency or by compute, and says nothing about bandwidth). ``thinwire compare``
and ``auto`` should trust a rate probe only from a ``link`` run.
"""

from __future__ import annotations

# the rules auto's link probe applies too (one declaration): a node's best second reached
# LINK_BOUND of its rate: the wire bound it; an interval SATURATED busy: the host was saturated
import os
import statistics

from thinwire.link_probe import LINK_BOUND, SATURATED, THROTTLED

HOST_BOUND = 0.5       # share of the traffic intervals with a saturated host
TRAFFIC = 0.05         # an interval counts as traffic above this share of the link rate
WINDOW_S = 1.0


def rate_at(spec, t: float) -> int | None:
    """The inter-node rate configured at ``t`` seconds (the schedule's, else the spec's)."""
    rate = spec.inter_node_bps
    for at, bps in spec.bandwidth_steps:
        if at <= t:
            rate = bps
    return rate


def _peak_share(t: list, tx: list, spec, window_s: float) -> float:
    """The best average egress rate over any ``window_s`` span of the series, as a share of
    the rate configured at the span's end."""
    best, start = 0.0, 0
    for end in range(1, len(t)):
        while t[end] - t[start] > window_s and start < end - 1:
            start += 1
        span, rate = t[end] - t[start], rate_at(spec, t[end])
        if span >= window_s * 0.5 and rate:
            best = max(best, 8 * (tx[end] - tx[start]) / span / rate)
    return best


def assess(stats: dict, spec) -> dict:
    """The fidelity section of a run's accounting (``stats``: launch's stats dict)."""
    host = stats.get("host") or {"t": [], "cpu_busy": []}
    busy_at = dict(zip(host["t"], host["cpu_busy"]))
    duration = max((n["series"]["t"][-1] for n in stats["nodes"] if n["series"]["t"]),
                   default=0.0)
    drops = {d["node"]: d["dropped"] for d in stats.get("qdisc_drops") or [] if d.get("read")}
    nodes = []
    for node in stats["nodes"]:
        s = node["series"]
        t, tx = s["t"], [b or 0 for b in s["tx_bytes"]]
        configured = rate_at(spec, 0.0)
        peak_share = None
        traffic, saturated = 0, 0
        if configured and len(t) > 1:
            peak_share = round(_peak_share(t, tx, spec, WINDOW_S), 3)
            for i in range(1, len(t)):
                dt = t[i] - t[i - 1]
                if dt <= 0:
                    continue
                rate = 8 * (tx[i] - tx[i - 1]) / dt
                if rate > TRAFFIC * (rate_at(spec, t[i]) or configured):
                    traffic += 1
                    saturated += busy_at.get(t[i], 0.0) >= SATURATED
        nodes.append({"node": node["node"], "link_peak_share": peak_share,
                      "traffic_intervals": traffic,
                      "busy_share": round(saturated / traffic, 3) if traffic else None,
                      "throttled_s": node.get("throttled_s"),
                      "qdisc_dropped": drops.get(node["node"])})
    link = any((n["link_peak_share"] or 0) >= LINK_BOUND for n in nodes)
    hosted = any((n["busy_share"] or 0) >= HOST_BOUND for n in nodes) or any(
        duration and (n["throttled_s"] or 0) > THROTTLED * duration for n in nodes)
    verdict = "link" if link else "host" if hosted else "neither"
    return {"verdict": verdict, "nodes": nodes, "duration_s": round(duration, 3),
            "host_cpu_saturated_share": round(
                sum(b >= SATURATED for b in host["cpu_busy"]) / len(host["cpu_busy"]), 3)
            if host["cpu_busy"] else None, **run_queue(host.get("run_queue") or [])}


def run_queue(samples: list, cores: int | None = None) -> dict:
    """The host's run queue over the run: median, maximum, and the share of samples longer
    than its ``cores`` (default: this machine's)."""
    queue = [q for q in samples if q is not None]
    if not queue:
        return {}
    cores = cores or os.cpu_count() or 1
    return {"host_run_queue_median": statistics.median(queue),
            "host_run_queue_max": max(queue),
            "host_run_queue_over_cores_share": round(sum(q > cores for q in queue)
                                                     / len(queue), 3)}
