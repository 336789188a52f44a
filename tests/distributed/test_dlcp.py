"""dlcp on several gloo processes: lossless, it equals topk_allgather bit for bit."""

from __future__ import annotations

import torch

from harness import run_ranks
import dlcp_workers

LENGTHS = [5000, 1201]
STEPS = 3


def test_dlcp_without_loss_equals_topk_allgather_on_every_rank():
    runs = run_ranks(dlcp_workers.dlcp_and_topk_allgather, 3, LENGTHS, STEPS, 0.05,
                     {"high_share": 0.2})
    for by_algorithm in runs:
        reliable, dlcp = by_algorithm["topk_allgather"], by_algorithm["dlcp"]
        for step in range(STEPS):
            for got, want in zip(dlcp["results"][step], reliable["results"][step]):
                assert torch.equal(got, want)
            for bucket, residual in reliable["residuals"][step].items():
                assert torch.equal(dlcp["residuals"][step][bucket], residual)
            counters = dlcp["counters"][step]
            assert counters["dlcp_lost"] == 0 and counters["dlcp_missed_entries"] == 0
            # 2 peers x the datagrams of 2 buckets (250 + 61 entries, 12-byte entries)
            assert counters["dlcp_sent"] == 2 * (3 + 1)
            assert counters["dlcp_entries"] == 250 + 61
    assert all(torch.equal(a, b) for a, b in zip(runs[0]["dlcp"]["results"][-1],
                                                  runs[1]["dlcp"]["results"][-1]))


def test_with_loss_every_rank_applies_the_same_and_nothing_is_lost_over_time():
    """Sum over ranks of (gradient + residual before) == W * result + sum of residuals after:
    what missed a step is in the residuals, on every step; every rank holds the same result."""
    world, length, steps = 3, 8000, 3
    runs = run_ranks(dlcp_workers.dlcp_with_loss, world, length, steps, 0.2)
    previous = [torch.zeros(length, dtype=torch.float64) for _ in range(world)]
    for step in range(steps):
        sent = sum(runs[r][step]["grad"] + previous[r] for r in range(world))
        kept = sum(runs[r][step]["residual"] for r in range(world))
        result = runs[0][step]["result"]
        torch.testing.assert_close(world * result + kept, sent, rtol=0, atol=1e-12)
        assert all(torch.equal(runs[r][step]["result"], result) for r in range(world))
        previous = [runs[r][step]["residual"] for r in range(world)]
    assert sum(run[s]["missed"] for run in runs for s in range(steps)) > 0
