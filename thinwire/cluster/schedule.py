"""Links that change while a job runs: a ClusterSpec's bandwidth_schedule, applied on time.

The launcher starts the clock when every node's torchrun has started and calls :meth:`tick`
about every 0.1 s while it waits for the job; each due step moves every node's links (both
directions) to its rate with `tc class change` (HTB keeps what is queued) and is logged with
the job's elapsed time and the wall time. What was applied, and when, lands in the run's
accounting (``bandwidth_changes``), so a measurement can say which rate each phase saw.
"""

from __future__ import annotations

import logging
import time

from thinwire.cluster.spec import format_rate

log = logging.getLogger(__name__)


class BandwidthSchedule:
    """``steps``: ((seconds after the start, bits per second), ...), times increasing."""

    def __init__(self, network, steps: tuple[tuple[float, int], ...]):
        self.network = network
        self.pending = list(steps)
        self.changes: list[dict] = []
        self._start: float | None = None

    def start(self) -> None:
        self._start = time.monotonic()
        self.tick()

    def tick(self) -> None:
        """Apply every step whose time has come (late ones at once, in order)."""
        if self._start is None:
            return
        while self.pending and self.pending[0][0] <= time.monotonic() - self._start:
            planned, bps = self.pending.pop(0)
            self.network.set_inter_node_rate(bps)
            applied = time.monotonic() - self._start
            self.changes.append({"planned_s": planned, "applied_s": round(applied, 3),
                                 "rate_bps": bps, "unix_time": round(time.time(), 3)})
            log.info("bandwidth schedule: at %.2f s (planned %g s) inter-node links -> %s",
                     applied, planned, format_rate(bps))


class FailureSchedule:
    """A ClusterSpec's failure_schedule, applied on time to the launcher's nodes: ``kill``
    SIGKILLs every process of a node (its launcher, its ranks, anything in its namespace),
    ``restart`` starts the node's launcher again. ``events``: ((seconds, node, action), ...)
    in time order, checked by the spec (no overlapping outages)."""

    def __init__(self, nodes, events: tuple[tuple[float, int, str], ...]):
        self.nodes = nodes
        self.pending = list(events)
        self.applied: list[dict] = []
        self._start: float | None = None

    def start(self) -> None:
        self._start = time.monotonic()
        self.tick()

    def restarts_pending(self) -> bool:
        return any(action == "restart" for _, _, action in self.pending)

    def tick(self) -> None:
        if self._start is None:
            return
        while self.pending and self.pending[0][0] <= time.monotonic() - self._start:
            planned, node, action = self.pending.pop(0)
            if action == "kill":
                self.nodes.kill(node)
            else:
                self.nodes.restart(node)
            applied = time.monotonic() - self._start
            self.applied.append({"planned_s": planned, "applied_s": round(applied, 3),
                                 "node": node, "action": action,
                                 "unix_time": round(time.time(), 3)})
            log.warning("failure schedule: at %.2f s (planned %g s) node%d %s", applied, planned,
                        node, "killed (every process, SIGKILL)" if action == "kill"
                        else "restarted")
