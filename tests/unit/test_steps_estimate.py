"""Steps to target read between two measured candidates (thinwire.sim.steps_estimate), the plan
that ranks such a candidate, and the bench that measures the estimate's error."""

import json
import math

import pytest

from thinwire.cli import main as thinwire_main
from thinwire.sim.calibrate import predict, read_runs
from thinwire.sim.plan import make_plan
from thinwire.sim.steps import Candidate
from thinwire.sim.steps_estimate import holdout, interpolated

from plan_helpers import TRUE, _curve, _results


def hitopk(density, wire="fp16"):
    return Candidate("hitopk", (("density", density), ("selector", "mstopk-carry"),
                                ("sparse_wire", wire)))


def test_steps_lie_on_the_line_through_the_neighbours_in_log_density():
    measured = {hitopk(0.01): 52, hitopk(0.05): 36, hitopk(0.1): 30}
    guess = interpolated(hitopk(0.02), measured)
    share = math.log(2) / math.log(5)
    assert guess.steps == pytest.approx(52 + share * (36 - 52))
    assert guess.knob == "density"
    assert [label for label, _ in guess.between] == [hitopk(0.01).label(), hitopk(0.05).label()]


@pytest.mark.parametrize("cand, measured", [
    (hitopk(0.2), {hitopk(0.01): 52, hitopk(0.05): 36}),            # beyond the range
    (hitopk(0.005), {hitopk(0.01): 52, hitopk(0.05): 36}),          # below it
    (hitopk(0.02), {hitopk(0.01, "fp32"): 52, hitopk(0.05): 36}),   # another wire below
    (hitopk(0.02), {hitopk(0.01): None, hitopk(0.05): 36}),         # the one below missed
    (hitopk(0.02), {hitopk(0.005): 200, hitopk(0.01): None,         # ... not read across
                    hitopk(0.05): 36}),
    (hitopk(0.02), {Candidate("topk_a2a", hitopk(0.01).options): 52, hitopk(0.05): 36}),
    (Candidate("ddp"), {Candidate("ddp"): 36}),                      # no ordered setting
])
def test_nothing_is_guessed_without_a_measured_neighbour_on_each_side(cand, measured):
    assert interpolated(cand, measured) is None


def test_diloco_h_and_powersgd_rank_are_read_between_too():
    h = lambda every: Candidate("diloco", (("sync_every", every),))  # noqa: E731
    assert interpolated(h(10), {h(5): 42, h(20): 30}).steps == pytest.approx(36)
    rank = lambda r: Candidate("powersgd", (("powersgd_rank", r),))  # noqa: E731
    assert interpolated(rank(2), {rank(1): 60, rank(4): 40}).steps == pytest.approx(50)


def test_the_holdout_estimates_each_inner_candidate_from_its_neighbours():
    rows = holdout({hitopk(0.01): 52, hitopk(0.02): 48, hitopk(0.05): 36})
    assert [r["candidate"] for r in rows] == [hitopk(0.02).label()]
    assert rows[0]["error"] == pytest.approx(rows[0]["estimated_steps"] / 48 - 1)


def _with_densities(tmp_path):
    """The synthetic races (hitopk at d=0.05: 80 steps) plus hitopk at d=0.01 (120 steps)."""
    path = _results(tmp_path)
    data = json.loads(path.read_text())
    extra = [dict(r, density=0.01, curve=_curve(120, 124), steps=124)
             for r in data["runs"] if r["algorithm"] == "hitopk"]
    data["runs"] += extra
    path.write_text(json.dumps(data))
    runs, _ = read_runs([path])
    for raw, run in zip(data["runs"], runs):  # their step times under the generating model
        run.setting_index = 0
        raw["iteration_s"] = predict(run, TRUE, "hooks")["iteration_s"]
    path.write_text(json.dumps(data))
    return path


def test_the_plan_ranks_a_density_no_race_ran_and_says_where_its_steps_came_from(tmp_path):
    path = _with_densities(tmp_path)
    plan = make_plan([path], [path], None, None, None, ["50mbit"], with_break_even=False)
    rows = {r["candidate"]: r for r in plan["plans"][0]["rows"]}
    between = rows[hitopk(0.02).label()]
    assert between["steps"] == pytest.approx(120 + math.log(2) / math.log(5) * (80 - 120))
    assert between["time_to_target_s"] is not None
    assert between["steps_source"] == (f"between {hitopk(0.01).label()} and "
                                       f"{hitopk(0.05).label()}")
    assert rows[hitopk(0.05).label()]["steps_source"] == "measured"
    assert rows[hitopk(0.1).label()]["time_to_target_s"] is None  # beyond 0.05: not ranked
    assert rows[hitopk(0.1).label()]["steps_source"] is None


def test_the_bench_writes_the_holdout_and_its_summary(tmp_path, capsys):
    path = _with_densities(tmp_path)
    data = json.loads(path.read_text())
    data["runs"] += [dict(r, density=0.02, curve=_curve(96, 100), steps=100)
                     for r in data["runs"] if r["algorithm"] == "hitopk" and r["density"] == 0.01]
    path.write_text(json.dumps(data))
    out = tmp_path / "between.json"
    assert thinwire_main(["bench", "steps-between", "--steps-from", str(path),
                          "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["candidate"] for r in result["rows"]] == [hitopk(0.02).label()]
    assert result["summary"]["cases"] == 1
    assert "1 cases: median |error|" in capsys.readouterr().out


def test_the_bench_says_what_to_race_where_nothing_can_be_held_out(tmp_path, capsys):
    path = _results(tmp_path)
    assert thinwire_main(["bench", "steps-between", "--steps-from", str(path)]) != 0
    assert "race at least three values of one" in capsys.readouterr().err
