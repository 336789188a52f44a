"""thinwire bench ddp-auto-replan checks what it is given before anything launches."""

import argparse
import json
import sys
from pathlib import Path

import pytest

from thinwire.bench import ddp_auto_replan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_plan_choice import plan_of  # noqa: E402


def _args(tmp_path, **changes):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_of()))
    values = dict(plan=str(plan), fixed=[], bandwidth_schedule="0s:1gbit,20s:25mbit",
                  steps=10, replan_every_s=10.0, pilot=2, timeout=60.0, json=None,
                  example=str(ddp_auto_replan.EXAMPLE))
    values.update(changes)
    return argparse.Namespace(**values)


@pytest.mark.parametrize("changes, message", [
    ({"fixed": ["ddp"]}, "--fixed: 'ddp' is not a candidate"),
    ({"fixed": ["powersgd rank=4"]}, "'powersgd rank=4' is not a thinwire hook"),
    ({"bandwidth_schedule": "20s:1gbit,10s:25mbit"}, "--bandwidth-schedule: times must increase"),
])
def test_bad_input_is_refused_by_name_before_any_run(tmp_path, monkeypatch, changes, message):
    monkeypatch.setattr(ddp_auto_replan, "_one", lambda *a, **k: pytest.fail("it launched"))
    with pytest.raises(ValueError, match=message):
        ddp_auto_replan.run(_args(tmp_path, **changes))


def test_a_plan_that_is_not_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(ddp_auto_replan, "_one", lambda *a, **k: pytest.fail("it launched"))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="plan: nodes must be an integer"):
        ddp_auto_replan.run(_args(tmp_path, plan=str(bad)))


def test_an_example_that_is_not_there_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(ddp_auto_replan, "_one", lambda *a, **k: pytest.fail("it launched"))
    with pytest.raises(FileNotFoundError, match="--example .*nope.py is not a file"):
        ddp_auto_replan.run(_args(tmp_path, example=str(tmp_path / "nope.py")))
