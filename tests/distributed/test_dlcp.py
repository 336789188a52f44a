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
