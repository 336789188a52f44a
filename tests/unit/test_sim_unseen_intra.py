"""The node-local link where no calibration run uses it: on 4 nodes x 1 rank at shaped rates
nothing depends on its latency and rate, so the fit sets them to ``UNSEEN_INTRA`` instead of
leaving them wherever the optimiser stopped (the MNIST 4 x 1 sweeps fitted 4 MB/s from one rate
and 1e12 B/s, the bound, from the others, and an unshaped plan, whose nodes the model joins
with that link, came out 37x too long from the first)."""

import json

import pytest

from thinwire.sim import calibrate
from thinwire.sim.calibrate import UNSEEN_INTRA, Run, fit, predict, read_runs
from thinwire.sim.compute import uniform

TRUE = {"inter_alpha_s": 3e-4, "inter_efficiency": 0.9, "intra_alpha_s": 1e-4,
        "intra_bandwidth_Bps": 2e9, "sparse_rate": 5e7, "sparse_alpha_s": 2e-3,
        "pass_rate": 1e9, "compute_s": [0.3], "phase_form": "max", "bytes_scale": {},
        "step_extra_s": {}}
ALGORITHMS = ("allreduce", "hier_allreduce", "topk_allgather", "hitopk")


def _run(nodes, ranks_per_node, bps, algorithm="allreduce"):
    return Run("synthetic", algorithm, algorithm, nodes, ranks_per_node, bps, "u",
               uniform(2_000_000), 0.01, None, 1.0)


def _sweep(tmp_path, nodes, ranks_per_node, rates):
    runs = []
    for bps in rates:
        for algorithm in ALGORITHMS:
            row = predict(_run(nodes, ranks_per_node, bps, algorithm), TRUE, overlap="hooks")
            runs.append({"algorithm": algorithm, "inter_node_bandwidth": bps, "status": "ok",
                         "iteration_s": row["iteration_s"],
                         "compute_ms_per_iter": 1e3 * row["compute_s"]})
    path = tmp_path / f"{nodes}x{ranks_per_node}.json"
    path.write_text(json.dumps({"setting": {"nodes": nodes, "ranks_per_node": ranks_per_node,
                                            "parameters": 2_000_000}, "runs": runs}))
    return path


@pytest.mark.parametrize("nodes, ranks_per_node, rates, seen", [
    (4, 1, [5e7, 1e9], False),   # every run shaped, one rank a node: the link is not seen
    (2, 2, [5e7], True),         # two ranks share a node
    (4, 1, [5e7, None], True),   # an unshaped run crosses nodes over it
])
def test_the_node_local_link_is_seen_by_a_second_rank_or_an_unshaped_run(
        tmp_path, nodes, ranks_per_node, rates, seen):
    runs, _ = read_runs([_sweep(tmp_path, nodes, ranks_per_node, rates)])
    assert calibrate.intra_node_seen(runs) is seen


def test_unseen_it_is_held_and_the_shaped_fit_is_unchanged(tmp_path):
    runs, _ = read_runs([_sweep(tmp_path, 4, 1, [5e7, 2e8, 1e9])])
    params, _ = fit(runs, overlap="hooks", form="max")
    for name, value in UNSEEN_INTRA.items():
        assert params[name] == pytest.approx(value, rel=1e-4)
    for run in runs:  # the held link moves none of the shaped steps the fit explains
        assert predict(run, params, "hooks")["iteration_s"] == pytest.approx(run.iteration_s,
                                                                             rel=0.02)


def test_seen_it_is_fitted(tmp_path):
    """A 2 x 2 sweep's hierarchical phases show the link: its rate comes out of the runs, away
    from the held value (2e9 B/s generated, 2e8 held)."""
    runs, _ = read_runs([_sweep(tmp_path, 2, 2, [5e7, 2e8, 1e9])])
    params, _ = fit(runs, overlap="hooks", form="max")
    assert params["intra_bandwidth_Bps"] > 5 * UNSEEN_INTRA["intra_bandwidth_Bps"]
