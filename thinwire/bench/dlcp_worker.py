"""One rank of `thinwire bench dlcp` (launched by the cluster launcher, torchrun environment).

``--steps`` timed synchronisations of one bucket per algorithm, the algorithms taking turns
step by step (a fresh gradient each step, the same on every algorithm), the step time being the
slowest rank's. With ``--bulk-port``, a TCP
bulk flow in the lowest priority class runs node 1 -> node 0 all the while (the probe of
`thinwire cluster check`), competing for the same links. Rank 0 writes the rows to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from thinwire.bench.report import (add_collective_timeout, end_worker, init_worker_group,
                                   write_json_atomic)
from thinwire.collectives import dlcp
from thinwire.state import SyncState
from thinwire.topology import Topology
from thinwire.transport.setup import local_address

BULK_START_S = 3.0  # the bulk flow's TCP has reached the link's rate by then


def _bulk_flow(rank: int, port: int, stop_file: str, classes: int):
    """Rank 0 serves, rank 1 sends (lowest class); other ranks take no part."""
    from thinwire.cluster.probes import PROBE_SCRIPT
    from thinwire.cluster.qos import tos_for_class

    host = [None]
    if rank == 0:
        host[0] = local_address()
    dist.broadcast_object_list(host, src=0)
    proc = None
    if rank == 0:
        proc = subprocess.Popen([sys.executable, PROBE_SCRIPT, "serve", "--host", host[0],
                                 "--port", str(port)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        if proc.stdout.readline().strip() != "READY":
            raise RuntimeError("bench dlcp: the bulk flow's server did not start")
    dist.barrier()
    if rank == 1:
        proc = subprocess.Popen([sys.executable, PROBE_SCRIPT, "bandwidth", "--host", host[0],
                                 "--port", str(port), "--seconds", "3600", "--tos",
                                 str(tos_for_class(classes - 1, classes)), "--stop-file",
                                 stop_file], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(BULK_START_S)
    return proc


def variant(text: str) -> tuple[str, dict]:
    """'dlcp:pacing=sleep,datagram_bytes=1472' -> ('dlcp', {'pacing': 'sleep', ...}), each
    value parsed and checked by dlcp's declaration of the option."""
    from thinwire.collectives.dlcp import ALGORITHM

    name, _, given = text.partition(":")
    options = {}
    for item in filter(None, given.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"variant {text!r}: options must be KEY=VALUE, got {item!r}")
        options[key.strip()] = ALGORITHM.option(key.strip()).parse(value, f"variant {text!r}")
    return name, options


def _timed_steps(state: SyncState, size: int, steps: int, rank: int,
                 first: int = 0, totals: dict | None = None) -> tuple[list, dict]:
    times, totals = [], ({} if totals is None else totals)
    for step in range(first, first + steps):
        grad = torch.randn(size, generator=torch.Generator().manual_seed(7919 * step + rank))
        dist.barrier(group=state.topology.world)
        start, cpu = time.perf_counter(), time.process_time()
        state.reduce(0, grad)
        state.end_step()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        # CPU seconds of this rank's process (all its threads) in the step: on a shared host
        # the step's wall time follows the CPU a rank needs, not only the wire
        totals["cpu_s"] = totals.get("cpu_s", 0.0) + time.process_time() - cpu
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=state.topology.world)
        times.append(float(elapsed))
        for key, value in state.last_step.items():
            totals[key] = totals.get(key, 0.0) + value
    return times, totals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--density", type=float, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--algorithms", nargs="+", required=True)
    parser.add_argument("--epsilon", type=float, required=True)
    parser.add_argument("--bulk-port", type=int, default=0)
    add_collective_timeout(parser)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    init_worker_group(args.collective_timeout)
    topology = Topology.build()
    rank = topology.rank
    classes = int(os.environ.get("THINWIRE_LINK_CLASSES", "0"))
    rate = float(os.environ.get("THINWIRE_INTER_NODE_BPS", "0")) or None
    rows = []
    with tempfile.TemporaryDirectory(prefix="thinwire-bench-dlcp-") as tmp:
        stop_file = os.path.join(tmp, "stop")
        bulk = None
        try:
            if args.bulk_port and topology.world_size >= 2 and classes >= 2:
                bulk = _bulk_flow(rank, args.bulk_port, stop_file, classes)
            states = {}
            for algorithm in args.algorithms:
                name, options = variant(algorithm)
                if name == "dlcp":
                    options = {"epsilon": args.epsilon, **options}
                states[algorithm] = SyncState(topology, name, args.density, "exact",
                                              algorithm_options=options or None)
                _timed_steps(states[algorithm], args.size, args.warmup, rank + 10_000)
            # interleaved, one step of each algorithm in turn: the host's load, which changes
            # over minutes here, then weighs on every algorithm alike
            times = {a: [] for a in states}
            totals = {a: {} for a in states}
            for step in range(args.steps):
                for algorithm, state in states.items():
                    times[algorithm] += _timed_steps(state, args.size, 1, rank, step,
                                                     totals[algorithm])[0]
            for algorithm in args.algorithms:
                name = variant(algorithm)[0]
                times_, totals_ = times[algorithm], totals[algorithm]
                n = args.steps
                row = {"algorithm": algorithm, "steps": n, "times_s": times_,
                       "mean_s": statistics.fmean(times_), "p50_s": statistics.median(times_),
                       "p99_s": statistics.quantiles(times_, n=100, method="inclusive")[98],
                       "bytes_inter_per_step": totals_["bytes_inter"] / n,
                       "select_s": totals_["select_s"] / n, "comm_s": totals_["comm_s"] / n,
                       "cpu_s": totals_["cpu_s"] / n}
                if rate:
                    row["wire_s"] = 8 * row["bytes_inter_per_step"] / rate
                    row["mean_vs_wire"] = row["mean_s"] / row["wire_s"]
                if name == "dlcp":
                    for key in dlcp.COUNTERS.values():
                        row[key] = totals_.get(key, 0.0)
                    row["missed_share"] = dlcp.missed_share(totals_)
                rows.append(row)
        finally:
            open(stop_file, "w").close()
            if bulk is not None:
                try:
                    bulk.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    bulk.kill()
                    bulk.wait()
            dist.barrier()
    if rank == 0:
        write_json_atomic(args.out, {"nodes": topology.nodes, "rate_bps": rate,
                                     "link_classes": classes, "rows": rows})
    dist.destroy_process_group()


if __name__ == "__main__":
    end_worker(main, "thinwire bench dlcp")
