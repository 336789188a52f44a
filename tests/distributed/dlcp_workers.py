"""Rank functions of the dlcp tests (spawned by harness.run_ranks)."""

from __future__ import annotations

import torch

from reference import gradient
from thinwire.state import SyncState
from thinwire.topology import Topology


def dlcp_and_topk_allgather(rank, world, lengths, steps, density, dlcp_options):
    """The same gradients through dlcp and topk_allgather; per algorithm, per step, the
    results, this rank's residuals after the step, and dlcp's counters."""
    topology = Topology.build(ranks_per_node=1)
    out = {}
    for algorithm, options in (("topk_allgather", None), ("dlcp", dlcp_options)):
        state = SyncState(topology, algorithm, density, "exact", algorithm_options=options)
        results, residuals, counters = [], [], []
        for step in range(steps):
            grads = gradient(rank, step, sum(lengths)).split(lengths)
            results.append([state.reduce(i, g.clone()) for i, g in enumerate(grads)])
            residuals.append({i: r.clone() for i, r in state.feedback.residuals.items()})
            state.end_step()
            counters.append({k: v for k, v in state.last_step.items() if k.startswith("dlcp")})
        out[algorithm] = {"results": results, "residuals": residuals, "counters": counters}
    return out
