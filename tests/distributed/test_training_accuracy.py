"""A small model on real data (scikit-learn digits), 2 nodes x 2 ranks on loopback: hitopk at
density 0.01 ends within 1 point of allreduce's test accuracy after the same epochs."""

import json

from thinwire.cluster import ClusterSpec, run

EPOCHS = "12"


def _accuracy(tmp_path, algorithm: str) -> float:
    summary = tmp_path / f"{algorithm}.json"
    log = tmp_path / f"{algorithm}.log"
    spec = ClusterSpec(nodes=2, ranks_per_node=2, shaping=False)
    with open(log, "w") as output:
        status = run(spec, ["-m", "thinwire.train", "--model", "mlp", "--algorithm", algorithm,
                            "--density", "0.01", "--epochs", EPOCHS, "--batch-size", "16",
                            "--seed", "0", "--no-progress", "--compute-probe-iters", "0",
                            "--summary", str(summary)], timeout_s=120, output=output)
    assert status == 0, log.read_text()[-3000:]
    return json.loads(summary.read_text())["test_accuracy"]


def test_hitopk_matches_allreduce_accuracy(tmp_path):
    dense = _accuracy(tmp_path, "allreduce")
    sparse = _accuracy(tmp_path, "hitopk")
    assert dense > 0.9, dense  # the reference itself learnt the task
    print(f"test accuracy: allreduce {dense:.4f}, hitopk {sparse:.4f}")
    assert abs(sparse - dense) <= 0.01, (sparse, dense)
