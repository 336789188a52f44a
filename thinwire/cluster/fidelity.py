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

Under a bandwidth schedule the same evidence and verdict are given per phase too (``phases``:
each span of one configured rate, from the times the schedule applied its changes): a run
can measure the wire at 200 Mbit/s and the host at 1 Gbit/s.

Verdict: ``link`` when some node drove its link to >= 80% of its rate; else ``host`` when the
host was saturated during at least half the intervals with traffic, or a node was throttled
for more than a tenth of the run; else ``neither`` (light traffic on a free host: the step
was set by latency or by compute, and says nothing about bandwidth). ``thinwire compare``
and ``auto`` should trust a rate probe only from a ``link`` run.
"""

from __future__ import annotations

# the rules auto's link probe applies too (one declaration): a node's best second reached
# LINK_BOUND of its rate: the wire bound it; an interval SATURATED busy: the host was saturated
import functools
import math
import os
import statistics

from thinwire.link_probe import LINK_BOUND, SATURATED, THROTTLED

HOST_BOUND = 0.5       # share of the traffic intervals with a saturated host
TRAFFIC = 0.05         # an interval counts as traffic above this share of the link rate
WINDOW_S = 1.0


def rate_at(spec, t: float, changes: list | None = None) -> int | None:
    """The inter-node rate configured at ``t`` seconds of the monitor's clock: the last of
    ``changes`` ((monitor seconds, bits/s) the schedule applied) at or before ``t``, else the
    spec's rate moved by its planned schedule (where the applied times are not known)."""
    rate = spec.inter_node_bps
    for at, bps in spec.bandwidth_steps if changes is None else changes:
        if at <= t:
            rate = bps
    return rate


def _peak_share(t: list, tx: list, rate_of, window_s: float) -> float:
    """The best average egress rate over any ``window_s`` span of the series, as a share of
    the highest rate configured in the span (``rate_of(t)`` at its samples): a span that
    holds a drop is judged against the rate before it, or the old rate's traffic would read
    as a slow link driven past full."""
    best, start = 0.0, 0
    for end in range(1, len(t)):
        while t[end] - t[start] > window_s and start < end - 1:
            start += 1
        span = t[end] - t[start]
        rate = max((rate_of(t[i]) or 0) for i in range(start, end + 1))
        if span >= window_s * 0.5 and rate:
            best = max(best, 8 * (tx[end] - tx[start]) / span / rate)
    return best


def _links_peak_share(series: dict, links: int, rate_of, begin: float, end: float) -> float:
    """The best :func:`_peak_share` of any one of a node's ``links`` against its part of the
    node's rate (1/``links``): gloo drives one link of several, whose bytes alone may fill it
    while the node's sum stays at 1/``links`` of the node's rate. 0 without the per-link
    series (one link, or a run recorded before it was kept)."""
    per_link = series.get("tx_link_bytes") or []
    if links < 2 or not per_link:
        return 0.0
    best = 0.0
    for link in range(links):
        sent = [row[link] if len(row) > link else 0 for row in per_link]
        t, tx = _inside(sent, series["t"], begin, end, previous=False)
        best = max(best, _peak_share(t, tx, lambda at: (rate_of(at) or 0) / links, WINDOW_S))
    return best


def _inside(values: list, t: list, begin: float, end: float,
            previous: bool = True) -> tuple[list, list]:
    """(t, values) of the samples in [begin, end], with (``previous``) the last sample before
    ``begin``: the counters' value where the window opens, for differences over intervals."""
    keep = [i for i, at in enumerate(t) if begin <= at <= end]
    if previous and keep and keep[0] > 0 and t[keep[0]] > begin:
        keep.insert(0, keep[0] - 1)
    return [t[i] for i in keep], [values[i] for i in keep]


