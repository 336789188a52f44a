"""Flushing the error-feedback residuals (the switch of --algorithm auto's re-planning):
what the sparse steps applied plus the flush equals the dense average of every rank's
gradients over those steps, for each residual space (a whole bucket; hitopk's node shard)."""

import pytest
from harness import run_ranks

import flush_workers


@pytest.mark.parametrize("algorithm, world, ranks_per_node", [
    ("topk_allgather", 2, 1), ("oktopk", 2, 1), ("hitopk", 4, 2), ("topk_a2a", 4, 2)])
def test_applied_plus_flushed_is_the_dense_average(algorithm, world, ranks_per_node):
    results = run_ranks(flush_workers.synchronize_then_flush, world, algorithm, ranks_per_node)
    for r in results:
        assert r["held_l1"] > 0 and r["flushed_l1"] == r["held_l1"]  # there was mass to flush
        assert r["error"] < 1e-5, r
        assert r["after"] == 0 and r["buckets"] >= 1


def test_the_ddp_hooks_residuals_flush_by_model_index():
    results = run_ranks(flush_workers.ddp_then_flush, 4, "hitopk", 2)
    assert all(r["relative_error"] < 1e-5 for r in results), results
