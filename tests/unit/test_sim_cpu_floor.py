"""The CPU floor: a setting's ranks' CPU seconds a step over the cores they share bound its step
from below at any link rate. Where a slow wire hides the host's work, the step time cannot show
it; the CPU time measured there carries it to the faster rates."""

import dataclasses
import json

import pytest

from thinwire.sim.calibrate import (Run, bytes_key, cpu_floor_of, cpu_floors, fit, predict,
                                    read_run, read_runs, refit_step_extras, reindexed)
from thinwire.sim.compute import uniform
from thinwire.sim.holdout import holdout
from thinwire.sim.repeats import median_of_repeats

TRUE = {"inter_alpha_s": 3e-4, "inter_efficiency": 0.9, "intra_alpha_s": 1e-4,
        "intra_bandwidth_Bps": 2e9, "sparse_rate": 5e7, "sparse_alpha_s": 2e-3,
        "pass_rate": 1e9, "compute_s": [0.3], "phase_form": "max", "bytes_scale": {},
        "step_extra_s": {}}
RATES = (5e7, 2e8, 1e9)
CORES = 2
# allreduce's host work: 1.2 CPU-seconds a step over 2 cores, 0.6 s, whatever the rate; its
# wire (8 MB a step) takes ~1.4 s at 50 Mbit/s and hides it there
HOST_FLOOR_S = 0.6


def _run(algorithm, bps, density=0.01, nodes=2):
    return Run("synthetic", algorithm, algorithm, nodes, 4 // nodes, bps, "u",
               uniform(2_000_000), density, None, 1.0)


def _sweep(tmp_path, algorithms=("allreduce", "topk_allgather"), cpu=True, name="r.json",
           slow_cpu_growth=1.0, density=0.01):
    """Steps the model gives, allreduce's (and dlcp's) held at HOST_FLOOR_S from below; every
    run's CPU a step is reported (allreduce's is the floor's, the others' one core's worth of
    their step, which binds nothing) unless ``cpu`` is False. dlcp's host work below 1 Gbit/s
    is ``slow_cpu_growth`` times its floor (its receiver's cost grows as the link slows).
    ``density``: the sparse algorithms' (at 0.3 dlcp's wire hides its host work at 50 Mbit/s)."""
    runs = []
    for bps in RATES:
        for algorithm in algorithms:
            step = predict(_run(algorithm, bps, density), TRUE, overlap="hooks")["iteration_s"]
            host_s = HOST_FLOOR_S * (slow_cpu_growth if algorithm == "dlcp" and bps < 1e9
                                     else 1.0)
            if algorithm in ("allreduce", "dlcp"):
                step = max(step, host_s)
            cpu_s = CORES * host_s if algorithm in ("allreduce", "dlcp") else step
            runs.append({"algorithm": algorithm, "inter_node_bandwidth": bps, "status": "ok",
                         "density": density,
                         "iteration_s": step, "compute_ms_per_iter": 300.0,
                         "fidelity": {"verdict": "link"},
                         **({"cpu_ms_per_iter": 1e3 * cpu_s, "host_cores": CORES}
                            if cpu else {})})
    path = tmp_path / name
    path.write_text(json.dumps({"setting": {"nodes": 2, "ranks_per_node": 2,
                                            "parameters": 2_000_000}, "runs": runs}))
    return path


def _error_at_1gbit(result, algorithm="allreduce"):
    return next(row["error_calibrated"] for row in result["held_out"]
                if row["algorithm"] == algorithm and row["inter_node_bandwidth_bps"] == 1e9)


def test_host_work_hidden_behind_a_slow_wire_is_carried_to_a_fast_one(tmp_path):
    result = holdout([_sweep(tmp_path)], "50mbit", form="max")
    assert abs(_error_at_1gbit(result)) < 0.02
    floors = {row["algorithm"]: row["floor_x_compute"]
              for row in result["fitted"]["cpu_floor"]}
    (compute_s,) = result["fitted"]["compute_s"]  # in units of the setting's compute
    assert floors["allreduce"] * compute_s == pytest.approx(HOST_FLOOR_S)
    for row in result["held_out"]:  # the others' floors bind nothing
        assert abs(row["error_calibrated"]) < 0.05, row


