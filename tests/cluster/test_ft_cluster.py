"""`thinwire cluster run --fault-tolerant` (issue 32, item 3): every node its own torchrun world,
joined by the coordinator the launcher runs beside them (torchft's Lighthouse and the job
store), running `python -m thinwire.train.ft_job` (loopback: no root). What a failure does to
such a job is tested in tests/distributed/test_ft_per_step.py and measured by
`thinwire bench ft-per-step`; here, the launcher's side of it."""

from __future__ import annotations

import io
import json

import pytest

from thinwire.cluster import ClusterSpec, run
from thinwire.cluster.launch import torchrun_argv

pytest.importorskip("torchft")


def test_a_fault_tolerant_node_is_a_world_of_its_own():
    argv = torchrun_argv(ClusterSpec(3, 2, shaping=False, fault_tolerant=True), 2, "10.0.0.1",
                         1234, "/tmp/x", ["-m", "m"])
    assert argv[argv.index("--nnodes") + 1] == "1" and argv[argv.index("--node-rank") + 1] == "0"
    plain = torchrun_argv(ClusterSpec(3, 2, shaping=False), 2, "10.0.0.1", 1234, "/tmp/x",
                          ["-m", "m"])
    assert plain[plain.index("--nnodes") + 1] == "3" and plain[plain.index("--node-rank") + 1] == "2"
    with pytest.raises(ValueError, match="fault_tolerant must be True or False, got 'yes'"):
        ClusterSpec(2, 1, fault_tolerant="yes")


def test_the_torchft_peer_job_trains_every_node_to_the_same_weights(tmp_path):
    """`python -m thinwire.train.ft_job --peer torchft-ddp-fp16` (torchft's fp16 DDP, each
    process its own replica group), 2 nodes x 1 rank: both nodes commit every step together
    and end with the same weights; the coordinator is gone with the job. thinwire's own
    fault-tolerant step runs the same loop below (`thinwire train --fault-tolerant`)."""
    how = ["--peer", "torchft-ddp-fp16"]
    out = io.StringIO()
    status = run(ClusterSpec(2, 1, shaping=False, fault_tolerant=True),
                 ["-m", "thinwire.train.ft_job", "--model", "mlp", *how, "--eval-every", "10",
                  "--target", "0.999", "--max-steps", "20", "--out", str(tmp_path)],
                 timeout_s=240, output=out)
    assert status == 0, out.getvalue()[-4000:]
    nodes = [json.loads((tmp_path / f"node{n}.json").read_text()) for n in range(2)]
    for node in nodes:
        assert node["step"] == node["committed"] == 20 and node["rolled_back"] == 0
        assert node["quorums"] == [[0, 2]] and len(node["curve"]) == 2
        assert node["algorithm"] == how[1]
    assert nodes[0]["weights_sha256"] == nodes[1]["weights_sha256"]
    values = [[(c["step"], c["nodes"], c["test_accuracy"]) for c in node["curve"]]
              for node in nodes]
    assert values[0] == values[1]


def test_thinwire_train_fault_tolerant_runs_its_config_on_the_quorum(tmp_path):
    """`thinwire train --fault-tolerant`: the run's own settings (model, algorithm and its
    density, steps, evaluation, target) on the fault-tolerant loop; node 0 writes the summary.
    topk_allgather: its all-gather crosses the world composed of the node's group and
    torchft's cross-node group."""
    out = io.StringIO()
    summary = tmp_path / "summary.json"
    status = run(ClusterSpec(2, 1, shaping=False, fault_tolerant=True),
                 ["-m", "thinwire.train", "--fault-tolerant", "--model", "mlp", "--algorithm",
                  "topk_allgather", "--density", "0.1", "--max-iters", "20", "--eval-every",
                  "10", "--target-accuracy", "0.999", "--summary", str(summary),
                  "--metrics", str(tmp_path / "metrics.jsonl")],
                 timeout_s=240, output=out)
    assert status == 0, out.getvalue()[-4000:]
    record = json.loads(summary.read_text())
    assert record["node"] == 0 and record["algorithm"] == "topk_allgather"
    assert record["model"] == "mlp" and record["weights_sha256"]
    assert record["step"] == record["committed"] == 20 and record["quorums"] == [[0, 2]]
    assert [point["step"] for point in record["curve"]] == [10, 20]
    assert record["metric"] == "test_accuracy" and record["reached"] is None
    # thinwire train's summary (what compare reads): a miss, the run's end, its pace
    assert record["time_to_target_s"] is None and record["stop_reason"] == "end"
    assert record["samples_per_s"] > 0 and record["test_accuracy"] == \
        record["curve"][-1]["test_accuracy"]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["event"] == "step"] == [10, 20]  # --log-every 10
    assert [r["step"] for r in lines if r["event"] == "eval"] == [10, 20]
    assert lines[-1]["event"] == "summary"


def test_compare_fault_tolerant_races_its_runs_on_the_quorum(tmp_path):
    """`thinwire compare --fault-tolerant`: each run is `thinwire train --fault-tolerant` on
    the fault-tolerant launcher; compare reads its summary as any run's (curve, stop reason,
    pace)."""
    from thinwire.train.compare import CompareSettings, compare

    settings = CompareSettings(algorithms=["hitopk"], nodes=2, ranks_per_node=1,
                               rates=["none"], shaping=False, target=0.999, eval_every=5,
                               timeout_s=240, resources={"fault_tolerant": True},
                               train={"model": "mlp", "epochs": 1, "max_iters": 10,
                                      "batch_size": 16})
    results = compare(settings, tmp_path, progress=False)
    (run,) = results["runs"]
    assert run["status"] == "ok", run
    assert run["quorums"] == [[0, 2]] and run["step"] == run["committed"] == 10
    assert [p["step"] for p in run["curve"]] == [5, 10] and run["stop_reason"] == "end"
    assert run["time_to_target_s"] is None and run["samples_per_s"] > 0
    assert results["setting"]["budget_s"] == 0.0
