"""examples/ddp_auto_replan.py runs as its docstring says (on loopback, 2 nodes x 1 rank, a
plan of the unit tests): auto chooses, re-checks after every step where due, and records it."""

import io
import json
import sys
from pathlib import Path

from thinwire.cluster import ClusterSpec, run
from thinwire.plan_choice import PILOT_MARGIN

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
from test_plan_choice import plan_of  # noqa: E402


def test_the_example_chooses_and_re_checks_the_link(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_of(nodes=2, ranks_per_node=1)))
    record = tmp_path / "record.json"
    out = io.StringIO()
    status = run(ClusterSpec(nodes=2, ranks_per_node=1, shaping=False),
                 [str(ROOT / "examples" / "ddp_auto_replan.py"), "--plan", str(plan),
                  "--steps", "4", "--replan-every-s", "0", "--json", str(record)],
                 timeout_s=180, output=out)
    assert status == 0, out.getvalue()[-3000:]
    got = json.loads(record.read_text())
    # loopback is faster than the plan's top rate: ddp-fp16 there, kept at every check
    assert got["first_choice"] == "ddp-fp16" == got["final_choice"]
    assert [c["step"] for c in got["checks"]] == [1, 2, 3, 4]  # every_s=0: due each step
    assert "auto chose ddp-fp16" in out.getvalue() and "4 steps in" in out.getvalue()


def test_the_example_pilots_the_runner_up_on_its_own_steps(tmp_path):
    plan_dict = plan_of(nodes=2, ranks_per_node=1)
    for at in plan_dict["plans"]:  # ddp within 1.5x of ddp-fp16 at every rate: piloted
        for row in at["rows"]:
            row["step_s"] = row["time_to_target_s"] / 100
        at["rows"].append({"candidate": "ddp", "algorithm": "ddp", "settings": {},
                           "time_to_target_s": 5.0, "step_s": 0.05})
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_dict))
    record = tmp_path / "record.json"
    out = io.StringIO()
    status = run(ClusterSpec(nodes=2, ranks_per_node=1, shaping=False),
                 [str(ROOT / "examples" / "ddp_auto_replan.py"), "--plan", str(plan),
                  "--steps", "14", "--replan-every-s", "3600", "--pilot", "1",
                  "--json", str(record)], timeout_s=180, output=out)
    assert status == 0, out.getvalue()[-3000:]
    got = json.loads(record.read_text())
    assert got["first_choice"] == "ddp-fp16"
    # ddp-fp16's pace over steps 2-6, then ddp's over 8-12, then the decision
    assert [(c["step"], c["measured"]) for c in got["checks"]] == [(6, "ddp-fp16"), (12, "ddp")]
    decided = got["checks"][-1]
    assert set(decided["paces"]) == {"ddp-fp16", "ddp"}
    scores = decided["predicted_at_pace_s"]
    assert decided["best"] == min(scores, key=scores.get)
    # the faster kept, or the one running (ddp) where the other promised under PILOT_MARGIN
    margin = 1 + PILOT_MARGIN
    switch_back = decided["best"] == "ddp-fp16" and scores["ddp"] > scores["ddp-fp16"] * margin
    assert got["final_choice"] == decided["chosen"] == ("ddp-fp16" if switch_back else "ddp")
    assert "pilot: switched to ddp" in out.getvalue()
