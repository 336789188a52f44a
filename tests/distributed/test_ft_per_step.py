"""Fault-tolerant per-step training (thinwire.ft.per_step) through nodes lost and brought
back, each node its own process group, the nodes joined only by torchft's Lighthouse (here in
the test's process):

* 3 x 1, allreduce: two nodes vanish in the same step; node 0 goes on alone;
* 2 x 2, hitopk: node 1 vanishes in the inter-node phase of step 8 (every rank of it exits);
  node 0 goes on alone without a restart; node 1 starts again and vanishes while it heals (its
  donor is sending); it starts again, heals and both finish together.

topk_allgather runs the same protocol on the emulated cluster's launcher
(tests/cluster/test_ft_cluster.py).

The reference is the run itself: every committed step applies the same average on every rank
present, and a returning node takes a live peer's model, optimizer and SyncState, so at the end
every rank holds bit-identical weights and momentum (float64). No rank may hang: a deadline
ends the test with every log's tail.
"""

from __future__ import annotations


import pytest

pytest.importorskip("torchft")

import json  # noqa: E402

from thinwire.bench.ft_per_step import DIED, Job, identical  # noqa: E402

NODES, PER_NODE, STEPS, DIE_AT = 2, 2, 24, 8


def _job(tmp_path, algorithm, nodes=NODES, per_node=PER_NODE) -> Job:
    return Job(tmp_path, algorithm, nodes, per_node, STEPS)


def _all_identical(results: list[dict]) -> None:
    """Every rank at the same step with bit-identical weights, momentum and SyncState steps."""
    assert results[0]["step"] >= STEPS
    assert identical(results), [(r["node"], r["local_rank"], r["step"]) for r in results]


def test_two_nodes_lost_at_once_and_back(tmp_path):
    """3 nodes x 1 rank, the dense all-reduce (the world composed of the node's group and the
    cross-node one): nodes 1 and 2 vanish in the same step; node 0 goes on alone."""
    with _job(tmp_path, "allreduce", nodes=3, per_node=1) as job:
        survivor = job.start(0)
        dying = job.start(1, die_at=DIE_AT) + job.start(2, die_at=DIE_AT)
        job.wait(dying, DIED)
        returning = job.start(1) + job.start(2)
        job.wait(survivor + returning, 0)
        results = job.results()
    _all_identical(results)
    counts = [nodes for _, nodes in results[0]["quorums"]]
    assert counts[0] == 3 and counts[1] == 1 and counts[-1] == 3, results[0]["quorums"]
    assert results[0]["rolled_back"] >= 1


def test_nodes_that_start_from_different_weights_are_refused_at_the_first_step(tmp_path):
    """No init_sync: every node builds its start from the run's seed. A node whose model
    differs (another seed) ends every node at step 0 with the reason, none hangs."""
    with _job(tmp_path, "allreduce", nodes=2, per_node=1) as job:
        procs = job.start(0) + job.start(1, seed=1)
        job.wait(procs, 1)
        assert "ranks of the quorum start from different weights" in job.logs()


def test_a_node_lost_mid_step_then_while_it_heals_and_back_trains_on_to_identical_weights(
        tmp_path):
    """hitopk, 2 x 2: node 1 vanishes in the inter-node phase of step 8; node 0 rolls that step
    back and trains on alone; node 1 comes back and vanishes again while node 0 sends it the
    state; it comes back for good, heals and both finish together."""
    with _job(tmp_path, "hitopk") as job:
        survivors = job.start(0, count_departed_mass=True)
        dying = job.start(1, die_at=DIE_AT, count_departed_mass=True)
        job.wait(dying, DIED)
        job.wait(job.start(1, die_healing=True, count_departed_mass=True), DIED)
        returning = job.start(1, count_departed_mass=True)
        job.wait(survivors + returning, 0)
        results = job.results()
    _all_identical(results)
    # what node 1 held back when it vanished: its ranks' residual L1 after its last committed
    # step (each wrote it), counted by the survivors, once (it never committed while healing)
    last = [json.loads(next(tmp_path.glob(f"node1-rank{r}.json.mass.{p.pid}")).read_text())
            for r, p in enumerate(dying)]
    assert [m["step"] for m in last] == [DIE_AT] * PER_NODE
    for survivor in results[:PER_NODE]:
        assert survivor["departures"] == [{"step": DIE_AT, "node": 1, "residual_l1":
                                           pytest.approx(sum(m["l1"] for m in last),
                                                         rel=1e-12)}]
        assert survivor["departures"][0]["residual_l1"] > 0
    for survivor in results[:PER_NODE]:
        counts = [nodes for _, nodes in survivor["quorums"]]
        # lost mid-step, back, lost while healing (that step rolled back too), back for good
        assert counts[:5] == [2, 1, 2, 1, 2], survivor["quorums"]
        assert survivor["rolled_back"] >= 2
        assert survivor["quorums"][1][0] == DIE_AT  # the step node 1 died in was retried
    for returned in results[PER_NODE:]:
        # it joined at the survivors' step (healed), not at 0, and trained to the end with them
        assert returned["quorums"][0][0] > DIE_AT and returned["quorums"][0][1] == 2
        assert returned["committed"] < STEPS


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="needs a CUDA device: the GPU machine runs it (tests/gpu/on_device.sh)")
@pytest.mark.parametrize("algorithm", ["allreduce", "hitopk"])
def test_on_the_gpu_a_node_lost_and_back_heals_to_identical_weights(tmp_path, algorithm):
    """The model, its gradients, the optimizer and the residuals on the GPU (the groups stay
    gloo, the healing state is staged through host memory): 2 x 1, node 1 vanishes in step 8's
    cross-node phase and comes back; both end bit-identical."""
    with Job(tmp_path, algorithm, 2, 1, STEPS, device="cuda") as job:
        survivor = job.start(0)
        job.wait(job.start(1, die_at=DIE_AT), DIED)
        job.wait(survivor + job.start(1), 0)
        results = job.results()
    _all_identical(results)
    assert [nodes for _, nodes in results[0]["quorums"]][:2] == [2, 1], results[0]["quorums"]
