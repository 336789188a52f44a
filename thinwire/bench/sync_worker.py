"""One rank of `thinwire bench sync` (launched by the cluster launcher, torchrun environment).

Times one synchronisation of a ResNet-50-sized gradient in DDP-sized buckets per algorithm; the
step time is the slowest rank's; bytes and the selection/communication split are rank means.
Rank 0 writes the rows as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

from thinwire.bench.report import (add_collective_timeout, end_worker, init_worker_group,
                                   write_json_atomic)
from thinwire.bench.sync_settings import for_algorithm
from thinwire.state import SyncState
from thinwire.topology import Topology


def _one_sync(state: SyncState, bucket_grads: list[torch.Tensor]) -> float:
    dist.barrier(group=state.topology.world)
    start = time.perf_counter()
    for index, grad in enumerate(bucket_grads):
        state.reduce(index, grad)
    state.end_step()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=state.topology.world)
    return float(elapsed)


def _rank_mean(value: float, topology: Topology) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, group=topology.world)
    return float(t) / topology.world_size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--bucket-mb", type=float, required=True)
    parser.add_argument("--sync", type=json.loads, required=True,
                        help="the sync settings, checked by `thinwire bench sync`")
    parser.add_argument("--algorithms", nargs="+", required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--nonfinite", nargs="+", default=["raise"])
    parser.add_argument("--algorithm-options", type=json.loads, default={},
                        help="JSON {algorithm: {name: value}} (checked by bench sync)")
    add_collective_timeout(parser)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)  # several ranks share this machine's cores
    init_worker_group(args.collective_timeout)
    topology = Topology.build()
    generator = torch.Generator().manual_seed(1234 + topology.rank)
    gradient = torch.randn(args.size, generator=generator)
    per_bucket = max(1, int(args.bucket_mb * 2**20) // gradient.element_size())
    buckets = list(gradient.split(per_bucket))
    rows = []
    for algorithm in args.algorithms:
        # one state per policy, timed in turns (a policy's repeats never all fall in a slow
        # stretch of the machine): the ratio between policies comes from one run
        settings = for_algorithm(algorithm, args.sync)
        states = {policy: SyncState(topology, algorithm, **settings,
                                    algorithm_options=args.algorithm_options.get(algorithm),
                                    nonfinite=policy) for policy in args.nonfinite}
        times: dict = {policy: [] for policy in states}
        totals = {policy: {"select_s": 0.0, "intra_s": 0.0, "inter_s": 0.0} for policy in states}
        for state in states.values():
            _one_sync(state, buckets)  # warm-up: residuals exist, allocations done
        for _ in range(args.repeats):
            for policy, state in states.items():
                times[policy].append(_one_sync(state, buckets))
                for key in totals[policy]:
                    totals[policy][key] += state.last_step[key]
        for policy, state in states.items():
            rows.append({
                "algorithm": algorithm, "nonfinite": policy,
                "median_s": statistics.median(times[policy]), "times_s": times[policy],
                "bytes_intra": _rank_mean(state.last_step["bytes_intra"], topology),
                "bytes_inter": _rank_mean(state.last_step["bytes_inter"], topology),
                **{key: _rank_mean(total / args.repeats, topology)
                   for key, total in totals[policy].items()},
                "buckets": len(buckets),
            })
    if topology.rank == 0:
        write_json_atomic(args.out, {"nodes": topology.nodes,
                                     "ranks_per_node": topology.ranks_per_node, "rows": rows})
    dist.destroy_process_group()


if __name__ == "__main__":
    end_worker(main, "thinwire bench sync")
