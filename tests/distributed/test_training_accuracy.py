"""A small model on real data (scikit-learn digits), 2 nodes x 2 ranks on loopback: hitopk at
density 0.01 ends within 1 point of allreduce's test accuracy after the same epochs; each run
reports the CPU its ranks spent a step, within what the host's cores could give them."""

import json

from thinwire.cluster import ClusterSpec, run

EPOCHS = "12"


def _summary(tmp_path, algorithm: str) -> dict:
    summary = tmp_path / f"{algorithm}.json"
    log = tmp_path / f"{algorithm}.log"
    spec = ClusterSpec(nodes=2, ranks_per_node=2, shaping=False)
    with open(log, "w") as output:
        status = run(spec, ["-m", "thinwire.train", "--model", "mlp", "--algorithm", algorithm,
                            "--density", "0.01", "--epochs", EPOCHS, "--batch-size", "16",
                            "--seed", "0", "--no-progress", "--compute-probe-iters", "0",
                            "--summary", str(summary)], timeout_s=120, output=output)
    assert status == 0, log.read_text()[-3000:]
    return json.loads(summary.read_text())


def _cpu_is_plausible(summary: dict) -> None:
    """The ranks' CPU a step, summed, is positive and at most what the cores give in a step
    (a little over for the clocks' granularity)."""
    cpu_ms, cores = summary["cpu_ms_per_iter"], summary["host_cores"]
    assert cores >= 1, summary
    assert 0 < cpu_ms <= 1.1 * cores * summary["iter_ms"] + 5, (cpu_ms, cores, summary["iter_ms"])


def test_hitopk_matches_allreduce_accuracy(tmp_path):
    runs = {name: _summary(tmp_path, name) for name in ("allreduce", "hitopk")}
    for summary in runs.values():
        _cpu_is_plausible(summary)
    dense, sparse = runs["allreduce"]["test_accuracy"], runs["hitopk"]["test_accuracy"]
    assert dense > 0.9, dense  # the reference itself learnt the task
    print(f"test accuracy: allreduce {dense:.4f}, hitopk {sparse:.4f}")
    assert abs(sparse - dense) <= 0.01, (sparse, dense)
