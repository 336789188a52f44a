"""Things that happen to a running job on time: a ClusterSpec's bandwidth_schedule (links that
change rate) and failure_schedule (nodes that vanish and come back).

The launcher starts each schedule's clock when every node's torchrun has started (or, with
schedule_clock "training", when the job's rank 0 touches the file named by
THINWIRE_TRAINING_STARTED at its first training step) and calls
:meth:`Schedule.tick` about every 0.1 s while it waits for the job; every due event is applied
(late ones at once, in order), logged with the job's elapsed time, and recorded with its
planned and applied times, so the run's accounting says what happened when
(``bandwidth_changes``, ``failures``).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from pathlib import Path

from thinwire.cluster.spec import format_rate

log = logging.getLogger(__name__)


class Schedule(ABC):
    """Events ``(seconds after the start, ...)`` in time order; a subclass applies one."""

    def __init__(self, events):
        self.pending = list(events)
        self.applied: list[dict] = []
        self._start: float | None = None
        self._job_start: float | None = None
        self._marker: Path | None = None
        self.started_unix: float | None = None  # when the clock started (wall clock)

    def start(self, marker: Path | None = None) -> None:
        """Start the clock now, or (``marker``: schedule_clock "training") when that file
        appears; events at 0 s apply now either way."""
        self._job_start = time.monotonic()
        if marker is None:
            self._start, self.started_unix = self._job_start, time.time()
        else:
            self._marker = marker
            while self.pending and self.pending[0][0] <= 0:
                self._apply_first(0.0)
        self.tick()

    @property
    def job_started_monotonic(self) -> float | None:
        """time.monotonic() at the job's start (each record's ``job_s`` counts from it)."""
        return self._job_start

    @property
    def clock_started_s(self) -> float | None:
        """When the clock started, in seconds after the job's start (None: not yet)."""
        return None if self._start is None else round(self._start - self._job_start, 3)

    def tick(self) -> None:
        if self._start is None:
            if self._marker is None or not self._marker.exists():
                return
            self._start, self.started_unix = time.monotonic(), time.time()
            log.info("%s: the clock starts (training began %.2f s after the job)",
                     type(self).__name__, self._start - self._job_start)
        while self.pending and self.pending[0][0] <= time.monotonic() - self._start:
            self._apply_first(time.monotonic() - self._start)

    def _apply_first(self, elapsed_s: float) -> None:
        event = self.pending.pop(0)
        record = self.apply(*event)
        self.applied.append({"planned_s": event[0], "applied_s": round(elapsed_s, 3),
                             "job_s": round(time.monotonic() - self._job_start, 3),
                             **record, "unix_time": round(time.time(), 3)})

    @abstractmethod
    def apply(self, planned_s: float, *what) -> dict:
        """Make one event happen; returns what to record about it."""


class BandwidthSchedule(Schedule):
    """Moves every node's links (both directions, `tc class change`: HTB keeps what is
    queued) to each step's rate. ``steps``: ((seconds, bits per second), ...)."""

    def __init__(self, network, steps: tuple[tuple[float, int], ...]):
        super().__init__(steps)
        self.network = network

    @property
    def changes(self) -> list[dict]:
        return self.applied

    def apply(self, planned_s: float, bps: int) -> dict:
        self.network.set_inter_node_rate(bps)
        log.info("bandwidth schedule: at %.2f s (planned %g s) inter-node links -> %s",
                 time.monotonic() - (self._start or self._job_start), planned_s,
                 format_rate(bps))
        return {"rate_bps": bps}


class FailureSchedule(Schedule):
    """``kill`` SIGKILLs every process of a node (its launcher, its ranks, anything in its
    namespace), ``restart`` starts the node's launcher again. ``events``: ((seconds, node,
    action), ...), checked by the spec (no overlapping outages)."""

    def __init__(self, nodes, events: tuple[tuple[float, int, str], ...]):
        super().__init__(events)
        self.nodes = nodes

    def restarts_pending(self) -> bool:
        return any(action == "restart" for _, _, action in self.pending)

    def apply(self, planned_s: float, node: int, action: str) -> dict:
        if action == "kill":
            self.nodes.kill(node)
        else:
            self.nodes.restart(node)
        log.warning("failure schedule: at %.2f s (planned %g s) node%d %s",
                    time.monotonic() - (self._start or self._job_start), planned_s, node,
                    "killed (every process, SIGKILL)" if action == "kill" else "restarted")
        return {"node": node, "action": action}