def test_without_the_cpu_time_the_hidden_work_is_missed(tmp_path):
    """Not vacuous: the same sweep without the CPU measurement misses allreduce at 1 Gbit/s
    by more than the issue's 20% (its step there is its host work, which no constant
    fitted at 50 Mbit/s can hold: the wire is most of those steps)."""
    result = holdout([_sweep(tmp_path, cpu=False)], "50mbit", form="max")
    assert _error_at_1gbit(result) < -0.25
    assert result["fitted"]["cpu_floor"] == []
    assert "allreduce" in result["wire_bound"]  # the report says where to look


def test_an_algorithm_that_paces_its_datagrams_takes_its_floor_though_it_grows_on_slow_links(
        tmp_path):
    """DLCP's CPU a step grows as the link slows (1.2-1.4x at 50 Mbit/s on the recorded
    sweeps): its floor taken there over-predicts its 1 Gbit/s step by that growth. Without
    the floor, where its wire hides its host work at 50 Mbit/s, the step is predicted short by
    more than the issue's 20% (on the recorded sweeps 37-58%), so it is taken."""
    growth = 1.3
    path = _sweep(tmp_path, algorithms=("allreduce", "dlcp"), slow_cpu_growth=growth,
                  density=0.3)
    runs, _ = read_runs([path])
    assert {key[0] for key in cpu_floors(runs, [0.3] * 3)} == {"allreduce", "dlcp"}
    floored = _error_at_1gbit(holdout([path], "50mbit", form="max"), "dlcp")
    assert floored == pytest.approx(growth - 1, abs=0.02)
    unfloored = _error_at_1gbit(
        holdout([_sweep(tmp_path, algorithms=("allreduce", "dlcp"), cpu=False,
                        slow_cpu_growth=growth, density=0.3, name="no_cpu.json")],
                "50mbit", form="max"), "dlcp")
    assert unfloored < -0.2


def test_a_candidate_not_measured_takes_its_algorithms_floor_on_the_same_cluster_and_model():
    params = dict(TRUE, cpu_floor={bytes_key(_run("allreduce", 1e9)): 0.5 / 0.3,
                                   bytes_key(_run("hitopk", 1e9)): 0.7 / 0.3})
    assert cpu_floor_of(params, _run("hitopk", 1e9, density=0.05)) == pytest.approx(0.7)
    assert cpu_floor_of(params, _run("hitopk", 1e9, nodes=4)) is None  # another cluster
    assert cpu_floor_of(params, _run("topk_allgather", 1e9)) is None
    floored = predict(_run("hitopk", 1e9, density=0.05), params, "hooks")
    assert floored["iteration_s"] == pytest.approx(0.7)
    assert floored["cpu_floor_s"] == pytest.approx(0.7)
    assert floored["sync_s"] == pytest.approx(0.7 - floored["compute_s"])


def test_the_floor_scales_with_the_compute_of_the_setting_planned():
    """A plan for a device with a tenth of the emulator's compute time a step takes a tenth of
    the floor: it is the emulator's ranks' host work, which scales as their compute does."""
    params = dict(TRUE, cpu_floor={bytes_key(_run("allreduce", 1e9)): 2.0})
    faster = dict(params, compute_s=[0.03])
    assert cpu_floor_of(params, _run("allreduce", 1e9)) == pytest.approx(0.6)
    assert cpu_floor_of(faster, _run("allreduce", 1e9)) == pytest.approx(0.06)


def test_the_cpu_time_is_read_and_its_repetitions_taken_by_the_median(tmp_path):
    setting = {"nodes": 2, "ranks_per_node": 2, "parameters": 1_000_000}
    run = read_run({"algorithm": "hitopk", "iteration_s": 1.0, "cpu_ms_per_iter": 900.0,
                    "host_cores": 2}, setting, "w", "s")
    assert (run.cpu_s, run.cores) == (0.9, 2)
    bare = read_run({"algorithm": "hitopk", "iteration_s": 1.0}, setting, "w", "s")
    assert (bare.cpu_s, bare.cores) == (None, None)
    # the first repetition (an older sweep) recorded neither its CPU nor the cores
    repeats = [dataclasses.replace(run, cpu_s=c, cores=2 if c else None)
               for c in (None, 0.9, 1.5, 1.1)]
    (merged,) = median_of_repeats(repeats)
    assert merged.cpu_s == pytest.approx(1.1)  # the median of those that measured it
    assert merged.cores == 2
    # repetitions on hosts of different sizes: the median of the share of the cores a step used
    # (shares 0.45, 0.25, 0.4: the median CPU over the median cores would say 0.25)
    sizes = [dataclasses.replace(run, cpu_s=c, cores=n) for c, n in ((0.9, 2), (1.0, 4), (3.2, 8))]
    (merged,) = median_of_repeats(sizes)
    assert merged.cores == 4 and merged.cpu_s / merged.cores == pytest.approx(0.4)


