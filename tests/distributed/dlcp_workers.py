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
        state = SyncState(topology, algorithm, density, "exact", algorithm_options=options,
                          dense_below_bytes=0)  # small buckets through the protocol too
        results, residuals, counters = [], [], []
        for step in range(steps):
            grads = gradient(rank, step, sum(lengths)).split(lengths)
            results.append([state.reduce(i, g.clone()) for i, g in enumerate(grads)])
            residuals.append({i: r.clone() for i, r in state.feedback.residuals.items()})
            state.end_step()
            counters.append({k: v for k, v in state.last_step.items() if k.startswith("dlcp")})
        out[algorithm] = {"results": results, "residuals": residuals, "counters": counters}
    return out


class _Loss:
    """Loses 10% of data and control datagrams, the same pattern on every run."""

    def __init__(self, rank: int):
        import random
        import threading
        self.random, self.lock = random.Random(7_000 + rank), threading.Lock()

    def __call__(self, kind, dst, round_, seq, attempt) -> bool:
        with self.lock:
            return self.random.random() < 0.1


def dlcp_with_loss(rank, world, length, steps, density):
    """dlcp through a transport that loses datagrams; per step the input gradient, the result
    and this rank's residual after the step (float64)."""
    from thinwire.collectives import dlcp
    from thinwire.transport import open_transport

    topology = Topology.build(ranks_per_node=1)
    options = {"deadline_s": 0.05}
    state = SyncState(topology, "dlcp", density, "exact", algorithm_options=options,
                      dense_below_bytes=0)  # small buckets through the protocol too
    key = (id(topology.world), tuple(sorted(state.algorithm_options.items())))
    dlcp._TRANSPORTS[key] = (topology.world, open_transport(
        topology.world, timeout_s=60, drop=_Loss(rank), **state.algorithm_options))
    out = []
    for step in range(steps):
        grad = gradient(rank, step, length)
        result = state.reduce(0, grad.clone())
        state.end_step()
        out.append({"grad": grad, "result": result,
                    "residual": state.feedback.residuals[0].clone(),
                    "lost": state.last_step["dlcp_lost"],
                    "missed": state.last_step["dlcp_missed_entries"]})
    return out
