"""The schedules' clock (schedule_clock): from the job's start, or from the file rank 0
touches at its first training step; events at 0 s apply at the job's start either way."""

import re
import time

import pytest

from thinwire.cluster import ClusterSpec
from thinwire.cluster.schedule import Schedule


class Recorded(Schedule):
    def __init__(self, events):
        super().__init__(events)
        self.done = []

    def apply(self, planned_s, what):
        self.done.append(what)
        return {"what": what}


def test_the_training_clock_waits_for_the_marker(tmp_path):
    marker = tmp_path / "training-started"
    clock = Recorded([(0.0, "initial rate"), (0.05, "change")])
    clock.start(marker)
    assert clock.done == ["initial rate"] and clock.clock_started_s is None
    time.sleep(0.1)
    clock.tick()
    assert clock.done == ["initial rate"]  # the job is older than 0.05 s; training is not
    marker.touch()
    clock.tick()  # the clock starts now
    assert clock.clock_started_s >= 0.1 and clock.done == ["initial rate"]
    time.sleep(0.06)
    clock.tick()
    assert clock.done == ["initial rate", "change"]
    first, second = clock.applied
    assert first["applied_s"] == 0.0 and second["applied_s"] >= 0.05
    assert second["job_s"] >= 0.15  # after the job's start: the marker's wait, then 0.05 s


def test_the_job_clock_starts_at_once():
    clock = Recorded([(0.0, "a"), (0.02, "b")])
    clock.start()
    assert clock.done == ["a"] and clock.clock_started_s == 0.0
    time.sleep(0.03)
    clock.tick()
    assert clock.done == ["a", "b"]


@pytest.mark.parametrize("kwargs, message", [
    ({"schedule_clock": "wall", "bandwidth_schedule": "0s:100mbit,5s:25mbit"},
     "schedule_clock must be one of job, training"),
    ({"schedule_clock": "training"},
     "give bandwidth_schedule (--bandwidth-schedule) or failure_schedule (--fail) too")])
def test_a_bad_clock_is_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ClusterSpec(nodes=2, ranks_per_node=1, inter_node_bandwidth="100mbit", **kwargs)