def test_a_cost_paid_in_series_with_the_wire_is_not_taken_by_the_floor(tmp_path):
    """Ok-Topk's threshold work is paid before its exchange, at every rate. Calibrated where it
    makes the step CPU-bound (1 Gbit/s: the floor equals the step), the floor and a constant
    explain that step alike; the constant is fitted first, so the slower rates, where the wire
    adds to that work, keep it. (Fitted beside the constants, the floor took its place and the
    recorded MNIST sweep's Ok-Topk came out 33% short at 50 Mbit/s from 1 Gbit/s.)"""
    extra = {"hitopk": 0.25}
    runs = []
    for bps in RATES:
        for algorithm in ("allreduce", "hier_allreduce", "topk_allgather", "hitopk"):
            row = predict(_run(algorithm, bps), dict(TRUE, step_extra_s=extra), "hooks")
            at_1gbit = predict(_run(algorithm, 1e9), dict(TRUE, step_extra_s=extra), "hooks")
            runs.append({"algorithm": algorithm, "inter_node_bandwidth": bps, "status": "ok",
                         "iteration_s": row["iteration_s"], "compute_ms_per_iter": 300.0,
                         "fidelity": {"verdict": "link"}, "host_cores": CORES,
                         # the same host work at every rate: all of the step at 1 Gbit/s
                         "cpu_ms_per_iter": 1e3 * CORES * at_1gbit["iteration_s"]})
    path = tmp_path / "series.json"
    path.write_text(json.dumps({"setting": {"nodes": 2, "ranks_per_node": 2,
                                            "parameters": 2_000_000}, "runs": runs}))
    result = holdout([path], "1gbit", form="max")
    assert result["fitted"]["step_extra_s"]["hitopk"] == pytest.approx(0.25, rel=0.2)
    for row in result["held_out"]:
        assert abs(row["error_calibrated"]) < 0.05, row
    # the plan refits the constants after a probe moves a shared parameter: without the
    # floors too, or the floor would take the constant there
    calibration = reindexed([r for r in read_runs([path])[0] if r.inter_bps == 1e9])
    params, _ = fit(calibration, overlap="hooks", form="max")
    assert params["cpu_floor"]
    refitted = refit_step_extras(calibration, params, "hooks")
    assert refitted["step_extra_s"]["hitopk"] == pytest.approx(0.25, rel=0.2)
    assert refitted["cpu_floor"] == params["cpu_floor"]