def _section(stats: dict, spec, rate_of, begin: float, end: float) -> dict:
    """The verdict and its evidence over [begin, end] seconds of the monitor's clock."""
    host = stats.get("host") or {"t": [], "cpu_busy": []}
    busy_at = dict(zip(host["t"], host["cpu_busy"]))
    whole = begin <= 0 and end == math.inf
    duration = max((min(n["series"]["t"][-1], end) for n in stats["nodes"]
                    if n["series"]["t"]), default=0.0) - max(begin, 0.0)
    drops = {d["node"]: d["dropped"] for d in stats.get("qdisc_drops") or [] if d.get("read")}
    nodes = []
    for node in stats["nodes"]:
        s = node["series"]
        t, tx = _inside([b or 0 for b in s["tx_bytes"]], s["t"], begin, end)
        configured = rate_of(max(begin, 0.0))
        peak_share = None
        traffic, saturated = 0, 0
        if configured and len(t) > 1:
            # windows that start inside the phase: one that opens before it carries the
            # phase before's traffic (a drop from 1 Gbit/s would read as a full slow link)
            peak_share = round(max(
                _peak_share(*_inside([b or 0 for b in s["tx_bytes"]], s["t"], begin, end,
                                     previous=False), rate_of, WINDOW_S),
                _links_peak_share(s, getattr(spec, "links_per_node", 1), rate_of, begin,
                                  end)), 3)
            for i in range(1, len(t)):
                dt = t[i] - t[i - 1]
                if dt <= 0:
                    continue
                rate = 8 * (tx[i] - tx[i - 1]) / dt
                if rate > TRAFFIC * (rate_of(t[i]) or configured):
                    traffic += 1
                    saturated += busy_at.get(t[i], 0.0) >= SATURATED
        if whole or not s.get("throttled_s"):
            throttled = node.get("throttled_s") if whole else None
        else:  # the quota's hold over this window, from the sampled counter
            _, held = _inside(s["throttled_s"], s["t"], begin, end)
            held = [h for h in held if h is not None]
            throttled = round(held[-1] - held[0], 3) if len(held) > 1 else None
        nodes.append({"node": node["node"], "link_peak_share": peak_share,
                      "traffic_intervals": traffic,
                      "busy_share": round(saturated / traffic, 3) if traffic else None,
                      "throttled_s": throttled,
                      **({"qdisc_dropped": drops.get(node["node"])} if whole else {})})
    link = any((n["link_peak_share"] or 0) >= LINK_BOUND for n in nodes)
    hosted = any((n["busy_share"] or 0) >= HOST_BOUND for n in nodes) or any(
        duration > 0 and (n["throttled_s"] or 0) > THROTTLED * duration for n in nodes)
    # a host sample at t covers the interval that ends at t: the one at a phase's start is
    # the phase before's
    inside = [(begin <= 0 or at > begin) and at <= end for at in host["t"]]
    busy = [b for b, keep in zip(host["cpu_busy"], inside) if keep]
    queue = [q for q, keep in zip(host.get("run_queue") or [], inside) if keep]
    return {"verdict": "link" if link else "host" if hosted else "neither", "nodes": nodes,
            "duration_s": round(max(duration, 0.0), 3),
            "host_cpu_saturated_share": round(sum(b >= SATURATED for b in busy) / len(busy), 3)
            if busy else None, **run_queue(queue)}


def assess(stats: dict, spec, changes: list | None = None) -> dict:
    """The fidelity section of a run's accounting (``stats``: launch's stats dict).
    ``changes``: the bandwidth schedule's applied changes as (monitor seconds, bits/s); where
    the spec has a schedule, the section holds one verdict per ``phases`` entry too (each
    span between two rate changes: was the 25 Mbit/s phase measuring the wire?)."""
    rate_of = functools.partial(rate_at, spec, changes=changes)
    result = _section(stats, spec, rate_of, 0.0, math.inf)
    if spec.bandwidth_steps:
        result["phases"] = [dict(_section(stats, spec, rate_of, begin, end), from_s=begin,
                                 to_s=None if end == math.inf else end, rate_bps=bps)
                            for begin, end, bps in phases(spec, changes)]
    return result


def phases(spec, changes: list | None = None) -> list[tuple[float, float, int]]:
    """(from, to, bits/s) of each span of one configured rate, in the monitor's seconds (the
    schedule's planned times where the applied ones are not known)."""
    steps = list(spec.bandwidth_steps if changes is None else changes)
    marks = [(0.0, spec.inter_node_bps)] + [(at, bps) for at, bps in steps if at > 0]
    if steps and steps[0][0] <= 0:  # a change at 0 s sets the first phase's rate
        marks[0] = (0.0, steps[0][1])
    spans = []
    for (at, bps), nxt in zip(marks, marks[1:] + [(math.inf, None)]):
        if nxt[0] > at:
            spans.append((at, nxt[0], bps))
    return spans


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
