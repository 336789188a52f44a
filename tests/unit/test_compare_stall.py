"""`thinwire compare`'s stall watch: when a run counts as stalled, and its setting's checks."""

import json

import pytest

from thinwire.train.compare import CompareSettings, StallWatch


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_run_stalls_only_after_its_metrics_stop_growing_for_the_whole_timeout(tmp_path):
    metrics, clock = tmp_path / "run.jsonl", Clock()
    watch = StallWatch(metrics, 30.0, clock)
    assert watch() is None  # no file yet: the start counts from here
    clock.now += 29
    assert watch() is None
    clock.now += 2
    assert watch() == "stalled: no training progress for 30 s before its first step"

    watch = StallWatch(metrics, 30.0, clock)
    for step in (1, 2, 3):  # a line a step keeps it alive however long the run
        clock.now += 25
        with open(metrics, "a") as handle:
            handle.write(json.dumps({"event": "step", "step": step}) + "\n")
        assert watch() is None
    clock.now += 29.5
    assert watch() is None
    clock.now += 1
    assert watch() == "stalled: no training progress for 30 s after step 3"


def test_the_watch_reads_the_file_at_most_once_a_second(tmp_path):
    metrics, clock = tmp_path / "run.jsonl", Clock()
    watch = StallWatch(metrics, 0.5, clock)
    assert watch() is None
    clock.now += 0.9  # past the stall timeout, but not a second since the last look
    assert watch() is None
    clock.now += 0.2
    assert watch() is not None


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "60"])
def test_a_bad_stall_timeout_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"--stall-timeout must be a number of seconds > 0, "
                                         rf"got {bad!r}".replace("(", r"\(").replace(")", r"\)")):
        CompareSettings(algorithms=["ddp"], shaping=False, stall_s=bad).validate()