def test_the_bench_tables_the_cpu_by_rate_and_the_holdout_with_and_without_the_floor(
        tmp_path, capsys):
    from thinwire.cli import main as thinwire_main

    out = tmp_path / "floor.json"
    assert thinwire_main(["bench", "cpu-floor", "--results", str(_sweep(tmp_path)),
                          "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    allreduce = {row["rate_mbit"]: row for row in result["cpu"] if row["algorithm"] == "allreduce"}
    assert set(allreduce) == {50, 200, 1000}
    assert all(row["cpu_vs_fastest"] == pytest.approx(1.0) for row in allreduce.values())
    # at 1 Gbit/s its step is its host work: the cores were all its ranks'
    assert allreduce[1000]["cores_share"] == pytest.approx(1.0)
    from_50 = {row["cpu_floor"]: row for row in result["holdout"]
               if row["calibrate_at_mbit"] == 50}
    assert from_50[True]["misses"] == {} and "allreduce" in from_50[False]["misses"]
    assert "cpu_vs_fastest" in capsys.readouterr().out


def test_the_bench_refuses_sweeps_without_the_cpu_time(tmp_path, capsys):
    from thinwire.cli import main as thinwire_main

    assert thinwire_main(["bench", "cpu-floor", "--results",
                          str(_sweep(tmp_path, cpu=False))]) != 0
    assert "cpu_ms_per_iter" in capsys.readouterr().err


@pytest.mark.parametrize("env, world, expected", [
    ({"THINWIRE_CLUSTER_SHAPED": "1"}, 4, 2.0),              # the emulator: one host
    ({"THINWIRE_CLUSTER_SHAPED": "0", "THINWIRE_NODE_CPUS": "0.5", "THINWIRE_NODES": "2"},
     4, 1.0),                                                 # its nodes' quotas, 2 x 0.5
    ({"LOCAL_WORLD_SIZE": "4"}, 4, 2.0),                      # torchrun on one host
    ({"LOCAL_WORLD_SIZE": "2"}, 4, None),                     # ranks on two hosts: no pool
])
def test_the_cores_the_ranks_share(monkeypatch, env, world, expected):
    from thinwire.train.metrics import shared_cores

    for name in ("THINWIRE_CLUSTER_SHAPED", "THINWIRE_NODE_CPUS", "THINWIRE_NODES",
                 "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert shared_cores(world) == expected



def test_the_plan_names_the_floors_and_the_candidates_they_hold(tmp_path, capsys):
    """`thinwire plan` uses the floors: its JSON lists them, and a candidate whose step is its
    host work is marked (set_by=cpu in the table), so a user sees why it is no faster at a
    faster link."""
    from plan_helpers import _results

    from thinwire.cli import main as thinwire_main
    from thinwire.sim.plan import make_plan

    path = _results(tmp_path)
    data = json.loads(path.read_text())
    for run in data["runs"]:  # the all-reduce's host work: 1 s a step on 2 cores (its 50 Mbit/s
        cpu_s = CORES * 1.0 if run["algorithm"] == "allreduce" else 0.05
        run.update(cpu_ms_per_iter=1e3 * cpu_s, host_cores=CORES)  # step, 3.8 s, hides it)
    path.write_text(json.dumps(data))
    plan = make_plan([path], [path], None, None, None, ["1gbit"], calibrate_at="50mbit",
                     with_break_even=False)
    floors = {row["algorithm"]: row["floor_x_compute"] for row in plan["cpu_floor"]}
    assert floors["allreduce"] * plan["compute_s"] == pytest.approx(1.0, rel=0.02)
    held = {row["candidate"]: row for row in plan["plans"][0]["rows"]}
    assert held["allreduce"]["cpu_floor_s"] == pytest.approx(1.0, rel=0.02)
    assert held["allreduce"]["step_s"] == pytest.approx(1.0, rel=0.02)
    assert held["hitopk d=0.05 mstopk-carry values=fp16"]["cpu_floor_s"] is None  # binds nothing
    assert thinwire_main(["plan", "--calibrate", str(path), "--calibrate-at", "50mbit",
                          "--inter-node-bandwidth", "1gbit"]) == 0
    out = capsys.readouterr().out
    assert "CPU floor a step" in out
    table = [line.split() for line in out.splitlines() if line.strip()[:2].strip().isdigit()]
    marked = {row[1]: row[-1] == "cpu" for row in table}
    assert marked["allreduce"] and not marked["hitopk"]


def test_the_floors_line_tells_one_algorithms_settings_apart():
    from thinwire.sim.calibrate import floors_line

    row = {"algorithm": "hitopk", "density": 0.05, "wire": None, "sparse_wire": "fp16",
           "powersgd_rank": 4, "nodes": 2, "ranks_per_node": 2, "model": "widecnn"}
    line = floors_line({"cpu_floor": [dict(row, floor_x_compute=1.5),
                                      dict(row, density=0.01, floor_x_compute=1.25),
                                      dict(row, algorithm="ddp", floor_x_compute=2.0)]})
    assert "'hitopk density=0.05': 1.5" in line and "'hitopk density=0.01': 1.25" in line
    assert "'ddp': 2.0" in line
    assert floors_line({"cpu_floor": []}) is None
